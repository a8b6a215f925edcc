"""Executors run a sweep's pending runs and hand back each RunOutput as it finishes; the
driver (runner.run_sweep) alone writes results. `local` runs in this process, `processes`
in a pool on this machine, `ray` as Ray tasks on a local runtime or an existing cluster."""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Iterator, Protocol

from posbench.config import RunConfig
from posbench.errors import ConfigError
from posbench.runner import Reporter, RunOutput, compute_run, failed_output

EXECUTORS = ("local", "processes", "ray")


class Executor(Protocol):
    """Runs RunConfigs and yields their outputs in completion order."""

    def map(self, runs: list[RunConfig], threads: int | None, reporter: Reporter,
            plugin_dirs: tuple[str, ...]) -> Iterator[RunOutput]: ...


class LocalExecutor:
    """One run after another in this process, with per-step progress."""

    def map(self, runs: list[RunConfig], threads: int | None, reporter: Reporter,
            plugin_dirs: tuple[str, ...]) -> Iterator[RunOutput]:
        for run in runs:
            reporter.run_started(run, run.train.steps)
            yield compute_run(run, threads, reporter.step)


class ProcessExecutor:
    """`jobs` runs at a time in worker processes; torch threads divided between them. A
    worker that dies breaks the whole pool, so the runs it left unfinished are then retried
    one at a time, each in a fresh process, and a run whose process dies on every one of
    1 + `max_retries` tries is recorded as failed."""

    def __init__(self, jobs: int, max_retries: int = 2) -> None:
        if jobs < 1:
            raise ConfigError(f"--jobs must be at least 1, got {jobs}.")
        self.jobs = jobs
        self.max_retries = max_retries

    def map(self, runs: list[RunConfig], threads: int | None, reporter: Reporter,
            plugin_dirs: tuple[str, ...]) -> Iterator[RunOutput]:
        per_job = threads or max(1, (os.cpu_count() or 1) // self.jobs)
        context = multiprocessing.get_context("spawn")
        reporter.note(f"{len(runs)} run(s) on {self.jobs} worker processes, {per_job} thread(s) each")
        unfinished: list[RunConfig] = []
        with ProcessPoolExecutor(max_workers=self.jobs, mp_context=context) as pool:
            futures = {pool.submit(compute_run, run, per_job, None, plugin_dirs): run for run in runs}
            try:
                for future in as_completed(futures):
                    try:
                        yield future.result()
                    except BrokenProcessPool:
                        unfinished.append(futures[future])
            except KeyboardInterrupt:
                for future in futures:
                    future.cancel()
                raise
        for run in sorted(unfinished, key=runs.index):
            yield self._isolated(run, per_job, plugin_dirs, context)

    def _isolated(self, run: RunConfig, threads: int, plugin_dirs: tuple[str, ...], context) -> RunOutput:
        for _ in range(1 + self.max_retries):
            with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                try:
                    return pool.submit(compute_run, run, threads, None, plugin_dirs).result()
                except BrokenProcessPool:
                    continue
        return failed_output(run, f"worker process died on each of {1 + self.max_retries} tries")


class RayExecutor:
    """Each run a Ray task with its resource request, retried when its worker dies."""

    def __init__(self, address: str | None = None, cpus_per_run: float = 1, gpus_per_run: float = 0,
                 max_retries: int = 2, num_cpus: int | None = None) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError(
                "--executor ray needs Ray, which is not installed; run `pip install 'posbench[ray]'`."
            ) from None
        self.address, self.cpus_per_run, self.gpus_per_run = address, cpus_per_run, gpus_per_run
        self.max_retries, self.num_cpus = max_retries, num_cpus

    def _start(self) -> None:
        import ray

        if ray.is_initialized():
            return
        if self.address:
            ray.init(address=self.address, log_to_driver=False)
        else:
            ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False)

    def map(self, runs: list[RunConfig], threads: int | None, reporter: Reporter,
            plugin_dirs: tuple[str, ...]) -> Iterator[RunOutput]:
        import ray
        from ray.exceptions import RayError

        self._start()
        remote = ray.remote(num_cpus=self.cpus_per_run, num_gpus=self.gpus_per_run,
                            max_retries=self.max_retries, retry_exceptions=False)(compute_run)
        per_run = threads or max(1, int(self.cpus_per_run))
        refs = {remote.remote(run, per_run, None, plugin_dirs): run for run in runs}
        reporter.note(f"{len(runs)} run(s) submitted to Ray ({self.cpus_per_run} CPU, {self.gpus_per_run} GPU each)")
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        yield ray.get(ref)
                    except RayError as err:  # the worker died on every try
                        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                        yield failed_output(refs[ref], f"{type(err).__name__} after {self.max_retries} retries: {first_line}")
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise


def make_executor(name: str, jobs: int = 2, ray_address: str | None = None,
                  cpus_per_run: float = 1, gpus_per_run: float = 0) -> Executor:
    """The executor a command line asks for."""
    if name == "local":
        return LocalExecutor()
    if name == "processes":
        return ProcessExecutor(jobs)
    if name == "ray":
        return RayExecutor(ray_address, cpus_per_run, gpus_per_run)
    raise ConfigError(f"Unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}.")
