"""One run computed in whatever process an executor chose: train, evaluate, and hand back a
RunOutput. Nothing here writes results; the sweep's driver alone stores them. Progress goes
out as small events, so a worker process can forward them to the driver."""

from __future__ import annotations

import hashlib
import io
import math
import time
import traceback
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np
import pandas as pd
import torch

from posbench.experiment import diagnostics, reachability
from posbench.encodings.base import Span
from posbench.experiment.diagnostics import positional_bias
from posbench.experiment.config import (
    UNDERTRAINED_BELOW,
    UNLEARNED_EXCESS,
    EncodingSpec,
    ModelSize,
    RunConfig,
)
from posbench.kernels import served
from posbench.kernels.cpu import compute_settings
from posbench.experiment.evaluation import (
    EVALUATION_PROTOCOL,
    FULL_CONTEXT,
    iter_evaluate,
    validation_exact_match,
    validation_excess,
)
from posbench.model import Decoder, ModelConfig, model_from_config
from posbench.plugins import load_worker_plugins
from posbench.store import (
    ANSWER_POSITIONS_FILE,
    BIAS_FILE,
    DISTANCE_FILE,
    REACHABILITY_FILE,
    TERMS_FILE,
    state_from_bytes,
    state_to_bytes,
)
from posbench.experiment.environment import environment
from posbench.tasks import create_task
from posbench.tasks.base import Task
from posbench.experiment.training import Diverged, train

#: How often a driver forwards its workers' progress, and a worker checks its driver is alive (s).
POLL_SECONDS = 0.25

#: (run id, event, payload): ("started", steps), ("step", (step, loss)), ("evaluating", None).
ProgressSink = Callable[[str, str, Any], None]
#: A worker sends a training-step event at most this often (seconds); the last step always.
STEP_EVENT_INTERVAL = 0.5
#: What a result keeps of training, so a retry after a failed evaluation can skip training.
TRAINING_FIELDS = (
    "train_losses",
    "train_seconds",
    "train_loss_final",
    "steps_done",
    "steps_to_threshold",
)


class Reporter(Protocol):
    """Progress callbacks; the CLI implements them with rich bars or plain lines."""

    def sweep_started(self, total: int, to_run: int) -> None: ...
    def run_started(self, run: RunConfig, steps: int) -> None: ...
    def step(self, run: RunConfig, step: int, loss: float) -> None: ...
    def evaluating(self, run: RunConfig) -> None: ...
    def run_finished(self, run: RunConfig, status: str, seconds: float) -> None: ...
    def note(self, message: str) -> None: ...


class SilentReporter:
    """A Reporter that reports nothing (tests, library use)."""

    def sweep_started(self, total: int, to_run: int) -> None:
        """Nothing to show."""

    def run_started(self, run: RunConfig, steps: int) -> None:
        """Nothing to show."""

    def step(self, run: RunConfig, step: int, loss: float) -> None:
        """Nothing to show."""

    def evaluating(self, run: RunConfig) -> None:
        """Nothing to show."""

    def run_finished(self, run: RunConfig, status: str, seconds: float) -> None:
        """Nothing to show."""

    def note(self, message: str) -> None:
        """Nothing to show."""


def relay(reporter: Reporter, by_id: dict[str, RunConfig]) -> ProgressSink:
    """A ProgressSink that hands each event of a run in `by_id` (run id -> run; the caller may
    add runs as it goes) to the reporter method it stands for."""

    def sink(run_id: str, event: str, payload: Any) -> None:
        run = by_id.get(run_id)
        if run is None:
            return
        if event == "started":
            reporter.run_started(run, payload)
        elif event == "step":
            reporter.step(run, *payload)
        elif event == "evaluating":
            reporter.evaluating(run)

    return sink


def posting_sink(post: Callable[[tuple[str, str, Any]], object]) -> ProgressSink:
    """A worker's ProgressSink: each event goes to `post` (a queue's put_nowait, a Ray actor's
    post.remote) and the run moves on. Progress is best effort: a full, closed or lost channel
    drops that event and never stops a run."""

    def send(run_id: str, event: str, payload: Any) -> None:
        with suppress(Exception):
            post((run_id, event, payload))

    return send


