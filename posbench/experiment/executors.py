"""Executors compute a sweep's pending runs and hand back each RunOutput as it finishes; the
driver (runner.run_sweep) alone writes results. `local` runs in this process, `processes`
in a pool on this machine, `ray` (ray_executor.py) as Ray tasks on a local runtime or an
existing cluster.
Workers forward their progress events to the driver, and die with it."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Iterator, Protocol

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
from posbench.errors import ConfigError
from posbench.kernels import native
from posbench.kernels.cpu import keep_freed_memory
from posbench.warning_lines import show_warnings_as_lines

EXECUTORS = ("local", "processes", "ray")
_PR_SET_PDEATHSIG = 1


class Executor(Protocol):
    """Computes RunJobs and yields their outputs in completion order. The driver may send a
    list of further jobs into the generator for each output it receives (jobs that waited for
    that output); they join the same run."""

    def map(
        self,
        jobs: list[RunJob],
        threads: int | None,
        reporter: Reporter,
        plugin_dirs: tuple[str, ...],
    ) -> Iterator[RunOutput]: ...


class LocalExecutor:
    """One run after another in this process, with per-step progress."""

    def map(
        self,
        jobs: list[RunJob],
        threads: int | None,
        reporter: Reporter,
        plugin_dirs: tuple[str, ...],
    ) -> Iterator[RunOutput]:
        known = {job.run.run_id: job.run for job in jobs}
        sink = relay(reporter, known)
        queue = deque(jobs)
        while queue:
            job = queue.popleft()
            added = yield compute_run(job, threads, sink)
            known |= {more.run.run_id: more.run for more in added or ()}
            queue.extendleft(reversed(added or ()))  # what waited for this output runs next


# ---- worker processes -----------------------------------------------------------------------
_events: Any = None  # the worker's queue to the driver


def die_with_parent(parent_pid: int) -> None:
    """Make this process exit when `parent_pid` does: the kernel's parent-death signal where
    Linux offers it, and a watchdog thread that notices being orphaned everywhere."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl here: the watchdog below still applies
            pass

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(POLL_SECONDS)

    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    threading.Thread(target=watch, name="posbench-orphan-watch", daemon=True).start()


def _worker_init(parent_pid: int, events: Any) -> None:
    global _events
    die_with_parent(parent_pid)
    show_warnings_as_lines()
    native.quiet_workers()
    keep_freed_memory()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    _events = events


def _compute_in_worker(job: RunJob, threads: int, plugin_dirs: tuple[str, ...]) -> RunOutput:
    return compute_run(job, threads, posting_sink(_events.put_nowait), plugin_dirs)


def _drain(events: Any, sink: ProgressSink) -> None:
    while True:
        try:
            sink(*events.get_nowait())
        except queue.Empty:
            return
        except (OSError, EOFError, ValueError):  # the queue went away with the pool
            return


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop a pool now: cancel what has not started and kill the workers."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=5)


class ProcessExecutor:
    """`jobs` runs at a time in worker processes; torch threads divided between them. A
    worker that dies breaks the whole pool, so the runs it left unfinished are then retried
    one at a time, each in a fresh process, and a run whose process dies on every one of
    1 + `max_retries` tries is recorded as failed. Workers exit when the driver dies, and an
    interrupted driver kills them before it returns."""

    def __init__(self, jobs: int, max_retries: int = 2) -> None:
        if jobs < 1:
            raise ConfigError(f"--jobs must be at least 1, got {jobs}.")
        self.jobs = jobs
        self.max_retries = max_retries

    def map(
        self,
        jobs: list[RunJob],
        threads: int | None,
        reporter: Reporter,
        plugin_dirs: tuple[str, ...],
    ) -> Iterator[RunOutput]:
        per_job = threads or max(1, (os.cpu_count() or 1) // self.jobs)
        context = multiprocessing.get_context("spawn")
        events = context.Queue()
        known = {job.run.run_id: job.run for job in jobs}
        sink = relay(reporter, known)
        reporter.note(
            f"{len(jobs)} run(s) on {self.jobs} worker processes, {per_job} thread(s) each"
        )
        unfinished: list[RunJob] = []
        order = list(jobs)
        try:
            pool = self._pool(self.jobs, context, events)
            try:
                futures: dict[Future, RunJob] = {}

                def submit(batch: list[RunJob]) -> None:
                    for job in batch:
                        known[job.run.run_id] = job.run
                        try:
                            futures[pool.submit(_compute_in_worker, job, per_job, plugin_dirs)] = (
                                job
                            )
                        except BrokenProcessPool:  # retried alone below, like the pool's own
                            unfinished.append(job)

                submit(jobs)
                for future in self._completed(futures, events, sink):
                    try:
                        output = future.result()
                    except BrokenProcessPool:
                        unfinished.append(futures[future])
                        continue
                    added = yield output
                    order += added or []
                    submit(added or [])
            except BaseException:
                _stop(pool)
                raise
            pool.shutdown(wait=True)
            while unfinished:
                job = min(unfinished, key=order.index)
                unfinished.remove(job)
                added = yield self._isolated(job, per_job, plugin_dirs, context, events, sink)
                order += added or []
                unfinished += added or []
        finally:
            _drain(events, sink)
            events.close()

    @staticmethod
    def _pool(workers: int, context: Any, events: Any) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=workers,
            mp_context=context,
            initializer=_worker_init,
            initargs=(os.getpid(), events),
        )

    @staticmethod
    def _completed(
        futures: dict[Future, RunJob], events: Any, sink: ProgressSink
    ) -> Iterator[Future]:
        """Futures as they complete, forwarding progress events while waiting; futures added to
        `futures` meanwhile are waited for too."""
        finished: set[Future] = set()
        while len(finished) < len(futures):
            pending = set(futures) - finished
            done, _ = wait(pending, timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
            _drain(events, sink)
            for future in sorted(done, key=list(futures).index):
                finished.add(future)
                yield future

    def _isolated(
        self,
        job: RunJob,
        threads: int,
        plugin_dirs: tuple[str, ...],
        context: Any,
        events: Any,
        sink: ProgressSink,
    ) -> RunOutput:
        for _ in range(1 + self.max_retries):
            pool = self._pool(1, context, events)
            try:
                future = pool.submit(_compute_in_worker, job, threads, plugin_dirs)
                for done in self._completed({future: job}, events, sink):
                    return done.result()
            except BrokenProcessPool:
                continue
            except BaseException:
                _stop(pool)
                raise
            finally:
                pool.shutdown(wait=True)
        return failed_output(job, f"worker process died on each of {1 + self.max_retries} tries")


def make_executor(
    name: str,
    jobs: int = 2,
    ray_address: str | None = None,
    cpus_per_run: float = 1,
    gpus_per_run: float = 0,
) -> Executor:
    """The executor a command line asks for."""
    if name == "local":
        return LocalExecutor()
    if name == "processes":
        return ProcessExecutor(jobs)
    if name == "ray":
        from posbench.experiment.ray_executor import RayExecutor

        return RayExecutor(ray_address, cpus_per_run, gpus_per_run)
    raise ConfigError(f"Unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}.")
