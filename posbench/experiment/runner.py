"""Runs a sweep: validates every run up front, holds the sweep folder's lock, sets damaged
runs aside, skips finished runs, records failures and carries on, and rebuilds results.csv
from the sweep's own runs after each run."""

from __future__ import annotations

import dataclasses
import itertools
import re
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from posbench.experiment.compute import (
    TRAINING_FIELDS,
    Reporter,
    RunJob,
    RunOutput,
    SilentReporter,
    decoder_for,
    rng_devices,
)
from posbench.experiment.config import (
    DEVICE_PATTERN,
    EncodingSpec,
    EvalConfig,
    ModelSize,
    RunConfig,
    SweepConfig,
    TrainConfig,
    check_threads,
    expand_runs,
    longest_training_sequence,
    model_sizes,
    resolve_tied_options,
    stops_early,
    to_jsonable,
    training_key,
)
from posbench.experiment.variants import (
    VariantJob,
    evaluate_variant,
    variant_applies,
    variant_jobs,
    variant_label,
)
from posbench.kernels import native
from posbench.kernels.cpu import compute_settings
from posbench.encodings import BUILTINS, check_encoding_options
from posbench.encodings.base import Span
from posbench.errors import ConfigError, PosbenchError, ResultsError
from posbench.experiment.evaluation import evaluation_memory_bytes
from posbench.experiment.training import training_memory_bytes
from posbench.experiment.memory import (
    TRAINING_BYTES_PER_PARAMETER,
    available_bytes,
    parameter_count,
)
from posbench.experiment.outcome import SweepOutcome
from posbench.experiment.reachability import unreached
from posbench.plugins import loaded_plugin_dirs
from posbench.store import (
    RESULTS_FILE,
    TERMS_FILE,
    RunCache,
    RunFolder,
    check_sweep_dir,
    prepare_sweep_dir,
    sweep_lock,
    sweep_temporary_files,
    write_results_csv,
    write_sweep_marker,
)
from posbench.tasks import create_task
from posbench.validation import check_dataclass

if TYPE_CHECKING:
    from posbench.experiment.executors import Executor
    from posbench.experiment.profiling import BenchConfig, ProfileRun