@dataclass
class RunJob:
    """A run to compute; `trained_state` and `trained_result` carry a model trained before
    (by an earlier attempt whose evaluation failed, or the base run of an evaluation-time
    variant), so the job only evaluates; `reused` says whose model it is, for the log."""

    run: RunConfig
    trained_state: bytes | None = None
    trained_result: dict[str, Any] = field(default_factory=dict)
    reused: str = "an earlier attempt trained (its evaluation had failed)"
    #: The score-term probes taken while that model trained (empty: none kept).
    trained_probes: list[dict[str, Any]] = field(default_factory=list)
    #: The id the driver stores the output under when it is not the run's own (a variant's).
    store_as: str = ""
    #: The evaluation rows (and the files evaluation writes) of this same model under this same
    #: evaluation, already stored by the run that trained it: taken instead of evaluating again.
    evaluated: list[dict[str, Any]] | None = None
    evaluated_artifacts: dict[str, bytes] = field(default_factory=dict)
    evaluated_by: str = ""  # the run whose evaluation is taken

    @property
    def run_id(self) -> str:
        """The id of the folder this job's output is stored in."""
        return self.store_as or self.run.run_id


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
    #: Other arrays the report draws, computed now so reports need no model: name -> bytes.
    artifacts: dict[str, bytes] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.result["status"]


def decoder_for(size: ModelSize, spec: EncodingSpec, task: Task) -> Decoder:
    """The model of a run: the sweep's size, the task's vocabulary and attention (causal, or
    bidirectional for a task posed to an encoder), the encoding."""
    config = ModelConfig(
        task.vocab_size,
        size.d_model,
        size.n_layers,
        size.n_heads,
        size.d_ff,
        spec.name,
        dict(spec.options),
        task.causal,
        size.tie_embeddings,
    )
    return model_from_config(config)


