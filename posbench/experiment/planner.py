"""The planner: a sweep becomes one plan, the list of fully resolved jobs that running it
executes (training runs, evaluation-time variants, profiles), each with its final options, run
id, label, the runs it waits for and what it reuses from the store, decided from one snapshot
of the sweep folder. The configuration is checked and its warnings found here, once.
`posbench run --dry-run` prints this plan and run_sweep executes it; no other module makes a
job's configuration or decides what a job reuses."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Union

import torch

from posbench.encodings import BUILTINS, check_encoding_options, create_encoding
from posbench.encodings import REGISTRY as ENCODINGS
from posbench.encodings.base import Span
from posbench.errors import ConfigError, PosbenchError, ResultsError
from posbench.experiment.compute import TRAINING_FIELDS, RunJob, decoder_for
from posbench.experiment.config import (
    DEVICE_PATTERN,
    EncodingSpec,
    EvalConfig,
    ModelSize,
    RunConfig,
    SweepConfig,
    TrainConfig,
    check_threads,
    longest_training_sequence,
    model_sizes,
    plugin_code,
    resolve_tied_options,
    stops_early,
    training_key,
)
from posbench.experiment.evaluation import (
    EVALUATION_METRICS,
    EVALUATION_PROTOCOL,
    evaluation_memory_bytes,
    outdated_evaluation,
)
from posbench.experiment.memory import (
    TRAINING_BYTES_PER_PARAMETER,
    available_bytes,
    parameter_count,
)
from posbench.experiment.profiling import QUICK_PROFILE, SMALL_PROFILE, BenchConfig, ProfileRun
from posbench.experiment.reachability import unreached
from posbench.experiment.training import training_memory_bytes
from posbench.experiment.variants import (
    TRAINED_LENGTH_OPTION,
    VariantJob,
    variant_applies,
    variant_label,
)
from posbench.plugins import loaded_plugin_dirs
from posbench.store import ANSWER_POSITIONS_FILE, TERMS_FILE, RunFolder, check_sweep_dir
from posbench.tasks import create_task
from posbench.validation import check_dataclass

#: The kinds of job a plan holds.
TRAIN, VARIANT, PROFILE = "train", "variant", "profile"

#: What executing a job does, decided from the snapshot of the store the plan was made from.
STORED = "stored"  # finished and whole: skipped
RUN = "run"  # computed: trained and evaluated; a variant evaluated; a profile measured
EVALUATE_KEPT = "evaluate its kept model"  # an earlier attempt trained, its evaluation failed
AFTER_TWIN = "run after its twin"  # a fixed-budget run that may take its twin's model
TAKE_TWIN = "take its twin's model"  # that twin is stored and never stopped early
REFUSED = "refused"  # a variant whose base run is stored without its trained weights

Work = Union[RunConfig, VariantJob, ProfileRun]


@dataclass(frozen=True)
class Job:
    """One resolved job of a plan: what it computes (`work`), its id and label, what executing
    it does (`action`, one of the constants above) and why (`reason`), the run ids it waits for
    (`needs`), and the damage of a stored folder that is set aside before it runs."""

    kind: str
    work: Work
    action: str
    needs: tuple[str, ...] = ()
    reason: str = ""
    damage: str = ""
    #: A fixed-budget run's early-stopping twin, whose model it takes if the twin never stops.
    twin: RunConfig | None = None

    @property
    def run_id(self) -> str:
        return self.work.run_id

    @property
    def label(self) -> str:
        return self.work.label

    @property
    def to_run(self) -> bool:
        """Whether executing the plan computes this job (not stored, not refused)."""
        return self.action not in (STORED, REFUSED)

    def row(self) -> tuple[str, str, str, str]:
        """(kind, label, run id, action and its reason): one line of the printed plan."""
        action = f"{self.action}: {self.reason}" if self.reason else self.action
        if self.damage:
            action = f"{action} (its stored folder is damaged, {self.damage}, and set aside)"
        return self.kind, self.label, self.run_id, action


@dataclass
class SweepPlan:
    """What a sweep does, checked as running it checks it: the configuration with defaults
    filled, every job in the order it is planned, and the configuration's warnings."""

    sweep: SweepConfig
    jobs: list[Job]
    warnings: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[RunConfig]:
        """The training runs (each a RunConfig)."""
        return [job.work for job in self.jobs if job.kind == TRAIN]  # type: ignore[misc]

    @property
    def variants(self) -> list[VariantJob]:
        return [job.work for job in self.jobs if job.kind == VARIANT]  # type: ignore[misc]

    @property
    def profiles(self) -> list[ProfileRun]:
        return [job.work for job in self.jobs if job.kind == PROFILE]  # type: ignore[misc]

    def members(self) -> dict[str, str]:
        """Run id -> label of every job: the sweep's members."""
        return {job.run_id: job.label for job in self.jobs}

    def rows(self) -> list[tuple[str, str, str, str]]:
        """The plan as `--dry-run` prints it and as run_sweep records it executed."""
        return [job.row() for job in self.jobs]


