"""Shipped suites: each loads and validates; `--suite` runs one; per-task training settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posbench.cli import app
from posbench.experiment.config import RunConfig, apply_overrides, load_config_file
from posbench.experiment.planner import expand_runs
from posbench.experiment.planner import resolve_sweep
from posbench.suites import list_suites, suite_file


@pytest.mark.parametrize("name", list(list_suites()))
def test_every_shipped_suite_loads_and_validates(name: str) -> None:
    sweep, stated_name = load_config_file(suite_file(name))
    assert stated_name == name and sweep.about
    resolved = resolve_sweep(sweep)
    runs = expand_runs(resolved)
    assert runs and all(r.model.d_model // r.model.n_heads >= 16 for r in runs)  # d_head >= 16
    assert list_suites()[name].endswith(".")  # a whole sentence, over lines if need be


def test_the_standard_suite_is_the_published_protocol() -> None:
    sweep, _ = load_config_file(suite_file("standard"))
    assert len(sweep.seeds) >= 5  # fewer cannot reach a verdict under the calibrated rule
    copy = next(r for r in expand_runs(resolve_sweep(sweep)) if r.task.name == "copy")
    assert copy.train.stop_at and copy.train.steps >= 5000
    assert max(copy.task.options["eval_lengths"]) >= 4 * copy.task.options["train_lengths"][1]


@pytest.mark.parametrize("name", ["kazemnejad", "deepmind", "deepmind-decoder", "randomized"])
def test_suites_posed_as_a_papers_state_how_they_differ_from_it(name: str) -> None:
    sweep, _ = load_config_file(suite_file(name))
    assert len(sweep.differences) >= 3
    assert all(item.endswith(".") and " their" in item for item in sweep.differences)


def test_differences_must_be_a_list_of_sentences(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text('differences = [1, 2]\ntasks = ["copy"]\n')
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--dry-run"])
    assert result.exit_code == 2
    assert "option 'differences' must be a list of strings, got [1, 2]" in result.output


def test_task_training_settings_and_flags_that_override_them(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text(
        'tasks = [{ name = "copy", train = { steps = 400, lr = 0.01 } }, '
        '"reverse"]\n[train]\nsteps = 90\n'
    )
    sweep, _ = load_config_file(config)
    steps = {r.task.name: (r.train.steps, r.train.lr) for r in expand_runs(resolve_sweep(sweep))}
    assert steps == {"copy": (400, 0.01), "reverse": (90, 3e-3)}
    flagged = apply_overrides(sweep, steps=7)
    assert {r.train.steps for r in expand_runs(resolve_sweep(flagged))} == {7}
    quick = apply_overrides(sweep, quick=True)
    assert {r.task.name: r.train.steps for r in expand_runs(resolve_sweep(quick))} == {
        "copy": 200,
        "reverse": 90,
    }  # --quick caps them at QUICK_STEPS


def test_bad_task_training_settings_and_unknown_suites_are_one_sentence(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text('tasks = [{ name = "copy", train = { stepz = 40 } }]\n')
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Unknown key 'stepz'" in result.output
    result = CliRunner().invoke(app, ["run", "--suite", "nonesuch", "--out", str(tmp_path / "o")])
    assert (
        result.exit_code == 2
        and "Unknown suite 'nonesuch'; "
        "available: deepmind, deepmind-decoder, default, kazemnejad, lr-probe, nanogpt-anchor, "
        "randomized, scale, standard"
        in result.output
    )
    listed = CliRunner().invoke(app, ["list"])
    assert "standard" in listed.output and "Suites" in listed.output


def test_one_task_twice_needs_labels_that_name_results_but_not_run_ids(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text(
        'tasks = ["lookback", { name = "lookback", label = "lookback-far", lag = 20 }]\n'
    )
    sweep, _ = load_config_file(config)
    runs = expand_runs(resolve_sweep(sweep))
    assert {r.task.display() for r in runs} == {"lookback", "lookback-far"}
    unlabelled = dataclasses.replace(runs[-1], task=dataclasses.replace(runs[-1].task, label=""))
    assert unlabelled.run_id == runs[-1].run_id  # the label names results; it does not change them
    assert RunConfig.from_dict(runs[-1].to_dict()).task.display() == "lookback-far"
    config.write_text('tasks = ["lookback", { name = "lookback", lag = 20 }]\n')
    result = CliRunner().invoke(app, ["run", "--config", str(config), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert (
        "lists task 'lookback' more than once with the same label; give each entry its own 'label'"
        in result.output
    )


@pytest.mark.parametrize("name", ["default", "standard", "randomized", "scale", "deepmind", "text"])
def test_published_suites_train_every_parameter_they_evaluate(name: str) -> None:
    """Only the learned table (its untrained rows are the encoding's expected failure) and T5
    kept at its paper defaults under its own label may read rows training never reached."""
    from posbench.experiment.planner import reachability_warnings

    sweep = resolve_sweep(load_config_file(suite_file(name))[0])
    for warning in reachability_warnings(sweep):
        assert ": learned: " in warning or ": t5-paper: " in warning, warning


def test_standard_suite_compares_at_equal_accuracy_and_equal_compute() -> None:
    runs = expand_runs(resolve_sweep(load_config_file(suite_file("standard"))[0]))
    fixed = [r for r in runs if r.task.display() == "copy-fixed"]
    assert fixed and all(
        r.train.stop_at is None and r.train.steps == fixed[0].train.steps for r in fixed
    )
    assert {r.encoding.display() for r in runs if r.task.display() == "copy"} == {
        r.encoding.display() for r in fixed
    }
    assert all(r.train.stop_within for r in runs if r.task.display() == "lm")


def test_flags_select_a_suites_entries_by_label_before_name() -> None:
    """--tasks copy on a suite with copy and copy-fixed runs copy, not whichever came last."""
    standard, _ = load_config_file(suite_file("standard"))
    picked = apply_overrides(standard, tasks="copy", encodings="t5")
    assert [t.display() for t in picked.tasks] == ["copy"]
    assert [e.display() for e in picked.encodings] == ["t5"]
    picked = apply_overrides(standard, tasks="copy*", encodings="t5*,kerple_log")
    assert [t.display() for t in picked.tasks] == ["copy", "copy-fixed"]
    assert [e.display() for e in picked.encodings] == ["t5", "t5-paper", "kerple_log"]
    randomized, _ = load_config_file(suite_file("randomized"))
    assert [e.display() for e in apply_overrides(randomized, encodings="rope").encodings] == [
        "rope"
    ]
    twins = apply_overrides(randomized, encodings="*+random").encodings
    assert len(twins) == 5 and all(e.options["randomize_positions"] == 2048 for e in twins)


def test_an_unknown_flag_name_lists_the_suites_labels() -> None:
    from posbench.errors import UnknownNameError

    standard, _ = load_config_file(suite_file("standard"))
    with pytest.raises(UnknownNameError, match=r"Did you mean rope\?.*label.*t5-paper"):
        apply_overrides(standard, encodings="rope+random")


def test_narrowing_a_suites_encodings_drops_the_variants_of_the_others() -> None:
    standard, _ = load_config_file(suite_file("standard"))
    assert [v.label for v in standard.eval_variants] == ["sinusoidal-restart"]
    assert apply_overrides(standard, encodings="t5").eval_variants == ()
    kept = apply_overrides(standard, encodings="sinusoidal,t5").eval_variants
    assert [v.label for v in kept] == ["sinusoidal-restart"]
    resolve_sweep(apply_overrides(standard, encodings="t5", tasks="copy"))  # no error