def rng_devices(device: str) -> list[int]:
    """The CUDA devices whose RNG a run may touch (for torch.random.fork_rng)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return [torch.device(device).index or 0]
    return []


def compute_run(
    job: RunJob,
    threads: int | None = None,
    progress: ProgressSink | None = None,
    plugin_dirs: tuple[str, ...] = (),
) -> RunOutput:
    """Train (unless the job carries a trained model) and evaluate one run in this process.
    Failures become a failed RunOutput. The caller's thread count, denormal mode and global
    RNG state are as they were afterwards."""
    if plugin_dirs:
        load_worker_plugins(plugin_dirs)
    with compute_settings(threads), torch.random.fork_rng(devices=rng_devices(job.run.device)):
        with served.recording() as kernels:
            output = _compute(job, progress or (lambda *_: None))
        output.result["attention_kernels"] = dict(sorted(kernels.items()))
        # which backend attention chose for this encoding, and why each earlier one refused
        output.env["attention"] = dict(sorted(kernels.decisions.items()))
        return output


def _compute(job: RunJob, progress: ProgressSink) -> RunOutput:
    """The stages of one run: set up, train (or reuse a trained model), evaluate, judge whether
    it learned its task, draw its pictures. A failure at any stage is recorded with the stage."""
    run = job.run
    log: list[str] = []

    def note(message: str) -> None:
        log.append(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}")

    result: dict[str, Any] = {
        "encoding_label": run.encoding.display(),
        "task_label": run.task.display(),
        "quick": run.quick,
    }
    measurements: list[dict[str, Any]] = []
    artifacts: dict[str, bytes] = {}
    state: bytes | None = None
    stage = "setup"
    start, cpu_start = time.perf_counter(), time.process_time()
    times: dict[str, float] = {}  # TIME_SPLIT: seconds by what the run spent them on
    lap = start

    def clock(part: str) -> None:  # the seconds since the last call go to `part`
        nonlocal lap
        now = time.perf_counter()
        times[part] = times.get(part, 0.0) + now - lap
        lap = now

    try:
        task = create_task(run.task.name, **run.task.options)
        result["train_len_max"] = task.train_lengths[1]
        torch.manual_seed(run.seed)
        model = decoder_for(run.model, run.encoding, task)
        result["parameters"] = sum(p.numel() for p in model.parameters())
        note(
            f"run {run.run_id}: {run.label}, {result['parameters']} parameters, "
            f"{torch.get_num_threads()} threads"
        )
        reach, reach_rows, result["unreached"] = _reachability(model, task, run)
        for message in result["unreached"]:
            note(message)
        clock("setup")
        if not reach.empty:
            artifacts[REACHABILITY_FILE] = reach.to_csv(index=False).encode()
        probes: list[dict[str, Any]] = []
        if job.trained_state is not None:
            model.load_state_dict(state_from_bytes(job.trained_state))
            model.to(run.device)
            state = job.trained_state
            result.update(
                {k: job.trained_result[k] for k in TRAINING_FIELDS if k in job.trained_result}
            )
            probes.extend(job.trained_probes)
            note(f"reusing the model {job.reused}; evaluating only")
            if job.store_as:  # a variant: which weights it read, so a retrained base shows
                result["evaluated_model"] = hashlib.sha256(job.trained_state).hexdigest()
        else:
            stage = "training"
            result.update(_train(model, task, run, progress, note, probes))
            state = state_to_bytes(model)
        clock("training")
        stage = "evaluation"
        progress(run.run_id, "evaluating", None)
        by_position: list[dict[str, float]] = []
        spent: dict[str, float] = {}  # iter_evaluate's seconds by part of the time split
        if job.evaluated is not None:
            measurements += job.evaluated
            artifacts |= job.evaluated_artifacts
            note(f"evaluation taken from run {job.evaluated_by}: the same model, evaluated alike")
        else:
            for m in iter_evaluate(model, task, run.eval, run.device, by_position, spent):
                measurements.append(m.__dict__ | {"seq_len": None})
        for part, seconds in spent.items():
            times[part] = times.get(part, 0.0) + seconds
        lap += sum(spent.values())  # the rest of the evaluation's time is full context's
        if by_position:
            artifacts[ANSWER_POSITIONS_FILE] = (
                pd.DataFrame(by_position).to_csv(index=False).encode()
            )
        measurements += reach_rows + _training_rows(result, run)
        result.update(_learned(measurements, task, note))
        clock(FULL_CONTEXT)
        _draw_pictures(model, task, run, probes, result, artifacts, note)
        clock("diagnostics")
        result["status"] = "ok"
        result["evaluation_protocol"] = EVALUATION_PROTOCOL
    except Diverged as err:
        result["status"], result["error"] = "diverged", f"diverged: {err}"
        note(result["error"])
    except Exception as err:  # one run's failure must not stop the sweep
        result["status"], result["error"], result["stage"] = (
            "error",
            f"{type(err).__name__}: {err}",
            stage,
        )
        note(traceback.format_exc())
        if stage == "evaluation":
            note(
                f"evaluation failed: the trained model and {len(measurements)} measurement(s) are "
                "kept; "
                "the next run of the same command evaluates again without retraining"
            )
    clock(stage if result.get("status") != "ok" else "diagnostics")
    result["seconds"] = time.perf_counter() - start
    result["time_split"] = {part: round(seconds, 3) for part, seconds in times.items()}
    # CPU time of all the process's threads: unlike the wall time, it leaves out a pause (SIGSTOP)
    # or a wait for a busy core, so runs measured under load stay comparable
    result["cpu_seconds"] = time.process_time() - cpu_start
    return RunOutput(
        job.run_id,
        run.to_dict(),
        environment(run.device),
        log,
        measurements,
        state,
        result,
        artifacts,
    )


def _train(
    model: Decoder,
    task: Task,
    run: RunConfig,
    progress: ProgressSink,
    note: Callable[[str], None],
    probes: list[dict[str, Any]],
) -> dict[str, Any]:
    """Train `model`, sending progress events at most every STEP_EVENT_INTERVAL seconds and
    appending score-term probes (PROBE_POINTS of them) to `probes`; returns the TRAINING_FIELDS."""
    progress(run.run_id, "started", run.train.steps)
    probe_tokens = task.batch(
        task.train_lengths[1], diagnostics.PROBE_SAMPLES, torch.Generator().manual_seed(0)
    ).tokens.to(run.device)
    probe_every = max(1, run.train.steps // PROBE_POINTS)
    last_event = [0.0]

    def on_step(step: int, loss: float) -> None:
        now = time.perf_counter()
        if now - last_event[0] >= STEP_EVENT_INTERVAL or step == run.train.steps - 1:
            last_event[0] = now
            progress(run.run_id, "step", (step, loss))
        if step == 0 or (step + 1) % probe_every == 0:
            probes.extend(diagnostics.term_rows(model, probe_tokens, step + 1))

    trained = train(
        model,
        task,
        run.train,
        run.seed,
        run.device,
        on_step=on_step,
        should_stop=_stop_check(model, task, run, note),
    )
    note(
        f"trained {trained.steps_done} steps in {trained.seconds:.1f}s, final loss "
        f"{trained.final_loss:.4f}"
    )
    return {
        "train_losses": trained.losses,
        "train_seconds": trained.seconds,
        "train_loss_final": trained.final_loss,
        "steps_done": trained.steps_done,
        "steps_to_threshold": trained.steps_to_threshold,
    }


def _learned(
    measurements: list[dict[str, Any]], task: Task, note: Callable[[str], None]
) -> dict[str, Any]:
    """Whether the run learned its task in distribution: mean exact match at the lengths up to
    the longest training length against UNDERTRAINED_BELOW, or, for a task with a loss floor,
    the mean loss above the floor against UNLEARNED_EXCESS, or, for real text, the loss over
    the whole held-out text against the task's learned_loss_below (the report's same rules)."""

    def in_distribution(metric: str) -> list[float]:
        return [
            m["value"]
            for m in measurements
            if m["metric"] == metric
            and m["mem_len"] is None
            and m["eval_len"] is not None
            and m["eval_len"] <= task.train_lengths[1]
            and not math.isnan(m["value"])
        ]

    exact = in_distribution("exact_match")
    out: dict[str, Any] = {
        "in_distribution_exact_match": sum(exact) / len(exact) if exact else None
    }
    out["undertrained"] = bool(exact) and out["in_distribution_exact_match"] < UNDERTRAINED_BELOW
    excess = in_distribution("excess_loss")
    if excess:
        out["in_distribution_excess"] = sum(excess) / len(excess)
        out["undertrained"] = out["in_distribution_excess"] > UNLEARNED_EXCESS
        if out["undertrained"]:
            note(
                "did not learn the language: in-distribution loss "
                f"{out['in_distribution_excess']:.3f} nats above "
                f"the floor (limit {UNLEARNED_EXCESS})"
            )
    text = in_distribution("text_loss")
    if text and task.learned_loss_below is not None:
        out["in_distribution_text_loss"] = sum(text) / len(text)
        out["undertrained"] = out["in_distribution_text_loss"] >= task.learned_loss_below
        if out["undertrained"]:
            note(
                "did not learn the text: in-distribution loss "
                f"{out['in_distribution_text_loss']:.3f} nats per token, not below "
                f"{task.learned_loss_below} (a bigram model's)"
            )
    return out


def _draw_pictures(
    model: Decoder,
    task: Task,
    run: RunConfig,
    probes: list[dict[str, Any]],
    result: dict[str, Any],
    artifacts: dict[str, bytes],
    note: Callable[[str], None],
) -> None:
    """The bias picture, score-term probes and attention mass by distance, into `artifacts`;
    a picture that fails is noted, never worth the run."""
    try:
        bias = _bias_artifact(model, task, run.device)
        artifacts |= bias
        result["bias_picture"] = next(iter(bias), "none")
    except Exception as err:
        note(f"bias picture failed ({type(err).__name__}: {err}); the report shows none")
    try:
        artifacts |= _diagnostic_artifacts(model, task, run, probes)
        if probes:  # none when the job evaluates a model trained before without its probes
            result["health_flags"] = diagnostics.health_flags(
                pd.DataFrame(probes),
                run.encoding.display(),
                any(p.requires_grad for p in model.encoding.parameters()),
            )
    except Exception as err:
        note(f"diagnostics failed ({type(err).__name__}: {err})")


def _reachability(
    model: Decoder, task: Task, run: RunConfig
) -> tuple[pd.DataFrame, list[dict[str, Any]], list[str]]:
    """Which indexed rows training reaches and each evaluation length reads (the stored
    table), the share of pairs reading an untrained row per length (tidy rows, metric
    ``untrained_share``), and one message per table with rows read but never trained."""
    segment = run.train.train_segment_len or run.train.train_mem_len
    frame = reachability.reachability(model.encoding, task, segment, run.train.train_mem_len)
    if frame.empty:
        return frame, [], []
    rows = [
        {
            "eval_len": n,
            "position": None,
            "mem_len": None,
            "seq_len": None,
            "metric": "untrained_share",
            "value": share,
            "note": "",
        }
        for n, share in sorted(reachability.untrained_share(frame).items())
    ]
    missing = reachability.unreached(
        model.encoding, task, run.encoding.display(), frame, segment, run.train.train_mem_len
    )
    return frame, rows, [m.message() for m in missing]


def _bias_artifact(model: Decoder, task: Task, device: str) -> dict[str, bytes]:
    """What the encoding adds to the first layer's logits at the longest training length, on
    16 fixed inputs, as a .npy file ({} for encodings that add no bias)."""
    tokens = task.batch(task.train_lengths[1], 16, torch.Generator().manual_seed(0)).tokens.to(
        device
    )
    bias = positional_bias(model, tokens)
    if bias is None:
        return {}
    buffer = io.BytesIO()
    np.save(buffer, bias.cpu().numpy(), allow_pickle=False)
    return {BIAS_FILE: buffer.getvalue()}


#: Score-term probes per run: after the first step and every tenth of the step cap.
PROBE_POINTS = 10


def _diagnostic_artifacts(
    model: Decoder, task: Task, run: RunConfig, probes: list[dict[str, Any]]
) -> dict[str, bytes]:
    """The probes taken during training (none when only evaluating a stored model) and the
    attention mass by key distance at the longest training length and at the first evaluation
    length of at least twice it (or the longest the encoding can represent)."""
    files = {TERMS_FILE: pd.DataFrame(probes).to_csv(index=False).encode()} if probes else {}
    lo, hi = task.train_lengths
    beyond = [
        n
        for n in task.eval_lengths
        if n >= 2 * hi and not model.encoding.supports(Span(0, task.sequence_length(n)))
    ]
    rows = []
    for kind, length, source in (
        ("in distribution", hi, task),
        ("beyond", beyond[0] if beyond else None, task.for_evaluation()),
    ):
        if length is None:
            continue
        tokens = source.batch(
            length, diagnostics.PROBE_SAMPLES, torch.Generator().manual_seed(1)
        ).tokens.to(run.device)
        mass = diagnostics.attention_by_distance(model, tokens)
        rows += [
            {
                "kind": kind,
                "length": length,
                "tokens": tokens.shape[1],
                "distance": d,
                "mass": float(m),
            }
            for d, m in enumerate(mass.tolist())
        ]
    files[DISTANCE_FILE] = pd.DataFrame(rows).to_csv(index=False).encode()
    return files


def _stop_check(
    model: Decoder, task: Task, run: RunConfig, note: Callable[[str], None]
) -> Callable[[int], bool] | None:
    """Early stopping, when the run asks for it: on held-out in-distribution exact match at the
    lengths the evaluation reports (training stops once the score's 95% lower bound reaches
    stop_at), or, for a task with a loss floor, on held-out loss within stop_within nats of it."""
    if run.train.stop_within is not None and task.loss_floor(task.train_lengths[1]) is not None:

        def near_floor(steps: int) -> bool:
            excess = validation_excess(model, task, run.eval, run.device)
            note(
                f"step {steps}: held-out in-distribution loss {excess:.3f} nats above the floor "
                f"(stop within {run.train.stop_within})"
            )
            return excess <= run.train.stop_within

        return near_floor
    if run.train.stop_at is None or not task.exact_match_meaningful:
        return None

    def check(steps: int) -> bool:
        score, lower = validation_exact_match(model, task, run.eval, run.device)
        note(
            f"step {steps}: held-out in-distribution exact match {score:.3f} (95% lower bound "
            f"{lower:.3f}; "
            f"stop at {run.train.stop_at})"
        )
        return lower >= run.train.stop_at

    return check


def _training_rows(result: dict[str, Any], run: RunConfig) -> list[dict[str, Any]]:
    """What training measured, as tidy rows: the final loss, the model's parameter count and,
    with early stopping, the steps it took to reach the threshold (NaN with a note when the
    cap came first)."""
    empty = {"eval_len": None, "position": None, "mem_len": None, "seq_len": None, "note": ""}
    rows = [
        empty | {"metric": "train_loss_final", "value": result["train_loss_final"]},
        empty | {"metric": "parameters", "value": result["parameters"]},
    ]
    if run.train.stop_at is not None or run.train.stop_within is not None:
        reached = result.get("steps_to_threshold")
        rows.append(
            empty
            | {
                "metric": "steps_to_threshold",
                "value": float("nan") if reached is None else reached,
                "note": ""
                if reached is not None
                else f"not reached within {run.train.steps} steps",
            }
        )
    return rows


def failed_output(job: RunJob, error: str) -> RunOutput:
    """The record of a run whose worker died or was lost."""
    run = job.run
    return RunOutput(
        job.run_id,
        run.to_dict(),
        {},
        [error],
        [],
        None,
        {
            "encoding_label": run.encoding.display(),
            "task_label": run.task.display(),
            "status": "error",
            "error": error,
        },
    )