def resolve_sweep(sweep: SweepConfig) -> SweepConfig:
    """Fill defaults (every built-in encoding), drop repeated seeds, and check every value and
    every run before anything is written."""
    if not sweep.encodings:
        sweep = replace(sweep, encodings=tuple(EncodingSpec(n) for n in BUILTINS))
    if not sweep.tasks:
        raise ConfigError("The sweep has no tasks; name at least one with --tasks.")
    if not sweep.seeds:
        raise ConfigError("The sweep has no seeds; give at least one with --seeds.")
    sections = [("[model]", ModelSize, size) for size in model_sizes(sweep)]
    for section, cls, values in (
        *sections,
        ("[train]", TrainConfig, sweep.train),
        ("[eval]", EvalConfig, sweep.eval),
    ):
        check_dataclass(
            cls,
            {f.name: getattr(values, f.name) for f in dataclasses.fields(cls)},
            f"sweep {section}",
        )
    check_dataclass(SweepConfig, {"seeds": tuple(sweep.seeds), "threads": sweep.threads}, "sweep")
    check_threads(sweep.threads, "threads")
    sweep = replace(sweep, seeds=tuple(dict.fromkeys(sweep.seeds)))  # --seeds 0,0 trains once
    for kind, labels in (
        ("task", [t.display() for t in sweep.tasks]),
        ("encoding", [e.display() for e in sweep.encodings]),
    ):
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ConfigError(
                f"The sweep lists {kind} {', '.join(map(repr, repeated))} more than once with the "
                "same "
                f"label; give each entry its own 'label' (or drop the repeat)."
            )
    for task_spec in sweep.tasks:
        train = replace(sweep.train, **task_spec.train)
        if (
            train.train_mem_len is not None
            and not create_task(task_spec.name, **task_spec.options).causal
        ):
            raise ConfigError(
                f"task {task_spec.display()!r} is posed to a bidirectional encoder, which reads "
                "whole sequences: a cache continues causal attention only; drop train_mem_len."
            )
        if train.train_mem_len == 0 and not train.train_segment_len:
            raise ConfigError(
                f"task {task_spec.display()!r}: train_mem_len 0 needs a train_segment_len to cut "
                "sequences into."
            )
    for size in model_sizes(sweep):
        if size.d_model % size.n_heads:
            raise ConfigError(
                f"d_model={size.d_model} must be divisible by n_heads={size.n_heads}."
            )
    _check_device(sweep.device)
    names = {spec.name for spec in sweep.encodings} | {
        spec.label for spec in sweep.encodings if spec.label
    }
    for variant in sweep.eval_variants:
        if variant.name not in names:
            raise ConfigError(
                f"evaluation variant {variant.name!r} names no encoding this sweep trains, by name "
                "or "
                f"label ({', '.join(sorted(names))}); add it to the encodings or drop the variant."
            )
    available = available_bytes(sweep.device)
    for task_spec in sweep.tasks:
        task = create_task(task_spec.name, **task_spec.options)
        for size in model_sizes(sweep):
            _check_model_fits(size, task.vocab_size, available)
        longest_eval = max(task.eval_lengths + tuple(sweep.eval.cache_eval_lengths or ()))
        specs = [
            resolve_tied_options(spec, longest_training_sequence(task_spec))
            for spec in sweep.encodings
        ]
        for given, spec in zip(sweep.encodings, specs):
            tied = (
                f" (options tied to the training length of task {task_spec.display()!r})"
                if spec != given
                else ""
            )
            check_encoding_options(spec.name, spec.options, f"encoding {spec.name!r}{tied}")
            for variant in (v for v in sweep.eval_variants if variant_applies(v, spec)):
                check_encoding_options(
                    spec.name,
                    {**spec.options, **variant.options},
                    f"evaluation variant {variant_label(spec, variant)!r}",
                )
        for size, spec in itertools.product(model_sizes(sweep), specs):
            _check_encoding_fits(size, spec, task, available)
            try:
                probe = decoder_for(size, spec, task)
            except PosbenchError:
                raise
            except Exception as err:  # a plugin or option combination that cannot be built
                raise ConfigError(
                    f"encoding {spec.display()!r} cannot be built for "
                    f"d_model={size.d_model}, "
                    f"n_heads={size.n_heads} ({type(err).__name__}: {err}); change its "
                    "options or the model size."
                ) from None
            longest = Span(0, task.sequence_length(task.train_lengths[1]))
            reason = probe.encoding.supports(longest)
            if reason:
                raise ConfigError(
                    f"task {task_spec.name!r} trains on sequences of {len(longest)} tokens but "
                    f"{reason}; "
                    "shorten train_lengths or enlarge the encoding."
                )
            train = replace(sweep.train, **task_spec.train)
            needed = training_memory_bytes(probe, task, train)
            if available is not None and needed > available:
                raise ConfigError(
                    f"training task {task_spec.name!r} with {spec.display()!r} in batches of "
                    f"{train.batch_size} needs about {needed / 2**30:.1f} GiB, more than the "
                    f"{available / 2**30:.1f} GiB available; lower [train] batch_size or the "
                    "training lengths."
                )
            needed = evaluation_memory_bytes(probe, task, sweep.eval, longest_eval)
            if available is not None and needed > available:
                raise ConfigError(
                    f"evaluating task {task_spec.name!r} at length {longest_eval} "
                    f"({task.sequence_length(longest_eval)} tokens, batches of "
                    f"{min(sweep.eval.batch_size, sweep.eval.n_samples)}) "
                    f"with {spec.display()!r} needs about {needed / 2**30:.1f} GiB, more than the "
                    f"{available / 2**30:.1f} GiB "
                    "available; lower eval_lengths or [eval] batch_size."
                )
    return sweep


def _check_model_fits(size: ModelSize, vocab_size: int, available: int | None) -> None:
    """Refuse a model whose training state alone would not fit, before building it (a probe of
    d_model 10^6 would otherwise try to allocate terabytes)."""
    count = parameter_count(vocab_size, size.d_model, size.n_layers, size.d_ff)
    needed = TRAINING_BYTES_PER_PARAMETER * count
    if available is not None and needed > available:
        raise ConfigError(
            f"a decoder of d_model={size.d_model}, n_layers={size.n_layers}, "
            f"d_ff={size.d_ff or 4 * size.d_model} has about {count:.3g} parameters, whose "
            f"training state takes about {needed / 2**30:.3g} GiB, more than the "
            f"{available / 2**30:.1f} GiB available; lower the [model] sizes."
        )