def plan_sweep(sweep: SweepConfig, out_dir: Path, force: bool = False) -> SweepPlan:
    """Check `sweep` and its folder and say what running it would do, writing nothing (the
    command line's --dry-run, and the first step of run_sweep). With `force` every job is
    computed again."""
    sweep = resolve_sweep(sweep)
    out_dir = Path(out_dir)
    check_sweep_dir(out_dir)
    runs = expand_runs(sweep)
    variants = variant_jobs(sweep, runs)
    twins = early_stopping_twins(runs)
    outdated = {
        work.run_id: why
        for work in [*runs, *variants]
        if (why := outdated_in(work, RunFolder(out_dir / work.run_id)))
    }
    jobs = [_training_job(run, twins.get(run.run_id), out_dir, force, outdated) for run in runs]
    planned = {job.run_id: job for job in jobs}
    jobs += [_variant_job(variant, planned, out_dir, force, outdated) for variant in variants]
    jobs += [_simple_job(PROFILE, profile, out_dir, force) for profile in profile_runs(sweep)]
    return SweepPlan(sweep, jobs, reachability_warnings(sweep))


def plan_bench(
    config: BenchConfig, specs: tuple[EncodingSpec, ...], out_dir: Path, force: bool = False
) -> list[Job]:
    """`posbench bench`'s plan: one profile of each encoding under `config`, stored or to run."""
    return [_simple_job(PROFILE, work, Path(out_dir), force) for work in _profiles(config, specs)]


def _profiles(config: BenchConfig, specs: tuple[EncodingSpec, ...]) -> list[ProfileRun]:
    return [ProfileRun(spec, config) for spec in specs]


# ---- the checks ----------------------------------------------------------------------------
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


# ---- the jobs ------------------------------------------------------------------------------
def expand_runs(sweep: SweepConfig) -> list[RunConfig]:
    """The grid: every task x model size x encoding x seed, in that nesting order, with options
    tied to the training length resolved per task."""
    runs = []
    for task in sweep.tasks:
        longest = longest_training_sequence(task)
        for size in model_sizes(sweep):
            for enc in sweep.encodings:
                for seed in sweep.seeds:
                    runs.append(
                        RunConfig(
                            task,
                            resolve_tied_options(enc, longest),
                            seed,
                            size,
                            dataclasses.replace(sweep.train, **task.train),
                            sweep.eval,
                            sweep.device,
                            sweep.quick,
                            plugin_code(task.name, enc.name),
                            show_size=len(model_sizes(sweep)) > 1,
                        )
                    )
    return runs


def variant_jobs(sweep: SweepConfig, runs: list[RunConfig]) -> list[VariantJob]:
    """Every run of an encoding a variant names, under each such variant, with the options it
    leaves to the base run (the length the model was trained on) filled."""
    jobs = []
    for run in runs:
        for variant in sweep.eval_variants:
            if not variant_applies(variant, run.encoding):
                continue
            derived = {}
            accepts = inspect.signature(ENCODINGS.get(run.encoding.name)).parameters
            if TRAINED_LENGTH_OPTION in accepts and TRAINED_LENGTH_OPTION not in {
                **run.encoding.options,
                **variant.options,
            }:
                task = create_task(run.task.name, **run.task.options)
                derived[TRAINED_LENGTH_OPTION] = task.sequence_length(task.train_lengths[1])
            jobs.append(VariantJob(run, variant, derived))
    return jobs


def profile_runs(sweep: SweepConfig) -> list[ProfileRun]:
    """The small latency/memory profile of each encoding of a sweep that profiles; an option
    tied to the training length takes the sweep's longest training sequence, so a table sized
    by it serves every task's model."""
    if not sweep.profile:
        return []
    base = QUICK_PROFILE if sweep.quick else SMALL_PROFILE
    config = dataclasses.replace(
        base,
        device=sweep.device,
        threads=sweep.threads or torch.get_num_threads(),
        plugin_dirs=loaded_plugin_dirs(),
    )
    longest = max(longest_training_sequence(task) for task in sweep.tasks)
    return _profiles(config, tuple(resolve_tied_options(s, longest) for s in sweep.encodings))


