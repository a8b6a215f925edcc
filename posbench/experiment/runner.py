"""Executes a sweep's plan (planner.py): holds the sweep folder's lock, sets damaged runs
aside, computes the planned jobs through an executor, stores every output (the one writer of a
sweep's runs), records failures and carries on, and rebuilds results.csv from the sweep's own
runs after each run."""

from __future__ import annotations

import dataclasses
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from posbench.experiment.compute import (
    Reporter,
    RunOutput,
    SilentReporter,
    decoder_for,
    rng_devices,
)
from posbench.experiment.config import EncodingSpec, RunConfig, SweepConfig, to_jsonable
from posbench.experiment.outcome import SweepOutcome
from posbench.experiment.planner import (
    AFTER_TWIN,
    PROFILE,
    REFUSED,
    STORED,
    TRAIN,
    VARIANT,
    Job,
    SweepPlan,
    compute_job,
    plan_bench,
    plan_sweep,
)
from posbench.experiment.profiling import profile_output
from posbench.kernels import native
from posbench.kernels.cpu import compute_settings
from posbench.plugins import loaded_plugin_dirs
from posbench.store import (
    RESULTS_FILE,
    RunCache,
    RunFolder,
    prepare_sweep_dir,
    sweep_lock,
    sweep_temporary_files,
    write_results_csv,
    write_sweep_marker,
)
from posbench.tasks import create_task

if TYPE_CHECKING:
    from posbench.experiment.executors import Executor
    from posbench.experiment.profiling import BenchConfig


def run_sweep(
    sweep: SweepConfig,
    out_dir: Path,
    force: bool = False,
    reporter: Reporter | None = None,
    executor: "Executor | None" = None,
) -> SweepOutcome:
    """Run every (task, encoding, seed) of `sweep` into `out_dir`, skipping finished runs.
    The executor computes runs (here, in processes, on Ray); this driver alone stores them.
    Only the runs of this configuration make the folder's results.csv; runs of other
    configurations already there are kept and left out. The caller's torch threads, denormal
    mode and RNG state are as they were afterwards."""
    from posbench.experiment.executors import LocalExecutor

    with torch.random.fork_rng(devices=rng_devices(sweep.device)):  # probe models draw weights too
        return _run_sweep(
            sweep, Path(out_dir), force, reporter or SilentReporter(), executor or LocalExecutor()
        )


def _run_sweep(
    sweep: SweepConfig, out_dir: Path, force: bool, reporter: Reporter, executor: "Executor"
) -> SweepOutcome:
    return execute_plan(plan_sweep(sweep, out_dir, force), out_dir, reporter, executor)


def execute_plan(
    plan: SweepPlan, out_dir: Path, reporter: Reporter, executor: "Executor"
) -> SweepOutcome:
    """Walk the plan: set damaged folders aside, compute its training runs and variants
    through the executor a wave at a time (a job runs once every run it needs is stored),
    then its profiles one at a time (a latency is measured alone), storing each output as it
    comes and rebuilding results.csv after each."""
    sweep = plan.sweep
    prepare_sweep_dir(out_dir)
    for warning in plan.warnings:
        reporter.note(f"warning: {warning}")
    with sweep_lock(out_dir), compute_settings(None):
        sweep_temporary_files(out_dir)
        members = plan.members()
        write_sweep_marker(out_dir, to_jsonable(dataclasses.asdict(sweep)), members)
        outcome = SweepOutcome(out_dir, out_dir / RESULTS_FILE, plan=plan.rows())
        stored = RunCache()  # each run read and checked once for the rebuilds after each run
        for job in plan.jobs:
            if job.damage:
                where = RunFolder(out_dir / job.run_id).set_aside()
                outcome.set_aside[job.label] = job.damage
                reporter.note(
                    f"set aside damaged run {job.label} ({job.damage}) as {where}; it is redone"
                )
            if job.action == STORED:
                outcome.skipped.append(job.run_id)
            elif job.action == REFUSED:
                outcome.failures[job.label] = job.reason
        computed = [job for job in plan.jobs if job.to_run and job.kind != PROFILE]
        if computed and sweep.device == "cpu":  # built here once, not raced by every worker
            native.build_for({job.work.encoding.name for job in computed})
        scheduled = [job for job in plan.jobs if job.kind != PROFILE and job.action != REFUSED]
        reporter.sweep_started(len(scheduled), len(computed))
        waiting = [job for job in computed if job.action == AFTER_TWIN]
        if waiting:
            reporter.note(
                f"{len(waiting)} fixed-budget run(s) wait for their early-stopping twins: a twin "
                "that trains all its steps without stopping hands over its model"
            )
        _compute_jobs(computed, plan, out_dir, reporter, executor, outcome, stored)
        for job in plan.jobs:
            if job.kind == PROFILE and job.to_run:
                reporter.note(
                    f"profiling {job.work.encoding.display()} (latency and memory, small sizes)"
                )
                store_output(out_dir, job, profile_output(job.work))
                outcome.ran.append(job.run_id)
        for job in plan.jobs:
            result = RunFolder(out_dir / job.run_id).result() or {}
            if result.get("status") in ("diverged", "error"):
                outcome.failures[job.label] = result.get("error", "unknown error")
        outcome.missing = [
            label
            for run_id, label in members.items()
            if label not in outcome.failures and not RunFolder(out_dir / run_id).is_finished()
        ]
        problems: list[str] = []
        outcome.results_csv = write_results_csv(out_dir, problems)
        outcome.problems = problems
    return outcome