def _check_encoding_fits(
    size: ModelSize, spec: EncodingSpec, task: Any, available: int | None
) -> None:
    """Refuse a model whose training state, the encoding's own parameters included (a learned
    table of 10^7 positions), would not fit, counted on the meta device before anything is
    allocated. An encoding that cannot be built on the meta device is checked when it is built."""
    if available is None:
        return
    try:
        with torch.device("meta"):
            count = sum(p.numel() for p in decoder_for(size, spec, task).parameters())
    except Exception:  # a plugin that allocates on a named device: built and checked below
        return
    needed = TRAINING_BYTES_PER_PARAMETER * count
    if needed > available:
        raise ConfigError(
            f"the decoder with {spec.display()!r} at d_model={size.d_model}, "
            f"n_layers={size.n_layers} has {count:.3g} parameters, whose training state takes "
            f"about {needed / 2**30:.3g} GiB, more than the {available / 2**30:.1f} GiB "
            "available; lower the encoding's options or the [model] sizes."
        )


def reachability_warnings(sweep: SweepConfig) -> list[str]:
    """One sentence per (task, encoding) whose evaluation reads rows of a position- or
    distance-indexed parameter that its training lengths never reach (before anything runs)."""
    warnings = []
    for task_spec in sweep.tasks:
        task = create_task(task_spec.name, **task_spec.options)
        train = replace(sweep.train, **task_spec.train)
        segment = train.train_segment_len or train.train_mem_len
        for spec in sweep.encodings:
            encoding = decoder_for(
                sweep.model, resolve_tied_options(spec, longest_training_sequence(task_spec)), task
            ).encoding
            for missing in unreached(
                encoding, task, spec.display(), None, segment, train.train_mem_len
            ):
                warnings.append(f"task {task_spec.display()!r}: {missing.message()}")
    return warnings


def _check_device(device: str) -> None:
    if not isinstance(device, str) or not re.fullmatch(DEVICE_PATTERN, device):
        raise ConfigError(f"--device must be cpu, cuda, cuda:N or mps, got {device!r}.")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"--device {device} was asked for but CUDA is not available here; use --device cpu."
        )
    if device.startswith("cuda:") and int(device.split(":")[1]) >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)."
        )
    if device == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            "--device mps was asked for but MPS is not available here; use --device cpu."
        )


def profile_jobs(sweep: SweepConfig) -> list["ProfileRun"]:
    """The small latency/memory profile of each encoding that a sweep includes."""
    from posbench.experiment.profiling import QUICK_PROFILE, SMALL_PROFILE, ProfileRun

    if not sweep.profile:
        return []
    base = QUICK_PROFILE if sweep.quick else SMALL_PROFILE
    config = dataclasses.replace(
        base,
        device=sweep.device,
        threads=sweep.threads or torch.get_num_threads(),
        plugin_dirs=loaded_plugin_dirs(),
    )
    longest = longest_training_sequence(
        sweep.tasks[0]
    )  # options tied to the training length: the first task's
    return [ProfileRun(resolve_tied_options(spec, longest), config) for spec in sweep.encodings]


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


@dataclasses.dataclass
class SweepPlan:
    """What a sweep would do, checked as run_sweep checks it: the configuration with defaults
    filled, its training runs, evaluation-time variants and profiles."""

    sweep: SweepConfig
    runs: list[RunConfig]
    variants: list[VariantJob]
    profiles: list["ProfileRun"]


def plan_sweep(sweep: SweepConfig, out_dir: Path) -> SweepPlan:
    """Check `sweep` and its folder and say what running it would do, writing nothing (the
    command line's --dry-run, and the first step of run_sweep)."""
    sweep = resolve_sweep(sweep)
    runs = expand_runs(sweep)
    check_sweep_dir(out_dir)
    return SweepPlan(sweep, runs, variant_jobs(sweep, runs), profile_jobs(sweep))


def finished_runs(runs: list[RunConfig], out_dir: Path) -> list[str]:
    """The labels of the runs that `out_dir` stores finished and whole (read only)."""
    return [run.label for run in runs if RunFolder(out_dir / run.run_id).is_finished()]


