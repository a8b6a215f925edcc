"""The model-size axis: sizes listed in [model] expand the grid, every run records its size and
parameter count, tables keep sizes apart, and the scale section says whether the ranking holds."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from markupsafe import escape
from helpers import invoke, one_sentence_error, tidy, tiny_sweep, write_config
from posbench.errors import ConfigError, PosbenchError
from posbench.experiment.config import (
    ModelSize,
    config_from_mapping,
    model_sizes,
)
from posbench.experiment.planner import expand_runs, resolve_sweep
from posbench.report.html import REPORT_RECORD, build_report
from posbench.report.index import build_index
from posbench.report.scale import (
    ranks_by_size,
    scale_scores,
    scale_verdicts,
    tau_between,
    tau_cells,
    tau_table,
)
from posbench.report.summary import headline, sized_tasks
from posbench.store import collect

SIZES_TOML = """
tasks = [{ name = "copy", train_lengths = [1, 3], eval_lengths = [2, 3, 6] }]
encodings = ["nope", "rope"]
seeds = [0]
profile = false

[model]
d_model = [16, 32]
n_layers = [1, 2]
n_heads = 2

[train]
steps = 2
batch_size = 4
warmup_steps = 1

[eval]
n_samples = 8
batch_size = 8
"""


def test_listed_model_fields_expand_into_every_combination() -> None:
    sweep = config_from_mapping({"model": {"d_model": [16, 32], "n_layers": [1, 2], "n_heads": 2}})
    assert model_sizes(sweep) == (
        ModelSize(16, 1, 2),
        ModelSize(16, 2, 2),
        ModelSize(32, 1, 2),
        ModelSize(32, 2, 2),
    )
    assert sweep.model == ModelSize(16, 1, 2)
    single = config_from_mapping({"model": {"d_model": 16, "n_heads": 2}})
    assert single.sizes == () and model_sizes(single) == (ModelSize(16, 4, 2),)


def test_the_grid_runs_every_size_with_its_own_id() -> None:
    sweep = dataclasses.replace(
        tiny_sweep("nope", "rope", seeds=(0, 1)), sizes=(ModelSize(16, 1, 2), ModelSize(32, 1, 2))
    )
    runs = expand_runs(sweep)
    assert len(runs) == 2 * 2 * 2 and len({run.run_id for run in runs}) == 8
    assert {run.model.d_model for run in runs} == {16, 32}
    assert runs[0].model == runs[3].model == ModelSize(16, 1, 2)  # size outside encoding x seed
    assert len({run.label for run in runs}) == 8  # people tell the sizes apart
    assert runs[0].label == "copy @ d16 L1 H2 / nope / seed 0"
    assert "show_size" not in runs[0].to_dict()  # labels never change a run's id
    assert dataclasses.replace(runs[0], show_size=False).run_id == runs[0].run_id


@pytest.mark.parametrize(
    "model, fragment",
    [
        ({"d_model": [16, 0]}, "d_model"),
        ({"d_model": []}, "d_model = [] names no size"),
        ({"d_model": [16, 16]}, "lists a model size twice"),
    ],
)
def test_a_broken_size_list_is_one_sentence(model: dict, fragment: str) -> None:
    with pytest.raises(PosbenchError, match=re.escape(fragment)):
        config_from_mapping({"model": model})


def test_every_size_is_checked_before_anything_runs() -> None:
    sweep = config_from_mapping({"model": {"d_model": [16, 30], "n_heads": 4}})
    with pytest.raises(ConfigError, match="d_model=30 must be divisible by n_heads=4"):
        resolve_sweep(dataclasses.replace(sweep, tasks=tiny_sweep().tasks))


def test_a_sweep_of_two_sizes_stores_both_and_reports_them_apart(tmp_path: Path) -> None:
    config = write_config(tmp_path, SIZES_TOML)
    out = tmp_path / "sweep"
    result = invoke("run", "--config", str(config), "--out", str(out))
    assert result.exit_code == 0, result.output
    frame = collect(out)
    assert set(frame["model"]) == {"d16 L1 H2", "d16 L2 H2", "d32 L1 H2", "d32 L2 H2"}
    parameters = frame[frame["metric"] == "parameters"].groupby("model")["value"].first()
    assert parameters["d16 L1 H2"] < parameters["d16 L2 H2"] < parameters["d32 L2 H2"]
    sized = headline(sized_tasks(frame))
    assert set(sized["task"]) == {f"copy @ {m}" for m in frame["model"].unique()}
    assert "copy @ d32 L2 H2" in result.output  # the terminal table keeps sizes apart too
    report = build_report(out, tmp_path / "report")
    html = report.html.read_text()
    assert "Does the ranking hold as the model grows?" in html
    # each size says what it compares at: a fixed budget of 2 steps, no threshold
    assert "Compared at: copy @ d16 L1 H2: equal compute; copy @ d16 L2 H2: equal compute" in html
    results = pd.read_csv(report.results_csv)
    assert set(results["task"].dropna()) == {"copy"}  # the tidy task column is not relabelled
    # the front page reads the task's sentence from the report's record
    (sentence,) = json.loads((report.out_dir / REPORT_RECORD).read_text())["scale"]
    shown = str(escape(sentence))  # as the pages' templates escape it
    assert sentence.startswith("copy: ") and shown in html
    assert f"<th>across sizes</th><td>{shown}</td>" in build_index(tmp_path).read_text()


def _scores(order_small: list[str], order_large: list[str], spread: float) -> pd.DataFrame:
    """Constructed results: copy at two sizes; at each size the encodings' free-running token
    accuracy at 2x the training length (the headline) falls in the given order, each seed off by
    up to `spread`, while whole answers there all fail (exact match 0, which ranks nothing)."""
    rng = np.random.default_rng(0)
    rows = []
    for model, order, parameters in (
        ("d16 L1 H2", order_small, 1000),
        ("d64 L1 H2", order_large, 16000),
    ):
        for position, label in enumerate(order):
            for seed in range(3):
                common = {"task": "copy", "encoding": label, "encoding_label": label}
                common |= {"seed": seed, "model": model, "train_len_max": 8}
                value = 0.9 - 0.15 * position + rng.uniform(-spread, spread)
                rows.append(
                    common | {"eval_len": 16, "metric": "greedy_token_accuracy", "value": value}
                )
                rows.append(common | {"eval_len": 16, "metric": "exact_match", "value": 0.0})
                rows.append(common | {"eval_len": 4, "metric": "exact_match", "value": 1.0})
                rows.append(common | {"metric": "parameters", "value": parameters})
    return scale_scores(tidy(rows))


ENCODINGS = ["alibi", "t5", "nope", "rope", "sinusoidal"]


@pytest.mark.parametrize(
    "large, spread, verdict",
    [
        (ENCODINGS, 0.01, "holds"),
        (ENCODINGS[::-1], 0.01, "flips"),
        (ENCODINGS[::-1], 0.5, "not resolved"),
    ],
)
def test_the_verdict_follows_the_tau_interval(
    large: list[str], spread: float, verdict: str
) -> None:
    scores = _scores(ENCODINGS, large, spread)
    (found,) = scale_verdicts(tau_table(scores, replicates=200), scores)
    assert found.verdict == verdict, found
    assert found.small == "d16 L1 H2" and found.large == "d64 L1 H2" and found.encodings == 5
    assert f"Kendall's tau {found.tau:.2f}" in found.sentence()


def test_tau_is_one_for_the_same_order_and_minus_one_reversed() -> None:
    same = _scores(ENCODINGS, ENCODINGS, 0.0)
    tau, low, high, n = tau_between(same, "copy", "d16 L1 H2", "d64 L1 H2", replicates=50)
    assert (tau, low, high, n) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0), 5)
    reversed_ = _scores(ENCODINGS, ENCODINGS[::-1], 0.0)
    tau = tau_between(reversed_, "copy", "d16 L1 H2", "d64 L1 H2", replicates=50)[0]
    assert tau == pytest.approx(-1.0)


def test_ranks_per_size_and_runs_that_did_not_learn_are_left_out() -> None:
    scores = _scores(ENCODINGS, ENCODINGS[::-1], 0.0)
    ranks = ranks_by_size(scores).set_index(["model", "encoding_label"])["rank"]
    assert ranks[("d16 L1 H2", "alibi")] == 1 and ranks[("d64 L1 H2", "alibi")] == 5
    rows = [
        {"task": "copy", "encoding": "nope", "encoding_label": "nope", "seed": 0,
         "model": model, "train_len_max": 8, "eval_len": length, "metric": metric,
         "value": value}
        for model in ("d16 L1 H2", "d64 L1 H2")
        for length, metric, value in (
            (4, "exact_match", 0.2 if model == "d16 L1 H2" else 1.0),
            (16, "greedy_token_accuracy", 0.1),
        )
    ]  # fmt: skip
    scored = scale_scores(tidy(rows))
    assert list(scored["model"]) == ["d64 L1 H2"]  # 0.2 in distribution: not learned at d16


def test_one_size_has_no_scale_section() -> None:
    rows = [
        {"task": "copy", "encoding": "nope", "encoding_label": "nope", "seed": 0,
         "model": "d16 L1 H2", "train_len_max": 8, "eval_len": 16, "metric": "exact_match",
         "value": 0.5}
    ]  # fmt: skip
    assert scale_scores(tidy(rows)).empty
    assert sized_tasks(tidy(rows))["task"].tolist() == ["copy"]


def test_a_missing_interval_is_not_resolved() -> None:
    scores = _scores(ENCODINGS[:2], ENCODINGS[:2], 0.0)
    (found,) = scale_verdicts(tau_table(scores, replicates=20), scores)
    assert found.verdict == "not resolved" and "only 2 encoding(s)" in found.sentence()
    assert not math.isnan(found.tau)


def test_an_undefined_tau_says_why_in_its_cells() -> None:
    scores = _scores(ENCODINGS[:1], ENCODINGS[:1], 0.0)
    (row,) = tau_table(scores, replicates=20).itertuples()
    tau, interval = tau_cells(row.tau, row.low, row.high)
    assert tau == "undefined" and "fewer than 2 encodings" in interval
    assert tau_cells(0.5, 0.25, 0.75) == ("0.50", "[0.25, 0.75]")


def test_a_size_list_with_an_impossible_value_fails_on_the_command_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, SIZES_TOML.replace("d_model = [16, 32]", "d_model = [16, -4]"))
    result = invoke("run", "--config", str(config), "--out", str(tmp_path / "sweep"))
    one_sentence_error(result, "d_model")


def test_sizes_are_scored_by_the_overviews_headline() -> None:
    """The scale section ranks by what the overview ranks by: free-running token accuracy at
    2x for answers, minus the penalty at 2x for loss by position; seed by seed."""
    from posbench.report.overview import overview

    scores = _scores(ENCODINGS, ENCODINGS, 0.05)
    assert set(scores["scored_by"]) == {
        "free-running token accuracy at 2x the longest training length"
    }
    rows = []
    for model in ("d16 L1 H2", "d64 L1 H2"):
        for seed, penalty in enumerate((0.1, 0.2, 0.3)):
            common = {"task": "lm", "encoding": "alibi", "encoding_label": "alibi", "seed": seed}
            common |= {"model": model, "train_len_max": 32}
            for position, value in ((32, 0.0), (64, penalty), (128, 1.0)):
                rows.append(common | {"metric": "lm_penalty", "position": position, "value": value})
    lm = scale_scores(tidy(rows))
    assert sorted(lm["score"].round(3)) == sorted([-0.1, -0.2, -0.3] * 2)
    small = tidy([r for r in rows if r["model"] == "d16 L1 H2"])
    assert overview(small)["value"].iloc[0] == pytest.approx(0.2)  # the same seeds' mean
