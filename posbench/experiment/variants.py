"""Evaluation-time variants: a trained run evaluated again with other encoding options (RoPE
scaled by YaRN at factor 4, say), without retraining, and stored as a run of its own whose
label names the variant. The practitioner's question "which context-extension method, at
what factor?" is then rows in results.csv and lines beside the base model in the report."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbench.encodings import REGISTRY as ENCODINGS
from posbench.errors import ConfigError
from posbench.experiment.compute import RunJob, compute_run
from posbench.experiment.config import (
    EncodingSpec,
    RunConfig,
    SweepConfig,
    config_id,
    parse_specs,
    run_label,
    to_jsonable,
)
from posbench.store import RunFolder
from posbench.tasks import create_task


def parse_variants(text: str) -> tuple[EncodingSpec, ...]:
    """``--eval-variants``: ``'rope:scaling=yarn,factor=4;rope:scaling=ntk,factor=4'`` (see
    config.parse_specs)."""
    specs = parse_specs(text, "--eval-variants")
    if not specs:
        raise ConfigError(
            "--eval-variants names no variant; write e.g. 'rope:scaling=yarn,factor=4'."
        )
    return specs


def variant_applies(variant: EncodingSpec, spec: EncodingSpec) -> bool:
    """A variant names the encodings it re-evaluates by name (every entry of it) or by label."""
    return variant.name in (spec.name, spec.label)


def variant_label(base: EncodingSpec, variant: EncodingSpec) -> str:
    """How a run evaluated under a variant is named: the variant's label, or the base's label
    with the variant's options, e.g. ``rope [eval scaling=yarn,factor=4]``."""
    if variant.label:
        return variant.label
    options = ",".join(f"{k}={v}" for k, v in variant.options.items())
    return f"{base.display()} [eval {options}]"


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
        return EncodingSpec(
            self.base.encoding.name, options, variant_label(self.base.encoding, self.variant)
        )

    def config(self) -> dict[str, Any]:
        data = self.base.to_dict()
        data["encoding"] = to_jsonable(dataclasses.asdict(self.encoding))
        return data | {"kind": "variant", "variant_of": self.base.run_id}

    @property
    def run_id(self) -> str:
        return config_id(self.config())

    @property
    def label(self) -> str:
        return run_label(self.base.task_display, self.encoding.display(), self.base.seed)


def variant_jobs(sweep: SweepConfig, runs: list[RunConfig]) -> list[VariantJob]:
    """Every run of an encoding a variant names, under each such variant."""
    return [
        VariantJob(run, variant)
        for run in runs
        for variant in sweep.eval_variants
        if variant_applies(variant, run.encoding)
    ]


def evaluate_variant(
    job: VariantJob, out_dir: Path, force: bool = False, threads: int | None = None
) -> tuple[str, bool]:
    """Evaluate the base run's stored model under the variant, through the same computation
    as any run that reuses a trained model, and store it without a second copy of the model;
    returns the run id and whether it was computed (False: already finished, or the base run is
    not)."""
    folder, base = RunFolder(out_dir / job.run_id), RunFolder(out_dir / job.base.run_id)
    if (folder.is_finished() and not force) or not base.is_finished():
        return job.run_id, False
    task = create_task(job.base.task.name, **job.base.task.options)
    options = dict(job.encoding.options)
    if TRAINED_LENGTH_OPTION in inspect.signature(ENCODINGS.get(job.encoding.name)).parameters:
        options.setdefault(
            TRAINED_LENGTH_OPTION, task.sequence_length(task.train_lengths[1])
        )  # the longest training sequence
    run = dataclasses.replace(job.base, encoding=dataclasses.replace(job.encoding, options=options))
    reuse = RunJob(
        run,
        base.model_bytes(),
        base.result() or {},
        reused=f"run {job.base.run_id} trained, under evaluation-time variant options",
    )
    output = compute_run(reuse, threads)
    output.result["variant_of"] = job.base.run_id
    ok = output.status == "ok"
    folder.store(
        job.config(),
        output.env,
        output.log,
        output.result,
        output.measurements if ok else None,
        None,
        output.artifacts if ok else None,
    )
    return job.run_id, True