def early_stopping_twins(runs: list[RunConfig]) -> dict[str, RunConfig]:
    """Fixed-budget run id -> the run of the same sweep that trains the same way but may stop
    early (the same training key): if that twin never stops, its model is this run's."""
    stopping = {training_key(run): run for run in runs if stops_early(run)}
    return {
        run.run_id: stopping[training_key(run)]
        for run in runs
        if not stops_early(run) and training_key(run) in stopping
    }


def outdated_in(work: RunConfig | VariantJob, folder: RunFolder) -> str:
    """Why the finished run of `work` stored in `folder` would score differently under today's
    evaluation ("" where it would not, or where no finished run is stored there): a run
    evaluated under an older evaluation protocol is computed again, never mixed with runs
    evaluated under today's."""
    try:
        result = folder.result()
    except ResultsError:
        return ""
    if result is None or result.get("status") != "ok":
        return ""
    recorded = result.get("evaluation_protocol", 1)
    if not isinstance(recorded, int) or recorded >= EVALUATION_PROTOCOL:
        return ""
    size = work.model if isinstance(work, RunConfig) else work.base.model
    spec = work.encoding
    try:
        encoding = create_encoding(
            spec.name,
            n_heads=size.n_heads,
            d_head=size.d_model // size.n_heads,
            n_layers=size.n_layers,
            **spec.options,
        )
    except Exception:  # an encoding that no longer builds: planning reports it elsewhere
        return ""
    return outdated_evaluation(recorded, encoding) or ""


def _simple_job(kind: str, work: Work, out_dir: Path, force: bool, outdated: str = "") -> Job:
    """A job that is stored or computed from nothing (a profile), or computed again because
    its stored evaluation is `outdated` (why)."""
    folder = RunFolder(out_dir / work.run_id)
    damage = folder.damage()
    if folder.is_finished() and not force and not damage and not outdated:
        return Job(kind, work, STORED)
    return Job(kind, work, RUN, reason=outdated, damage=damage or "")


def _training_job(
    run: RunConfig, twin: RunConfig | None, out_dir: Path, force: bool, outdated: dict[str, str]
) -> Job:
    """A training run's job: stored, computed anew, evaluated on the model an earlier attempt
    kept, or taken over from an early-stopping twin that never stopped. A stored run whose
    evaluation is outdated (its run id in `outdated`) is evaluated again on its kept model, or
    trained again where it kept none."""
    folder = RunFolder(out_dir / run.run_id)
    damage = folder.damage() or ""
    stale = outdated.get(run.run_id, "")
    if not force and folder.is_finished() and not damage and not stale:
        return Job(TRAIN, run, STORED)
    if not force and not damage and stale and folder.model_kept():
        return Job(TRAIN, run, EVALUATE_KEPT, reason=stale)
    if not force and not damage and _evaluation_failed(folder):
        return Job(
            TRAIN,
            run,
            EVALUATE_KEPT,
            reason="an earlier attempt trained it, then failed to evaluate",
        )
    if twin is None:
        return Job(TRAIN, run, RUN, reason=stale, damage=damage)
    why = (
        f"{twin.label} trains the same steps but may stop early; if it never stops, its model "
        "is this run's"
    )
    twin_folder = RunFolder(out_dir / twin.run_id)
    twin_current = twin.run_id not in outdated
    if not force and twin_folder.is_finished() and not twin_folder.damage() and twin_current:
        if twin_handover(run, twin, out_dir) is None:
            return Job(TRAIN, run, RUN, reason=stale, damage=damage)
        return Job(TRAIN, run, TAKE_TWIN, reason=why, damage=damage, twin=twin)
    return Job(TRAIN, run, AFTER_TWIN, needs=(twin.run_id,), reason=why, damage=damage, twin=twin)


def _evaluation_failed(folder: RunFolder) -> bool:
    """Whether the stored attempt trained its model and failed while evaluating it."""
    try:
        result = folder.result() or {}
        return (
            result.get("status") == "error"
            and result.get("stage") == "evaluation"
            and folder.model_kept()
        )
    except ResultsError:
        return False


