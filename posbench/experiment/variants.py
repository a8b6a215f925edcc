"""Evaluation-time variants: a trained run evaluated again with other encoding options (RoPE
scaled by YaRN at factor 4, say), without retraining, and stored as a run of its own whose
label names the variant. The practitioner's question "which context-extension method, at
what factor?" is then rows in results.csv and lines beside the base model in the report."""
from __future__ import annotations

import dataclasses
import inspect
import io
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posbench.encodings import REGISTRY as ENCODINGS
from posbench.experiment.compute import build_model
from posbench.experiment.config import EncodingSpec, RunConfig, SweepConfig, config_id, to_jsonable, variant_label
from posbench.experiment.evaluation import iter_evaluate
from posbench.store import RunFolder, environment
from posbench.tasks import create_task

#: An option a variant may leave out: filled with the length the model was trained on (in tokens).
TRAINED_LENGTH_OPTION = "original_length"


@dataclass(frozen=True)
class VariantJob:
    """One finished run (`base`) to evaluate again under `variant`'s options."""

    base: RunConfig
    variant: EncodingSpec

    @property
    def encoding(self) -> EncodingSpec:
        """The base encoding with the variant's options over its own, labelled as a variant."""
        options = {**self.base.encoding.options, **self.variant.options}
        return EncodingSpec(self.base.encoding.name, options, variant_label(self.base.encoding, self.variant))

    def config(self) -> dict[str, Any]:
        data = self.base.to_dict()
        data["encoding"] = to_jsonable(dataclasses.asdict(self.encoding))
        return data | {"kind": "variant", "variant_of": self.base.run_id}

    @property
    def run_id(self) -> str:
        return config_id(self.config())

    def label(self) -> str:
        return f"{self.base.task.display()} / {self.encoding.display()} / seed {self.base.seed}"


def variant_jobs(sweep: SweepConfig, runs: list[RunConfig]) -> list[VariantJob]:
    """Every run of an encoding a variant names, under each such variant."""
    return [VariantJob(run, variant) for run in runs for variant in sweep.eval_variants if variant.name == run.encoding.name]


def evaluate_variant(job: VariantJob, out_dir: Path, force: bool = False) -> tuple[str, bool]:
    """Evaluate the base run's stored model under the variant and store it; returns the run id
    and whether it was computed (False: already finished, or the base run is not)."""
    folder, base = RunFolder(out_dir / job.run_id), RunFolder(out_dir / job.base.run_id)
    if (folder.is_finished() and not force) or not base.is_finished():
        return job.run_id, False
    run, spec = job.base, job.encoding
    start = time.perf_counter()
    log = [f"{time.strftime('%Y-%m-%dT%H:%M:%S')} variant {job.run_id}: {job.label()}, the model of run {run.run_id}"]
    result: dict[str, Any] = {"encoding_label": spec.display(), "task_label": run.task.display(), "quick": run.quick,
                              "variant_of": run.run_id}
    measurements: list[dict[str, Any]] = []
    try:
        task = create_task(run.task.name, **run.task.options)
        result["train_len_max"] = task.train_lengths[1]
        options = dict(spec.options)
        accepted = inspect.signature(ENCODINGS.get(spec.name)).parameters
        if TRAINED_LENGTH_OPTION in accepted and TRAINED_LENGTH_OPTION not in options:
            options[TRAINED_LENGTH_OPTION] = task.sequence_length(task.train_lengths[1])
            log.append(f"{TRAINED_LENGTH_OPTION} = {options[TRAINED_LENGTH_OPTION]} (the longest training sequence)")
        model = build_model(run.model, dataclasses.replace(spec, options=options), task)
        state = torch.load(io.BytesIO((base.path / "model.pt").read_bytes()), map_location="cpu", weights_only=True)
        model.load_state_dict(state)
        model.to(run.device)
        measurements = [m.__dict__ | {"seq_len": None, "cache_len": None} for m in iter_evaluate(model, task, run.eval, run.device)]
        result["status"] = "ok"
    except Exception as err:  # one variant's failure must not stop the sweep
        result["status"], result["error"] = "error", f"{type(err).__name__}: {err}"
        log.append(traceback.format_exc())
    result["seconds"] = time.perf_counter() - start
    folder.store(job.config(), environment(run.device), log, result, measurements if result["status"] == "ok" else None)
    return job.run_id, True