def _compute_jobs(
    jobs: list[Job],
    plan: SweepPlan,
    out_dir: Path,
    reporter: Reporter,
    executor: "Executor",
    outcome: SweepOutcome,
    stored: RunCache,
) -> None:
    """Compute `jobs` through the executor in one pass, each as soon as the runs it needs are
    stored (a variant right after its base, so an interrupted sweep keeps the variants of the
    runs it finished), storing each output as it comes. A job whose needed run failed never
    becomes ready, and ends missing."""
    waiting = {job.run_id: job for job in jobs}
    running: dict[str, tuple[Job, Any]] = {}

    def ready() -> list[Any]:
        """The computations of the waiting jobs whose needs are all stored, now running."""
        started = []
        for job in list(waiting.values()):
            if any(need in waiting or need in running for need in job.needs):
                continue
            del waiting[job.run_id]
            computation = compute_job(job, out_dir)
            if computation is None:  # a run it needs failed
                continue
            if job.kind == VARIANT:
                reporter.note(f"evaluating {job.label} (the trained model, no retraining)")
            elif job.twin is not None and computation.trained_state is not None:
                outcome.took_twin_model.append(job.run_id)
            running[job.run_id] = (job, computation)
            started.append(computation)
        return started

    first = ready()
    if not first:
        return
    outputs = executor.map(first, plan.sweep.threads, reporter, loaded_plugin_dirs())
    with closing(outputs):
        added: list[Any] | None = None
        while True:
            try:
                output = outputs.send(added)  # type: ignore[attr-defined]
            except StopIteration:
                break
            job, computation = running.pop(output.run_id)
            store_output(out_dir, job, output)
            outcome.ran.append(output.run_id)
            reporter.run_finished(computation.run, output.status, output.result.get("seconds", 0.0))
            write_results_csv(out_dir, outcome.problems, cache=stored)
            added = ready()


def run_bench(
    config: "BenchConfig",
    specs: tuple[EncodingSpec, ...],
    out_dir: Path,
    force: bool = False,
    on_profile: Callable[[str], None] = lambda label: None,
) -> list[str]:
    """`posbench bench`: profile each encoding of `specs` into its own folder of the sweep
    folder `out_dir` (locked while written), skipping finished ones; results.csv is rebuilt
    after each. Returns the run ids; `on_profile` hears each encoding's label as it starts."""
    jobs = plan_bench(config, specs, out_dir, force)
    prepare_sweep_dir(out_dir)
    with sweep_lock(out_dir):
        write_sweep_marker(
            out_dir,
            {"bench": jobs[0].work.to_dict()["bench"] if jobs else {}},
            {job.run_id: job.label for job in jobs},
        )
        stored = RunCache()
        for job in jobs:
            on_profile(job.label)
            if job.to_run:
                store_output(out_dir, job, profile_output(job.work))
            write_results_csv(out_dir, cache=stored)
    return [job.run_id for job in jobs]


def store_output(out_dir: Path, job: Job, output: RunOutput) -> None:
    """The one writer of a sweep's outputs: a job's files, written atomically, result.json last
    (the mark of a finished run). A training run whose evaluation failed keeps its trained model
    and the measurements taken so far; a variant keeps no second copy of its base's model."""
    ok = output.status == "ok"
    folder = RunFolder(out_dir / job.run_id)
    if job.kind == PROFILE:
        folder.store(
            output.config,
            output.env,
            output.log,
            output.result,
            output.measurements if ok else None,
        )
        return
    config = output.config
    keep = ok or (job.kind == TRAIN and output.result.get("stage") == "evaluation")
    if job.kind == VARIANT:
        config = job.work.config()
        output.result["variant_of"] = job.work.base.run_id
    folder.store(
        config,
        output.env,
        output.log,
        output.result,
        output.measurements if keep else None,
        output.model_state if keep and job.kind == TRAIN else None,
        output.artifacts if ok else None,
    )


def load_run(folder: Path) -> tuple[RunConfig, Any]:
    """The config and trained model of a finished run folder (for reproduction and analysis)."""
    stored = RunFolder(folder)
    run = RunConfig.from_dict(stored.config())
    task = create_task(run.task.name, **run.task.options)
    model = decoder_for(run.model, run.encoding, task)
    model.load_state_dict(stored.model_state())
    return run, model
