"""The `ray` executor: each run a Ray task with its resource request, on a local Ray runtime
or an existing cluster, keeping the promises of the other executors: progress that never
blocks a run, Ctrl-C and SIGTERM that stop the sweep with its resume line, one sentence for a
request no node can meet, and no Ray process left behind by a driver killed outright."""

from __future__ import annotations

import math
import os
import signal
import threading
from typing import Any, Iterator

from posbench.errors import ConfigError
from posbench.experiment.compute import (
    POLL_SECONDS,
    ProgressSink,
    Reporter,
    RunJob,
    RunOutput,
    compute_run,
    failed_output,
    posting_sink,
    relay,
)
from posbench.reaper import start_reaper
from posbench.kernels import native
from posbench.kernels.cpu import keep_freed_memory


class ProgressMailbox:
    """Progress events from Ray workers to the driver. Workers post without waiting for an
    answer, and the driver collects without blocking, so a slow or lost mailbox (a starved
    machine, a dead actor) costs progress lines, never a run."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    def post(self, event: tuple[str, str, Any]) -> None:
        self.events.append(event)

    def collect(self) -> list[tuple[str, str, Any]]:
        events, self.events = self.events, []
        return events


class MailboxReader:
    """The driver's side of the mailbox: each call hands the events posted since the last one
    to `sink`, with at most one collect() in flight and never waiting longer than asked."""

    def __init__(self, mailbox: Any, sink: ProgressSink) -> None:
        self.mailbox, self.sink = mailbox, sink
        self.collecting: list[Any] = []

    def __call__(self, wait: float = 0.0) -> int:
        """Hands over what one collect() brought, if it came within `wait` seconds; returns
        how many events that was."""
        import ray
        from ray.exceptions import RayError

        try:
            if not self.collecting:
                self.collecting.append(self.mailbox.collect.remote())
            ready, _ = ray.wait(self.collecting, timeout=wait)
            if not ready:
                return 0
            self.collecting.clear()
            events = ray.get(ready[0])
        except RayError:  # the mailbox is gone: progress only
            return 0
        for event in events:
            self.sink(*event)
        return len(events)

    def drain(self, wait: float) -> None:
        """Hands over everything the finished runs posted: a collect() already in flight may
        have left before their last events arrived, so collect until one comes back empty
        (or does not come within `wait`)."""
        received = self(wait)
        while received:
            received = self(wait)


def _compute_on_ray(
    job: RunJob, threads: int, plugin_dirs: tuple[str, ...], mailbox: Any
) -> RunOutput:
    keep_freed_memory()  # once per worker process, as posbench's own workers do
    native.quiet_workers()
    return compute_run(job, threads, posting_sink(mailbox.post.remote), plugin_dirs)


class RayExecutor:
    """Each run a Ray task with its resource request, retried when its worker dies."""

    def __init__(
        self,
        address: str | None = None,
        cpus_per_run: float = 1,
        gpus_per_run: float = 0,
        max_retries: int = 2,
        num_cpus: int | None = None,
    ) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--executor ray needs Ray, which is not installed; run `pip install "
                "'posbench[ray]'`."
            ) from None
        if not (math.isfinite(cpus_per_run) and cpus_per_run > 0):
            raise ConfigError(
                f"--cpus-per-run must be a number above 0 (fractions allowed), got {cpus_per_run}."
            )
        if not (math.isfinite(gpus_per_run) and gpus_per_run >= 0):
            raise ConfigError(
                f"--gpus-per-run must be a number of at least 0 (fractions allowed), got "
                f"{gpus_per_run}."
            )
        self.address, self.cpus_per_run, self.gpus_per_run = address, cpus_per_run, gpus_per_run
        self.max_retries, self.num_cpus = max_retries, num_cpus

    def _start(self) -> None:
        """Join the cluster, or start a local runtime watched by a reaper. ray.init installs
        signal handlers of its own (SIGTERM then aborts with a core dump); the caller's are
        put back, so SIGTERM stops the sweep as Ctrl-C does."""
        import ray

        if ray.is_initialized():
            return
        main = threading.current_thread() is threading.main_thread()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        if self.address:
            ray.init(address=self.address, log_to_driver=False)
        else:
            ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False)
            start_reaper(os.getpid())
        for signum, handler in handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def _check_feasible(self, reporter: Reporter) -> None:
        """One sentence when no node of the runtime can ever hold one run's request, instead of
        tasks that wait forever; on a cluster (an autoscaler may add nodes) a warning."""
        import ray

        nodes = [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]
        largest = {
            "CPU": max((n.get("CPU", 0.0) for n in nodes), default=0.0),
            "GPU": max((n.get("GPU", 0.0) for n in nodes), default=0.0),
        }
        for kind, asked, flag in (
            ("CPU", self.cpus_per_run, "--cpus-per-run"),
            ("GPU", self.gpus_per_run, "--gpus-per-run"),
        ):
            if asked <= largest[kind]:
                continue
            where = (
                f"the cluster at {self.address}" if self.address else "this machine's Ray runtime"
            )
            problem = (
                f"{flag} {asked:g} asks for more {kind}s than any node of {where} has "
                f"({largest[kind]:g})"
            )
            if not self.address:
                raise ConfigError(f"{problem}; lower {flag}.")
            reporter.note(f"warning: {problem}; the runs wait until such a node joins.")

    def _describe_failure(self, err: Exception) -> str:
        """What a run's Ray task failed with, in one line: the exception it raised (as a
        RayTaskError's cause), or the worker's death after its retries."""
        from ray.exceptions import RayTaskError

        if isinstance(err, RayTaskError) and err.cause is not None:
            cause = err.cause
            return f"{type(cause).__name__} in its Ray task: {cause}".splitlines()[0]
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        detail = lines[0] if lines else ""
        return f"{type(err).__name__} after {self.max_retries} retries: {detail}".rstrip(": ")

    def map(
        self,
        jobs: list[RunJob],
        threads: int | None,
        reporter: Reporter,
        plugin_dirs: tuple[str, ...],
    ) -> Iterator[RunOutput]:
        import ray
        from ray.exceptions import RayError

        self._start()
        self._check_feasible(reporter)
        mailbox = ray.remote(num_cpus=0)(ProgressMailbox).remote()
        known = {job.run.run_id: job.run for job in jobs}
        sink = relay(reporter, known)
        remote = ray.remote(
            num_cpus=self.cpus_per_run,
            num_gpus=self.gpus_per_run,
            max_retries=self.max_retries,
            retry_exceptions=False,
        )(_compute_on_ray)
        per_run = threads or max(1, int(self.cpus_per_run))
        refs = {remote.remote(job, per_run, plugin_dirs, mailbox): job for job in jobs}
        reporter.note(
            f"{len(jobs)} run(s) submitted to Ray ({self.cpus_per_run} CPU, {self.gpus_per_run} "
            "GPU each)"
        )
        forward = MailboxReader(mailbox, sink)
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
                forward()
                for ref in done:
                    try:
                        output = ray.get(ref)
                    except RayError as err:
                        output = failed_output(refs[ref], self._describe_failure(err))
                    added = yield output
                    for job in added or ():  # jobs that waited for this output
                        known[job.run.run_id] = job.run
                        more = remote.remote(job, per_run, plugin_dirs, mailbox)
                        refs[more] = job
                        pending.append(more)
            forward.drain(POLL_SECONDS)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            ray.kill(mailbox)
