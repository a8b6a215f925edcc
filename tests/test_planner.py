"""The plan: what `posbench run --dry-run` prints is what `posbench run` executes, every job
resolved (options, id, needs, reuse) before anything runs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from helpers import invoke, tiny_sweep, write_config
from posbench.experiment.config import EncodingSpec, TaskSpec
from posbench.experiment.planner import (
    AFTER_TWIN,
    RUN,
    STORED,
    TRAIN,
    VARIANT,
    plan_sweep,
)
from posbench.experiment.runner import run_sweep
from posbench.experiment.variants import VariantJob, parse_variants
from posbench.store import RunFolder

COPY = {"train_lengths": [1, 3], "eval_lengths": [2, 3, 6]}


def _sweep():
    """Two encodings, a RoPE variant, and a fixed-budget task whose early-stopping twin never
    stops in 20 steps (so the fixed one takes its model)."""
    return dataclasses.replace(
        tiny_sweep("nope", "rope", steps=20),
        tasks=(
            TaskSpec("copy", COPY, {"stop_at": 1.0, "check_every": 10}),
            TaskSpec("copy", COPY, label="copy-fixed"),
        ),
        eval_variants=parse_variants("rope:scaling=dynamic,factor=2"),
    )


def test_the_run_executes_the_plan_its_dry_run_prints(tmp_path: Path) -> None:
    out = tmp_path / "s"
    plan = plan_sweep(_sweep(), out)
    actions = {(job.kind, job.action) for job in plan.jobs}
    assert actions == {(TRAIN, RUN), (TRAIN, AFTER_TWIN), (VARIANT, RUN)}, actions
    fixed = [job for job in plan.jobs if job.action == AFTER_TWIN]
    assert len(fixed) == 2 and all(job.twin.run_id in job.needs for job in fixed)
    variants = [job for job in plan.jobs if job.kind == VARIANT]
    assert len(variants) == 2 and all(job.needs == (job.work.base.run_id,) for job in variants)

    outcome = run_sweep(_sweep(), out)
    assert outcome.plan == plan.rows()
    assert sorted(outcome.ran) == sorted(job.run_id for job in plan.jobs if job.to_run)
    assert sorted(outcome.took_twin_model) == sorted(job.run_id for job in fixed)
    assert not outcome.failures and not outcome.missing
    assert set(json.loads((out / "sweep.json").read_text())["runs"]) == set(plan.members())

    again = plan_sweep(_sweep(), out)
    assert {job.action for job in again.jobs} == {STORED}
    resumed = run_sweep(_sweep(), out)
    assert resumed.ran == [] and sorted(resumed.skipped) == sorted(plan.members())


def test_a_variant_stores_the_options_derived_from_its_base_and_keeps_its_id(
    tmp_path: Path,
) -> None:
    """Dynamic NTK needs the length the model trained on: the plan fills it from the base run,
    the stored config says so, and the id is the one written before the fill was planned."""
    plan = plan_sweep(_sweep(), tmp_path / "s")
    job = next(job for job in plan.jobs if job.kind == VARIANT)
    assert dict(job.work.derived) == {"original_length": 6}  # copy: 3 symbols, 3 answers
    assert job.work.encoding.options["original_length"] == 6
    assert job.run_id == VariantJob(job.work.base, job.work.variant).run_id
    config = job.work.config()
    assert config["derived"] == {"original_length": 6}
    assert "original_length" not in config["encoding"]["options"]


def test_a_damaged_run_is_planned_to_be_set_aside_and_redone(tmp_path: Path) -> None:
    out = tmp_path / "s"
    first = run_sweep(tiny_sweep("nope", "rope"), out)
    damaged = RunFolder(out / first.ran[0])
    (damaged.path / "measurements.csv").write_text("broken\n")
    plan = plan_sweep(tiny_sweep("nope", "rope"), out)
    (job,) = [job for job in plan.jobs if job.run_id == damaged.run_id]
    assert job.action == RUN and "measurements.csv" in job.damage
    assert "set aside" in job.row()[3]
    outcome = run_sweep(tiny_sweep("nope", "rope"), out)
    assert outcome.ran == [job.run_id] and job.label in outcome.set_aside


def test_the_dry_run_prints_every_job_with_its_action_and_writes_nothing(
    tmp_path: Path,
) -> None:
    from helpers import TINY_TOML

    variant = 'eval_variants = [{ name = "rope", scaling = "dynamic", factor = 2 }]'
    toml = TINY_TOML.replace('"nope",', '"nope", "rope",').replace(
        "seeds = [0]", f"seeds = [0]\n{variant}"
    )
    config, out = write_config(tmp_path, toml), tmp_path / "out"
    printed = invoke("run", "--config", str(config), "--out", str(out), "--dry-run")
    assert printed.exit_code == 0, printed.output
    assert not out.exists()
    from posbench.experiment.config import load_config_file

    plan = plan_sweep(load_config_file(config)[0], out)
    lines = printed.output.splitlines()
    for kind, label, run_id, action in plan.rows():
        (line,) = [line for line in lines if run_id in line]
        assert kind in line and label in line and action.split(":")[0] in line, line
    assert "3 training run(s), 0 stored already; 1 evaluation variant(s)" in printed.output
    assert "4 job(s) to run" in printed.output


def test_an_encoding_entry_with_a_variant_label_is_planned_under_that_label(
    tmp_path: Path,
) -> None:
    sweep = dataclasses.replace(
        tiny_sweep("nope"),
        encodings=(EncodingSpec("rope", label="r"),),
        eval_variants=parse_variants("r:scaling=dynamic,factor=2,label=r-ntk"),
    )
    (variant,) = [job for job in plan_sweep(sweep, tmp_path / "s").jobs if job.kind == VARIANT]
    assert variant.label == "copy / r-ntk / seed 0"


def test_variants_are_computed_by_the_executor_right_after_their_base(tmp_path: Path) -> None:
    """The driver hands a variant to the same executor run as soon as its base is stored."""
    from posbench.experiment.executors import LocalExecutor

    class Recording(LocalExecutor):
        def __init__(self) -> None:
            self.computed: list[str] = []
            self.calls = 0

        def map(self, jobs, threads, reporter, plugin_dirs):
            self.calls += 1
            outputs = super().map(jobs, threads, reporter, plugin_dirs)
            added = None
            while True:
                try:
                    output = outputs.send(added)
                except StopIteration:
                    return
                self.computed.append(output.result["encoding_label"])
                added = yield output

    sweep = dataclasses.replace(
        tiny_sweep("rope", "nope"), eval_variants=parse_variants("rope:scaling=linear,factor=2")
    )
    executor = Recording()
    outcome = run_sweep(sweep, tmp_path / "s", executor=executor)
    assert executor.calls == 1 and not outcome.failures
    assert executor.computed == ["rope", "rope [eval scaling=linear,factor=2]", "nope"]