def _run_sweep(
    sweep: SweepConfig, out_dir: Path, force: bool, reporter: Reporter, executor: "Executor"
) -> SweepOutcome:
    plan = plan_sweep(sweep, out_dir)
    sweep, runs, profiles, variants = plan.sweep, plan.runs, plan.profiles, plan.variants
    prepare_sweep_dir(out_dir)
    for warning in reachability_warnings(sweep):
        reporter.note(f"warning: {warning}")
    with sweep_lock(out_dir), compute_settings(None):
        sweep_temporary_files(out_dir)
        members = {run.run_id: run.label for run in runs}
        members |= {job.run_id: job.label for job in variants}
        members |= {job.run_id: job.label for job in profiles}
        write_sweep_marker(out_dir, to_jsonable(dataclasses.asdict(sweep)), members)
        outcome = SweepOutcome(out_dir, out_dir / RESULTS_FILE)
        stored = RunCache()  # each run read and checked once for the rebuilds after each run
        for run_id, label in members.items():
            folder = RunFolder(out_dir / run_id)
            damage = folder.damage()
            if damage:
                where = folder.set_aside()
                outcome.set_aside[label] = damage
                reporter.note(f"set aside damaged run {label} ({damage}) as {where}; it is redone")
        jobs = [_job(RunFolder(out_dir / run.run_id), run, force) for run in runs]
        pending = [job for job in jobs if job is not None]
        outcome.skipped = [run.run_id for run, job in zip(runs, jobs) if job is None]
        if pending and sweep.device == "cpu":  # built here once, not raced by every worker
            native.build_for({job.run.encoding.name for job in pending})
        reporter.sweep_started(len(runs), len(pending))
        by_id = {job.run.run_id: job.run for job in pending}
        waiting = {job.run.run_id for job in pending}
        # While training runs are pending, a variant is evaluated on one thread beside them.
        threads = 1 if pending else sweep.threads
        _evaluate_variants(variants, waiting, out_dir, force, threads, reporter, outcome)
        twins = early_stopping_twins(runs)

        def execute(batch: list[RunJob]) -> None:
            nonlocal threads
            with closing(
                executor.map(batch, sweep.threads, reporter, loaded_plugin_dirs())
            ) as outputs:
                for output in outputs:
                    store_run(RunFolder(out_dir / output.run_id), output)
                    outcome.ran.append(output.run_id)
                    waiting.discard(output.run_id)
                    reporter.run_finished(
                        by_id[output.run_id], output.status, output.result.get("seconds", 0.0)
                    )
                    threads = 1 if waiting else sweep.threads
                    mine = [job for job in variants if job.base.run_id == output.run_id]
                    _evaluate_variants(mine, waiting, out_dir, force, threads, reporter, outcome)
                    write_results_csv(out_dir, outcome.problems, cache=stored)

        # A fixed-budget run whose early-stopping twin is still to train waits for it, so it can
        # take the twin's model if the twin never stopped (training it again would repeat it).
        later = [job for job in pending if _twin(job, twins) and _twin(job, twins) in waiting]
        if later:
            reporter.note(
                f"{len(later)} fixed-budget run(s) wait for their early-stopping twins: a twin "
                "that trains all its steps without stopping hands over its model"
            )

        def with_twin_models(jobs: list[RunJob]) -> list[RunJob]:
            ready = [_reused(job, twins, out_dir) for job in jobs]
            outcome.took_twin_model += [r.run.run_id for r, j in zip(ready, jobs) if r is not j]
            return ready

        execute(with_twin_models([job for job in pending if job not in later]))
        if later:
            execute(with_twin_models(later))
        profile_ids = {job.run_id for job in profiles}
        for run_id, label in members.items():
            result = RunFolder(out_dir / run_id).result() or {}
            if result.get("status") in ("diverged", "error") and run_id not in profile_ids:
                outcome.failures[label] = result.get("error", "unknown error")
        _profile_encodings(profiles, out_dir, force, reporter, outcome)
        outcome.missing = [
            label
            for run_id, label in members.items()
            if label not in outcome.failures and not RunFolder(out_dir / run_id).is_finished()
        ]
        problems: list[str] = []
        outcome.results_csv = write_results_csv(out_dir, problems)
        outcome.problems = problems
    return outcome


def _evaluate_variants(
    variants: list[VariantJob],
    waiting: set[str],
    out_dir: Path,
    force: bool,
    threads: int | None,
    reporter: Reporter,
    outcome: SweepOutcome,
) -> None:
    """Evaluate each variant whose base run is no longer `waiting` to be trained, as soon as it
    is stored: an interrupted sweep then keeps every variant of the runs it finished."""
    for job in variants:
        if job.base.run_id in waiting:
            continue
        base = RunFolder(out_dir / job.base.run_id)
        if base.is_finished() and not base.model_kept():
            if force or not RunFolder(out_dir / job.run_id).is_finished():
                outcome.failures[job.label] = (
                    f"its base run {job.base.run_id} was exported without its trained weights; "
                    "run the sweep with --force to train it again"
                )
            continue
        reporter.note(f"evaluating {job.label} (the trained model, no retraining)")
        run_id, ran = evaluate_variant(job, out_dir, force, threads)
        (outcome.ran if ran else outcome.skipped).append(run_id)


