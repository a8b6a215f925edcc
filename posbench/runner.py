"""Runs a sweep: validates every run up front, skips finished runs, records failures and
carries on, and rebuilds results.csv after each run."""
from __future__ import annotations

import dataclasses
import io
import math
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from posbench.config import EncodingSpec, RunConfig, SweepConfig, to_jsonable, expand_runs
from posbench.cpu import configure_cpu
from posbench.encodings import BUILTINS, REGISTRY as ENCODINGS
from posbench.encodings.base import Span
from posbench.errors import ConfigError, ResultsError
from posbench.evaluation import evaluate
from posbench.model import ModelConfig, model_from_config
from posbench.plugins import load_plugins, loaded_plugin_dirs
from posbench.registry import check_options
from posbench.results import (
    SWEEP_MARKER,
    RunFolder,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    environment,
    read_json,
    write_results_csv,
)
from posbench.tasks import create_task
from posbench.tasks.base import Task
from posbench.training import Diverged, train

if TYPE_CHECKING:
    from posbench.executors import Executor


class Reporter(Protocol):
    """Progress callbacks; the CLI implements them with rich."""

    def sweep_started(self, total: int, to_run: int) -> None: ...
    def run_started(self, run: RunConfig, steps: int) -> None: ...
    def step(self, step: int, loss: float) -> None: ...
    def run_finished(self, run: RunConfig, status: str) -> None: ...
    def note(self, message: str) -> None: ...


class SilentReporter:
    """A Reporter that reports nothing (tests, library use)."""

    def sweep_started(self, total: int, to_run: int) -> None:
        """Nothing to show."""

    def run_started(self, run: RunConfig, steps: int) -> None:
        """Nothing to show."""

    def step(self, step: int, loss: float) -> None:
        """Nothing to show."""

    def run_finished(self, run: RunConfig, status: str) -> None:
        """Nothing to show."""

    def note(self, message: str) -> None:
        """Nothing to show."""


@dataclass
class SweepOutcome:
    """What a sweep did: runs trained now, runs skipped as finished, and failures."""

    out_dir: Path
    results_csv: Path
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # label -> one-line error


def resolve_sweep(sweep: SweepConfig) -> SweepConfig:
    """Fill defaults (every built-in encoding) and check every run before anything is written."""
    if not sweep.encodings:
        sweep = replace(sweep, encodings=tuple(EncodingSpec(n) for n in BUILTINS))
    if not sweep.tasks:
        raise ConfigError("The sweep has no tasks; name at least one with --tasks.")
    if not sweep.seeds:
        raise ConfigError("The sweep has no seeds; give at least one with --seeds.")
    if sweep.train.steps < 1 or sweep.train.batch_size < 1:
        raise ConfigError("train steps and batch_size must be at least 1.")
    if sweep.train.train_mem_len is not None and sweep.train.train_mem_len < 0:
        raise ConfigError("--train-mem-len must be >= 0.")
    if sweep.train.train_mem_len == 0 and not sweep.train.train_segment_len:
        raise ConfigError("--train-mem-len 0 needs a train_segment_len to cut sequences into.")
    if sweep.model.d_model % sweep.model.n_heads:
        raise ConfigError(f"d_model={sweep.model.d_model} must be divisible by n_heads={sweep.model.n_heads}.")
    if sweep.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {sweep.device} was asked for but CUDA is not available here; use --device cpu.")
    for spec in sweep.encodings:
        check_options(ENCODINGS.get(spec.name), dict(spec.options), f"encoding {spec.name!r}")
    for task_spec in sweep.tasks:
        task = create_task(task_spec.name, **task_spec.options)
        for spec in sweep.encodings:
            probe = _build_model(sweep.model, spec, task)
            longest = Span(0, task.sequence_length(task.train_lengths[1]))
            reason = probe.encoding.supports(longest)
            if reason:
                raise ConfigError(
                    f"task {task_spec.name!r} trains on sequences of {len(longest)} tokens but {reason}; "
                    "shorten train_lengths or enlarge the encoding."
                )
    return sweep


