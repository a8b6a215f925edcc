"""Seed statistics on known inputs."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from posbench.report.stats import mean_interval
from posbench.report.summary import cross_task_ranking, headline


def test_t_interval_on_known_values() -> None:
    interval = mean_interval([1.0, 2.0, 3.0])
    # mean 2, sample sd 1, t(0.975, 2) = 4.302653: half-width 4.302653 / sqrt(3)
    assert interval.mean == 2.0 and interval.n == 3
    assert interval.half_width == pytest.approx(2.484138, abs=1e-6)
    assert interval.text() == "2.00 ± 2.48"
    assert mean_interval([0.5, 0.5, 0.5]).half_width == 0.0


def test_one_seed_gives_no_interval_and_nans_are_dropped() -> None:
    single = mean_interval([0.7, math.nan])
    assert single.n == 1 and single.mean == 0.7 and math.isnan(single.low) and single.text() == "0.70"
    assert mean_interval([]).text() == "n/a"


def _rows(seed: int, at_2x: float) -> list[dict]:
    base = {"task": "copy", "encoding_label": "rope", "seed": seed, "train_len_max": 4, "mem_len": math.nan}
    return [base | {"metric": "exact_match", "eval_len": 4, "value": 1.0},
            base | {"metric": "exact_match", "eval_len": 8, "value": at_2x},
            base | {"metric": "token_accuracy", "eval_len": 8, "value": 0.5 + at_2x / 2}]


def test_headline_gives_intervals_best_seed_and_share_that_generalise() -> None:
    frame = pd.DataFrame(_rows(0, 0.95) + _rows(1, 0.2) + _rows(2, 0.4))
    row = headline(frame).iloc[0]
    assert row["seeds"] == 3 and row["in_distribution"] == 1.0
    assert row["at_2x"] == pytest.approx(0.5166667)
    expected = mean_interval([0.95, 0.2, 0.4])
    assert (row["at_2x_low"], row["at_2x_high"]) == pytest.approx((expected.low, expected.high))
    assert row["best_at_2x"] == 0.95 and row["generalising"] == pytest.approx(1 / 3)
    assert row["token_at_2x"] == pytest.approx(0.5 + 0.5166667 / 2)


def test_mean_reciprocal_rank_across_tasks() -> None:
    # unseen-length token accuracy: task a ranks x > y > z, task b ranks y > x = z (tie: rank 2.5)
    scores = {("a", "x"): 0.9, ("a", "y"): 0.5, ("a", "z"): 0.1, ("b", "x"): 0.2, ("b", "y"): 0.8, ("b", "z"): 0.2}
    rows = [{"task": t, "encoding_label": e, "seed": s, "metric": "token_accuracy", "mem_len": math.nan,
             "eval_len": length, "train_len_max": 8, "value": v if length > 8 else 1.0}
            for (t, e), v in scores.items() for s in (0, 1) for length in (8, 16)]
    table = cross_task_ranking(pd.DataFrame(rows)).set_index("encoding_label")
    assert table.loc["x", "mrr_token_accuracy"] == pytest.approx((1 + 1 / 2.5) / 2)
    assert table.loc["y", "mrr_token_accuracy"] == pytest.approx((1 / 2 + 1) / 2)
    assert table.loc["z", "mrr_token_accuracy"] == pytest.approx((1 / 3 + 1 / 2.5) / 2)
    assert list(table.index) == ["y", "x", "z"] and (table["tasks"] == 2).all()
    assert cross_task_ranking(pd.DataFrame([r for r in rows if r["task"] == "a"])).empty  # one task: no ranking