def early_stopping_twins(runs: list[RunConfig]) -> dict[str, RunConfig]:
    """Fixed-budget run id -> the run of the same sweep that trains the same way but may stop
    early (the same training key): if that twin never stops, its model is this run's."""
    stopping = {training_key(run): run for run in runs if stops_early(run)}
    return {
        run.run_id: stopping[training_key(run)]
        for run in runs
        if not stops_early(run) and training_key(run) in stopping
    }


def _twin(job: RunJob, twins: dict[str, RunConfig]) -> str | None:
    """The id of the early-stopping twin of a job that still has to train (None: no twin)."""
    twin = twins.get(job.run.run_id) if job.trained_state is None else None
    return twin.run_id if twin is not None else None


def _reused(job: RunJob, twins: dict[str, RunConfig], out_dir: Path) -> RunJob:
    """The job, or, when its early-stopping twin trained all its steps without stopping (so
    its weights are what this run would train), a job that evaluates the twin's model."""
    twin_id = _twin(job, twins)
    if twin_id is None:
        return job
    folder = RunFolder(out_dir / twin_id)
    try:
        result = folder.result() or {}
        if (
            not folder.is_finished()
            or result.get("steps_done") != job.run.train.steps
            or not folder.model_kept()
        ):
            return job
        state = folder.model_bytes()
        probes = folder.table(TERMS_FILE)
    except ResultsError:
        return job
    twin = twins[job.run.run_id]
    return RunJob(
        job.run,
        state,
        {k: result[k] for k in TRAINING_FIELDS if k in result},
        f"{twin.label} trained (run {twin_id}): its early stopping never triggered, so its "
        f"{job.run.train.steps} steps are this run's",
        [] if probes is None else probes.to_dict("records"),
    )


def _job(folder: RunFolder, run: RunConfig, force: bool) -> RunJob | None:
    """What to compute for `run`: None when it is finished, else a job that reuses the model
    an earlier attempt trained when only its evaluation failed."""
    if force:
        return RunJob(run)
    if folder.is_finished():
        return None
    try:
        result = folder.result() or {}
    except ResultsError:
        return RunJob(run)
    if result.get("status") == "error" and result.get("stage") == "evaluation":
        try:
            state = folder.model_bytes()
        except ResultsError:  # no model kept: train again
            return RunJob(run)
        return RunJob(run, state, {k: result[k] for k in TRAINING_FIELDS if k in result})
    return RunJob(run)


def _profile_encodings(
    jobs: list["ProfileRun"], out_dir: Path, force: bool, reporter: Reporter, outcome: SweepOutcome
) -> None:
    """The small default latency/memory profile, one stored folder per encoding."""
    from posbench.experiment.profiling import run_profile

    for job in jobs:
        reporter.note(f"profiling {job.encoding.display()} (latency and memory, small sizes)")
        run_id, ran = run_profile(job, out_dir, force)
        (outcome.ran if ran else outcome.skipped).append(run_id)
        result = RunFolder(out_dir / run_id).result() or {}
        if result.get("status") == "error":
            outcome.failures[job.label] = result.get("error", "unknown error")


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
    from posbench.experiment.profiling import ProfileRun, run_profile

    jobs = [ProfileRun(spec, config) for spec in specs]
    prepare_sweep_dir(out_dir)
    with sweep_lock(out_dir):
        write_sweep_marker(
            out_dir,
            {"bench": jobs[0].to_dict()["bench"] if jobs else {}},
            {job.run_id: job.label for job in jobs},
        )
        stored = RunCache()
        for job in jobs:
            on_profile(job.label)
            run_profile(job, out_dir, force)
            write_results_csv(out_dir, cache=stored)
    return [job.run_id for job in jobs]


def store_run(folder: RunFolder, output: RunOutput) -> str:
    """Write a run's files atomically, result.json last (the mark of a finished run). A run
    whose evaluation failed keeps its trained model and the measurements taken so far."""
    keep = output.status == "ok" or output.result.get("stage") == "evaluation"
    folder.store(
        output.config,
        output.env,
        output.log,
        output.result,
        output.measurements if keep else None,
        output.model_state if keep else None,
        output.artifacts if output.status == "ok" else None,
    )
    return output.status


def load_run(folder: Path) -> tuple[RunConfig, Any]:
    """The config and trained model of a finished run folder (for reproduction and analysis)."""
    stored = RunFolder(folder)
    run = RunConfig.from_dict(stored.config())
    task = create_task(run.task.name, **run.task.options)
    model = decoder_for(run.model, run.encoding, task)
    model.load_state_dict(stored.model_state())
    return run, model
