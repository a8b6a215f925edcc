"""Evaluation-time variants: a trained run evaluated again with other encoding options (RoPE
scaled by YaRN at factor 4, say), without retraining, and stored as a run of its own whose
label names the variant. The practitioner's question "which context-extension method, at
what factor?" is then rows in results.csv and lines beside the base model in the report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from posbench.errors import ConfigError
from posbench.experiment.config import (
    EncodingSpec,
    RunConfig,
    config_id,
    parse_specs,
    run_label,
    to_jsonable,
)


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
    """One run (`base`) to evaluate again under `variant`'s options; `derived` holds the options
    the planner filled from the base run (the length it was trained on)."""

    base: RunConfig
    variant: EncodingSpec
    derived: Mapping[str, Any] = field(default_factory=dict)

    @property
    def encoding(self) -> EncodingSpec:
        """The base encoding with the variant's options, and those derived from the base, over
        its own, labelled as a variant."""
        options = {**self.base.encoding.options, **self.variant.options, **self.derived}
        return EncodingSpec(
            self.base.encoding.name, options, variant_label(self.base.encoding, self.variant)
        )

    def config(self) -> dict[str, Any]:
        """The stored config: the base run's, with the variant's encoding as written, its base
        named, and the options derived from the base under `derived` (the run id leaves them
        out: they follow from the base run the config names)."""
        data = self.base.to_dict()
        written = {**self.base.encoding.options, **self.variant.options}
        encoding = EncodingSpec(self.base.encoding.name, written, self.encoding.label)
        data["encoding"] = to_jsonable(dataclasses.asdict(encoding))
        data |= {"kind": "variant", "variant_of": self.base.run_id}
        if self.derived:
            data["derived"] = to_jsonable(dict(self.derived))
        return data

    @property
    def run_id(self) -> str:
        return config_id(self.config())

    @property
    def label(self) -> str:
        return run_label(self.base.task_display, self.encoding.display(), self.base.seed)
