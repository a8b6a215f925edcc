"""The learning-rate probe: rates read from the stored config, the rate in-distribution
validation picks, the verdict on whether a suite's order survives, and the report's section."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from helpers import TINY_TOML, invoke, one_sentence_error, tidy, write_config
from posbench.report.html import build_report
from posbench.report.learning_rate import (
    picked_rates,
    probe_scores,
    rate_verdicts,
    suite_groups,
    task_learning_rates,
)

RATES = {"copy-slow": 1e-3, "copy-mid": 3e-3, "copy-fast": 1e-2}


def _rows(table: dict[str, dict[str, tuple[float, float, float | None]]]) -> pd.DataFrame:
    """Constructed copy results: per task label and encoding, (exact match in distribution,
    free-running token accuracy at 2x, steps to threshold or None for a run that hit its cap)."""
    rows = []
    for task, encodings in table.items():
        for label, (inside, beyond, steps) in encodings.items():
            common = {"task": task, "task_name": "copy", "encoding": label}
            common |= {"encoding_label": label, "seed": 0, "train_len_max": 8}
            rows += [
                common | {"eval_len": 4, "metric": "exact_match", "value": inside},
                common | {"eval_len": 16, "metric": "greedy_token_accuracy", "value": beyond},
                common | {"metric": "steps_to_threshold", "value": math.nan if steps is None
                          else steps},
            ]  # fmt: skip
    return tidy(rows)


def test_rates_come_from_each_task_else_the_sweep() -> None:
    config = {
        "train": {"lr": 0.003},
        "tasks": [
            {"name": "copy", "label": "copy-fast", "train": {"lr": 0.01}},
            {"name": "lm", "train": {"steps": 5}},
        ],
    }
    assert task_learning_rates(config) == {"copy-fast": 0.01, "lm": 0.003}


def test_validation_picks_a_learned_rate_then_the_fewest_steps_then_the_best_score() -> None:
    frame = _rows(
        {
            "copy-slow": {"a": (0.99, 0.5, 900), "b": (0.95, 0.2, None), "c": (0.2, 0.1, None)},
            "copy-mid": {"a": (0.98, 0.6, 400), "b": (0.99, 0.3, None), "c": (0.5, 0.9, None)},
            "copy-fast": {"a": (0.1, 0.9, None), "b": (0.97, 0.4, None), "c": (0.95, 0.2, 1000)},
        }
    )
    scores = probe_scores(frame, RATES)
    assert len(scores) == 9 and set(scores["task_name"]) == {"copy"}
    learned = scores.set_index(["encoding_label", "lr"])["learned"]
    assert not learned[("a", 1e-2)] and learned[("a", 1e-3)] and not learned[("c", 3e-3)]
    picked = picked_rates(scores).set_index("encoding_label")["lr"]
    # a: 400 steps to the threshold beat 900, though validation reads 0.99 there; b: no rate
    # stopped early, so the best validation; c: the only rate it learned at, though another
    # scores higher beyond the training length
    assert picked.to_dict() == {"a": 3e-3, "b": 3e-3, "c": 1e-2}


def test_a_task_trained_at_one_rate_is_not_probed() -> None:
    frame = _rows({"copy-mid": {"a": (0.99, 0.6, 400)}})
    assert probe_scores(frame, RATES).empty


def _probe(order_at_picked: list[str]) -> pd.DataFrame:
    """Four encodings that learn copy at both rates; the suite's rate (3e-3) orders them a > b >
    c > d beyond the training length, 1e-2 (picked for all: better validation) as given."""
    mid = {label: (0.97, 0.8 - 0.2 * i, 500) for i, label in enumerate("abcd")}
    fast = {label: (0.99, 0.8 - 0.2 * i, 500) for i, label in enumerate(order_at_picked)}
    return probe_scores(_rows({"copy-mid": mid, "copy-fast": fast}), RATES)


SUITE = pd.DataFrame(
    {
        "task": "copy",
        "encoding_label": list("abcd"),
        "headline_metric": "greedy_token_accuracy_at_2x",
        "value": [0.8, 0.6, 0.4, 0.2],
        "rank_group": ["a", "ab", "b", "c"],  # separated: a-c, a-d, b-d, c-d
    }
)


@pytest.mark.parametrize(
    "order, swapped, changes",
    [
        (list("abcd"), [], False),
        (list("bacd"), [], False),  # a and b share a group: their swap is seed noise
        (list("acbd"), [], False),
        (list("adcb"), [("d", "b"), ("d", "c")], True),
    ],
)
def test_only_pairs_the_suite_separates_count_as_a_change_of_order(
    order: list[str], swapped: list[tuple[str, str]], changes: bool
) -> None:
    (verdict,) = rate_verdicts(_probe(order), 3e-3, suite_groups(SUITE))
    assert verdict.checked_pairs == 4 and verdict.encodings == 4
    assert sorted(verdict.reversed_pairs) == swapped and verdict.changes is changes
    assert verdict.moved == list("abcd")
    assert ("changes with the learning rate" in verdict.sentence()) is changes


def test_tau_and_no_verdict_without_a_suite() -> None:
    (same,) = rate_verdicts(_probe(list("abcd")), 3e-3)
    assert same.tau == pytest.approx(1.0) and same.changes is None
    assert "Kendall's tau between the order at the picked rates and at 0.003 is 1.00" in (
        same.sentence()
    )
    (reversed_,) = rate_verdicts(_probe(list("dcba")), 3e-3)
    assert reversed_.tau == pytest.approx(-1.0)


def test_learning_only_at_another_rate_is_a_change() -> None:
    frame = _rows(
        {
            "copy-mid": {"a": (0.99, 0.5, 400), "b": (0.3, 0.0, None)},
            "copy-fast": {"a": (0.90, 0.5, 400), "b": (0.98, 0.4, 900)},
        }
    )
    (verdict,) = rate_verdicts(probe_scores(frame, RATES), 3e-3)
    assert verdict.learned_elsewhere == ["b (0.01)"] and verdict.changes is True
    assert verdict.moved == ["b"]  # a keeps 3e-3: its validation is better there


COPY = 'name = "copy", train_lengths = [1, 3], eval_lengths = [2, 3, 6]'
#: TINY_TOML (trained at the default 3e-3) with its task at two learning rates.
PROBE_TOML = TINY_TOML.replace(
    f"tasks = [{{ {COPY} }}]",
    f'tasks = [{{ {COPY}, label = "copy-mid", train = {{ lr = 3e-3 }} }}, '
    f'{{ {COPY}, label = "copy-fast", train = {{ lr = 1e-2 }} }}]',
)


def test_the_report_shows_a_probe_of_its_own_and_one_passed_with_probe(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    result = invoke("run", "--config", str(write_config(tmp_path, PROBE_TOML)), "--out",
                    str(probe), "--no-report")  # fmt: skip
    assert result.exit_code == 0, result.output
    own = build_report(probe, tmp_path / "own").html.read_text()
    assert "Does the ranking survive another learning rate?" in own
    assert "<th>lr 0.003</th><th>lr 0.01</th><th>picked</th>" in own
    assert "0.003 is the sweep's own rate" in own  # two steps learn nothing:
    assert "<td>none: not learned at any rate</td>" in own and "for 0 encoding(s)" in own
    suite = tmp_path / "suite"
    config = write_config(tmp_path)
    result = invoke("run", "--config", str(config), "--out", str(suite), "--no-report")
    assert result.exit_code == 0, result.output
    alone = build_report(suite, tmp_path / "alone").html.read_text()
    assert "another learning rate" not in alone
    result = invoke("report", str(suite), "-o", str(tmp_path / "with"), "--probe", str(probe))
    assert result.exit_code == 0, result.output
    html = (tmp_path / "with" / "report.html").read_text()
    assert f"The learning-rate probe ({probe}) trained" in html
    assert "this suite trains at 0.003" in html and "pairs the suite&#39;s seeds separate" in html


@pytest.mark.parametrize(
    "which, fragments",
    [
        ("missing", ("is not a folder", "--probe")),
        ("unprobed", ("more than one learning rate", "--probe")),
        ("other rates", ("trained at 0.001, 0.01, not at this suite's rate 0.003", "add a task")),
    ],
)
def test_a_wrong_probe_folder_is_one_sentence(
    tmp_path: Path, which: str, fragments: tuple[str, ...]
) -> None:
    suite = tmp_path / "suite"
    config = write_config(tmp_path)
    assert invoke("run", "--config", str(config), "--out", str(suite), "--no-report").exit_code == 0
    probe = {"missing": tmp_path / "nothing", "unprobed": suite}.get(which, tmp_path / "probe")
    if which == "other rates":
        toml = PROBE_TOML.replace("lr = 3e-3", "lr = 1e-3")
        run = invoke("run", "--config", str(write_config(tmp_path, toml)), "--out", str(probe))
        assert run.exit_code == 0, run.output
    result = invoke("report", str(suite), "-o", str(tmp_path / "r"), "--probe", str(probe))
    one_sentence_error(result, *fragments)
    assert not (tmp_path / "r" / "report.html").exists()