def _variant_job(
    variant: VariantJob,
    planned: dict[str, Job],
    out_dir: Path,
    force: bool,
    outdated: dict[str, str],
) -> Job:
    """A variant's job: stored, refused when its base is stored without weights, or evaluated
    once its base run is stored (again where its stored evaluation is outdated)."""
    job = _simple_job(VARIANT, variant, out_dir, force, outdated.get(variant.run_id, ""))
    base = planned[variant.base.run_id]
    if job.action == STORED:
        why = _evaluated_another_model(variant, base, out_dir)
        if not why:
            return job
        job = replace(job, action=RUN, reason=why)
    if base.action == STORED and not RunFolder(out_dir / base.run_id).model_kept():
        return replace(
            job,
            action=REFUSED,
            reason=f"its base run {base.run_id} was exported without its trained weights; run the "
            "sweep with --force to train it again",
        )
    return replace(job, needs=() if base.action == STORED else (base.run_id,))


def _evaluated_another_model(variant: VariantJob, base: Job, out_dir: Path) -> str:
    """Why a stored variant no longer describes its base run's model ("" where it does): the
    base trains again now, or was trained again since the variant read it (the variant
    records the weights it read; one stored before it did is taken as it is)."""
    if base.action not in (STORED, EVALUATE_KEPT):  # EVALUATE_KEPT: the same weights
        return f"its base run {base.run_id} trains again, so its model is evaluated again"
    read = (RunFolder(out_dir / variant.run_id).result() or {}).get("evaluated_model")
    held = RunFolder(out_dir / base.run_id).model_digest()
    if read and held and read != held:
        return f"it read other weights than its base run {base.run_id} holds (trained again since)"
    return ""


# ---- what a job computes, read from the store when it runs ---------------------------------
def compute_job(job: Job, out_dir: Path) -> RunJob | None:
    """The computation of a training or variant job whose needs are stored, as the plan
    decided it: None when a run it needs is not stored (it failed), so the job cannot run."""
    if job.kind == VARIANT:
        variant: VariantJob = job.work  # type: ignore[assignment]
        base = RunFolder(out_dir / variant.base.run_id)
        if not base.is_finished():
            return None
        run = replace(variant.base, encoding=variant.encoding)
        return RunJob(
            run,
            base.model_bytes(),
            base.result() or {},
            reused=f"run {variant.base.run_id} trained, under evaluation-time variant options",
            store_as=job.run_id,
        )
    run: RunConfig = job.work  # type: ignore[no-redef]
    if job.action == EVALUATE_KEPT:
        folder = RunFolder(out_dir / run.run_id)
        try:
            result = folder.result() or {}
            return RunJob(
                run, folder.model_bytes(), {k: result[k] for k in TRAINING_FIELDS if k in result}
            )
        except ResultsError:  # the kept model went missing since the plan: train again
            return RunJob(run)
    if job.action in (AFTER_TWIN, TAKE_TWIN) and job.twin is not None:
        return twin_handover(run, job.twin, out_dir) or RunJob(run)
    return RunJob(run)


def twin_handover(run: RunConfig, twin: RunConfig, out_dir: Path) -> RunJob | None:
    """A job that evaluates the stored model of `run`'s early-stopping twin when that twin
    trained all of `run`'s steps without stopping (its weights are what `run` would train);
    None when it stopped early, failed or kept no model."""
    folder = RunFolder(out_dir / twin.run_id)
    try:
        result = folder.result() or {}
        if (
            not folder.is_finished()
            or result.get("steps_done") != run.train.steps
            or not folder.model_kept()
        ):
            return None
        state = folder.model_bytes()
        probes = folder.table(TERMS_FILE)
        evaluated = _evaluation_rows(folder) if twin.eval == run.eval else None
        answers = None if evaluated is None else folder.artifact_bytes(ANSWER_POSITIONS_FILE)
    except ResultsError:
        return None
    return RunJob(
        run,
        state,
        {k: result[k] for k in TRAINING_FIELDS if k in result},
        f"{twin.label} trained (run {twin.run_id}): its early stopping never triggered, so its "
        f"{run.train.steps} steps are this run's",
        [] if probes is None else probes.to_dict("records"),
        evaluated=evaluated,
        evaluated_artifacts={} if answers is None else {ANSWER_POSITIONS_FILE: answers},
        evaluated_by=twin.run_id,
    )


def _evaluation_rows(folder: RunFolder) -> list[dict[str, Any]]:
    """A stored run's evaluation rows (EVALUATION_METRICS), as evaluation yields them: lengths
    and positions whole numbers, absent ones None."""
    frame = folder.measurements()
    frame = frame[frame["metric"].isin(EVALUATION_METRICS)]
    rows = []
    for record in frame.to_dict("records"):
        for key in ("eval_len", "position", "mem_len", "seq_len"):
            value = record.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                record[key] = None
            elif key != "mem_len":
                record[key] = int(value)
        record["note"] = record["note"] if isinstance(record.get("note"), str) else ""
        rows.append(record)
    return rows
