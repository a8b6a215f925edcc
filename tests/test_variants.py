"""Evaluation-time variants: one trained model evaluated under other encoding options."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers import tiny_sweep
from posbench.errors import ConfigError, OptionError
from posbench.experiment.config import EncodingSpec
from posbench.experiment.variants import parse_variants
from posbench.experiment.runner import run_sweep
from posbench.experiment.planner import expand_runs, variant_jobs
from posbench.report.html import build_report
from posbench.store import collect

SCALINGS = (
    "rope:scaling=linear,factor=4;rope:scaling=ntk,factor=4;"
    "rope:scaling=yarn,factor=4;rope:scaling=llama3,factor=4"
)


def test_variants_parse_from_the_command_line_form() -> None:
    specs = parse_variants("rope:scaling=yarn,factor=4; rope:scaling=ntk,factor=2.5,beta_fast=16")
    assert specs == (
        EncodingSpec("rope", {"scaling": "yarn", "factor": 4}),
        EncodingSpec("rope", {"scaling": "ntk", "factor": 2.5, "beta_fast": 16}),
    )
    with pytest.raises(ConfigError, match="'factor' in 'rope:factor' is not key=value"):
        parse_variants("rope:factor")


def test_a_trained_rope_model_evaluated_under_four_scalings(tmp_path: Path) -> None:
    sweep = dataclasses.replace(
        tiny_sweep("nope", "rope", steps=5), eval_variants=parse_variants(SCALINGS)
    )
    outcome = run_sweep(sweep, tmp_path / "sweep")
    assert not outcome.failures
    frame = collect(tmp_path / "sweep")
    labels = set(frame["encoding_label"])
    assert {
        "rope [eval scaling=linear,factor=4]",
        "rope [eval scaling=ntk,factor=4]",
        "rope [eval scaling=yarn,factor=4]",
        "rope [eval scaling=llama3,factor=4]",
    } <= labels
    jobs = variant_jobs(sweep, expand_runs(sweep))
    yarn = next(j for j in jobs if j.variant.options["scaling"] == "yarn")
    stored = json.loads((tmp_path / "sweep" / yarn.run_id / "config.json").read_text())
    assert stored["kind"] == "variant" and stored["variant_of"] == yarn.base.run_id
    assert not (
        tmp_path / "sweep" / yarn.run_id / "model.pt"
    ).exists()  # no retraining, no second model
    variant_rows = frame[
        (frame["encoding_label"] == "rope [eval scaling=yarn,factor=4]")
        & (frame["metric"] == "loss")
        & frame["mem_len"].isna()
    ]
    assert len(variant_rows) == 3 and variant_rows["value"].notna().all()
    rerun = run_sweep(sweep, tmp_path / "sweep")
    assert yarn.run_id in rerun.skipped and not rerun.ran
    report = build_report(tmp_path / "sweep", tmp_path / "report")
    html = report.html.read_text()
    assert "rope [eval scaling=yarn,factor=4]" in html


def test_variants_must_name_a_trained_encoding_and_valid_options(tmp_path: Path) -> None:
    sweep = dataclasses.replace(
        tiny_sweep("nope", "rope"), eval_variants=parse_variants("t5:num_buckets=8")
    )
    with pytest.raises(ConfigError, match="names no encoding this sweep trains, by name or label"):
        run_sweep(sweep, tmp_path / "a")
    sweep = dataclasses.replace(
        tiny_sweep("nope", "rope"), eval_variants=parse_variants("rope:scaling=warp")
    )
    with pytest.raises(OptionError, match="option 'scaling' must be one of"):
        run_sweep(sweep, tmp_path / "b")


def test_a_variant_is_evaluated_again_when_its_base_model_changes(tmp_path: Path) -> None:
    """A variant describes the weights it read: it is evaluated again with its base run when
    the base trains again, and when its base holds other weights than it read."""
    from posbench.experiment.planner import RUN, STORED, plan_sweep
    from posbench.store import RunFolder

    sweep = dataclasses.replace(
        tiny_sweep("rope", steps=3), eval_variants=parse_variants("rope:scaling=linear,factor=2")
    )
    out = tmp_path / "sweep"
    assert not run_sweep(sweep, out).failures
    plan = plan_sweep(sweep, out)
    (variant,) = [job for job in plan.jobs if job.kind == "variant"]
    base = variant.work.base.run_id
    record = RunFolder(out / variant.run_id).result()
    assert record["evaluated_model"] == RunFolder(out / base).model_digest()
    assert all(job.action == STORED for job in plan.jobs)

    result_file = out / variant.run_id / "result.json"  # as if the base was trained again since
    result_file.write_text(json.dumps(record | {"evaluated_model": "0" * 64}))
    (again,) = [job for job in plan_sweep(sweep, out).jobs if job.kind == "variant"]
    assert again.action == RUN and "other weights than its base run" in again.reason

    (out / base / "result.json").unlink()  # the base trains again: the variant after it
    (again,) = [job for job in plan_sweep(sweep, out).jobs if job.kind == "variant"]
    assert again.action == RUN and again.needs == (base,) and "trains again" in again.reason
    assert not run_sweep(sweep, out).failures
    assert RunFolder(out / variant.run_id).result()["evaluated_model"] == (
        RunFolder(out / base).model_digest()
    )