def _build_model(size: Any, spec: EncodingSpec, task: Task) -> Any:
    config = ModelConfig(task.vocab_size, size.d_model, size.n_layers, size.n_heads, size.d_ff, spec.name, dict(spec.options))
    return model_from_config(config)


def prepare_out_dir(out_dir: Path, sweep: SweepConfig) -> None:
    """Create the sweep folder, refusing one that holds files posbench did not write."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ResultsError(f"--out {out_dir} is a file, not a folder; choose another --out.")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / SWEEP_MARKER).exists():
        raise ResultsError(
            f"{out_dir} already holds files that are not a posbench sweep; choose another --out."
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    marker = out_dir / SWEEP_MARKER
    runs = read_json(marker).get("runs", {}) if marker.exists() else {}
    runs |= {run.run_id: _label(run) for run in expand_runs(sweep)}
    atomic_write_json(marker, {"posbench_sweep": 1, "config": to_jsonable(dataclasses.asdict(sweep)), "runs": runs})


def run_sweep(
    sweep: SweepConfig,
    out_dir: Path,
    force: bool = False,
    reporter: Reporter | None = None,
    executor: "Executor | None" = None,
) -> SweepOutcome:
    """Run every (task, encoding, seed) of `sweep` into `out_dir`, skipping finished runs.
    The executor computes runs (here, in processes, on Ray); this driver alone stores them."""
    from posbench.executors import LocalExecutor

    reporter = reporter or SilentReporter()
    executor = executor or LocalExecutor()
    sweep = resolve_sweep(sweep)
    prepare_out_dir(out_dir, sweep)
    runs = expand_runs(sweep)
    outcome = SweepOutcome(out_dir, out_dir / "results.csv")
    pending = [r for r in runs if force or not RunFolder(out_dir / r.run_id).is_finished()]
    outcome.skipped = [r.run_id for r in runs if r not in pending]
    reporter.sweep_started(len(runs), len(pending))
    by_id = {r.run_id: r for r in pending}
    for output in executor.map(pending, sweep.threads, reporter, loaded_plugin_dirs()):
        store_run(RunFolder(out_dir / output.run_id), output)
        outcome.ran.append(output.run_id)
        reporter.run_finished(by_id[output.run_id], output.status)
        write_results_csv(out_dir)
    for run in runs:
        result = RunFolder(out_dir / run.run_id).result() or {}
        if result.get("status") in ("diverged", "error"):
            outcome.failures[_label(run)] = result.get("error", "unknown error")
    if sweep.profile:
        _profile_encodings(sweep, out_dir, force, reporter, outcome)
    outcome.results_csv = write_results_csv(out_dir)
    return outcome


def _profile_encodings(sweep: SweepConfig, out_dir: Path, force: bool, reporter: Reporter, outcome: SweepOutcome) -> None:
    """The small default latency/memory profile, one stored folder per encoding."""
    from posbench.profiling import QUICK_PROFILE, SMALL_PROFILE, run_profile

    base = QUICK_PROFILE if sweep.quick else SMALL_PROFILE
    config = dataclasses.replace(base, device=sweep.device, threads=sweep.threads or torch.get_num_threads(),
                                 plugin_dirs=loaded_plugin_dirs())
    for spec in sweep.encodings:
        reporter.note(f"profiling {spec.display()} (latency and memory, small sizes)")
        run_id, ran = run_profile(spec, config, out_dir, force)
        (outcome.ran if ran else outcome.skipped).append(run_id)
        result = RunFolder(out_dir / run_id).result() or {}
        if result.get("status") == "error":
            outcome.failures[f"profile / {spec.display()}"] = result.get("error", "unknown error")


def _label(run: RunConfig) -> str:
    return f"{run.task.name} / {run.encoding.display()} / seed {run.seed}"


@dataclass
class RunOutput:
    """Everything one run produced. Workers return it; the driver alone writes it, so
    workers need no shared filesystem."""

    run_id: str
    config: dict[str, Any]
    env: dict[str, Any]
    log: list[str]
    measurements: list[dict[str, Any]]
    model_state: bytes | None
    result: dict[str, Any]

    @property
    def status(self) -> str:
        return self.result["status"]


def compute_run(
    run: RunConfig,
    threads: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
    plugin_dirs: tuple[str, ...] = (),
) -> RunOutput:
    """Train and evaluate one run in this process; failures become a failed RunOutput."""
    if plugin_dirs:
        load_plugins([Path(p) for p in plugin_dirs])
    configure_cpu(threads)
    log: list[str] = []

    def note(message: str) -> None:
        log.append(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}")

    result: dict[str, Any] = {"encoding_label": run.encoding.display(), "quick": run.quick}
    measurements: list[dict[str, Any]] = []
    state: bytes | None = None
    start = time.perf_counter()
    try:
        task = create_task(run.task.name, **run.task.options)
        result["train_len_max"] = task.train_lengths[1]
        torch.manual_seed(run.seed)
        model = _build_model(run.model, run.encoding, task)
        note(f"run {run.run_id}: {_label(run)}, {sum(p.numel() for p in model.parameters())} parameters, "
             f"{torch.get_num_threads()} threads")
        trained = train(model, task, run.train, run.seed, run.device, on_step=on_step)
        note(f"trained {trained.steps_done} steps in {trained.seconds:.1f}s, final loss {trained.final_loss:.4f}")
        measurements = [m.__dict__ | {"seq_len": None, "cache_len": None} for m in evaluate(model, task, run.eval, run.device)]
        measurements.append({"eval_len": None, "mem_len": None, "seq_len": None, "cache_len": None,
                             "metric": "train_loss_final", "value": trained.final_loss, "note": ""})
        state = _state_bytes(model)
        in_dist = [m["value"] for m in measurements if m["metric"] == "exact_match" and m["mem_len"] is None
                   and m["eval_len"] is not None and m["eval_len"] <= task.train_lengths[1] and not math.isnan(m["value"])]
        result["in_distribution_exact_match"] = sum(in_dist) / len(in_dist) if in_dist else None
        result["undertrained"] = bool(in_dist) and result["in_distribution_exact_match"] < 0.9
        result["train_losses"] = trained.losses
        result["train_seconds"] = trained.seconds
        result["status"] = "ok"
    except Diverged as err:
        result["status"], result["error"] = "diverged", f"diverged: {err}"
        note(result["error"])
    except Exception as err:  # one run's failure must not stop the sweep
        result["status"], result["error"] = "error", f"{type(err).__name__}: {err}"
        note(traceback.format_exc())
    result["seconds"] = time.perf_counter() - start
    return RunOutput(run.run_id, run.to_dict(), environment(run.device), log, measurements, state, result)


def failed_output(run: RunConfig, error: str) -> RunOutput:
    """The record of a run whose worker died or was lost."""
    return RunOutput(run.run_id, run.to_dict(), {}, [error], [], None,
                     {"encoding_label": run.encoding.display(), "status": "error", "error": error})


def store_run(folder: RunFolder, output: RunOutput) -> str:
    """Write a run's files atomically, result.json last (the mark of a finished run)."""
    folder.path.mkdir(parents=True, exist_ok=True)
    folder.clear()
    atomic_write_json(folder.path / "config.json", output.config)
    if output.env:
        atomic_write_json(folder.path / "env.json", output.env)
    atomic_write_text(folder.path / "log.txt", "\n".join(output.log) + "\n")
    if output.status == "ok":
        folder.write_measurements(output.measurements)
        if output.model_state is not None:
            atomic_write_bytes(folder.path / "model.pt", output.model_state)
    atomic_write_json(folder.path / "result.json", output.result)
    return output.status


def _state_bytes(model: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
    return buffer.getvalue()


def load_run(folder: Path) -> tuple[RunConfig, Any]:
    """The config and trained model of a finished run folder (for reports and reproduction)."""
    run = RunConfig.from_dict(read_json(folder / "config.json"))
    task = create_task(run.task.name, **run.task.options)
    model = _build_model(run.model, run.encoding, task)
    try:
        state = torch.load(folder / "model.pt", map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ResultsError(f"{folder / 'model.pt'} is missing; rerun that run.") from None
    except Exception as err:
        raise ResultsError(f"{folder / 'model.pt'} is corrupt ({err}); delete {folder} and rerun.") from None
    model.load_state_dict(state)
    return run, model
