"""Papers' per-task numbers from cited data files, set beside a sweep's with the rank
correlation and its bootstrap interval; mean reciprocal ranks with bootstrap intervals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from helpers import tidy
from posbench.encodings import BUILTINS
from posbench.experiment.config import load_config_file
from posbench.report.published import beside_papers, published_numbers, unseen_scores
from posbench.report.summary import cross_task_ranking
from posbench.suites import suite_file
from posbench.tasks import REGISTRY as TASKS


def test_every_published_number_names_a_task_an_encoding_and_its_source() -> None:
    numbers = published_numbers()
    assert not numbers.empty
    assert set(numbers["encoding"]) <= set(BUILTINS)
    assert all(task in TASKS.names() for task in numbers["task"])
    assert numbers["value"].between(0, 1).all()
    assert numbers["source"].str.len().gt(20).all()
    assert not numbers.duplicated(["paper", "task", "encoding", "metric"]).any()


def test_kazemnejad_copy_numbers_are_theirs() -> None:
    numbers = published_numbers().set_index(["paper", "task", "encoding"])["value"]
    assert numbers[("kazemnejad2023", "copy", "t5")] == 0.420
    assert numbers[("kazemnejad2023", "copy_single", "nope")] == 0.986
    assert numbers[("kazemnejad2023", "reverse", "rope")] == 0.077
    assert numbers[("kazemnejad2023", "copy_twice", "alibi")] == 0.569
    assert numbers[("kazemnejad2023", "copy_single_twice", "t5")] == 0.558


def test_every_kazemnejad_suite_task_has_every_encodings_published_number() -> None:
    suite, _ = load_config_file(suite_file("kazemnejad"))
    numbers = published_numbers().query("paper == 'kazemnejad2023'")
    for task in suite.tasks:
        names = set(numbers.loc[numbers["task"] == task.name, "encoding"])
        assert names == {encoding.name for encoding in suite.encodings}, task.name


def _copy_results(
    order: list[str], spread: float, seeds: int = 3, task: str = "copy", step: float = 0.1
):
    """Constructed results: exact match past L = 20 falls by `step` along `order`, each seed
    off by up to `spread`; in distribution every run is perfect."""
    rng = np.random.default_rng(1)
    rows = []
    for place, name in enumerate(order):
        for seed in range(seeds):
            common = {"task": task, "encoding": name, "encoding_label": name, "seed": seed}
            common |= {"model": "d64 L4 H4", "train_len_max": 20, "metric": "exact_match"}
            for length in (24, 32, 40):
                value = min(1.0, max(0.0, 0.5 - step * place + rng.uniform(-spread, spread)))
                rows.append(common | {"eval_len": length, "value": value})
            rows.append(common | {"eval_len": 64, "value": 0.0})  # past 2L: not the papers' range
            rows.append(common | {"eval_len": 20, "value": 1.0})
    return tidy(rows)


ORDER = ["t5", "alibi", "nope", "sinusoidal", "rope"]  # the published order on copy


def test_the_unseen_range_is_past_l_up_to_2l() -> None:
    scores = unseen_scores(_copy_results(["t5", "alibi"], 0.0), "exact_match")
    assert scores.set_index(["encoding", "seed"])["value"][("t5", 0)] == pytest.approx(0.5)


def test_the_published_order_reproduced_gives_tau_one() -> None:
    (copy,) = [c for c in beside_papers(_copy_results(ORDER, 0.01)) if c.task == "copy"]
    assert copy.paper == "kazemnejad2023" and "McGill-NLP" in copy.source
    assert copy.tau == pytest.approx(1.0) and copy.low > 0.5
    t5 = next(row for row in copy.rows if row["encoding"] == "t5")
    assert t5["theirs"] == 0.420 and t5["difference"] == pytest.approx(t5["ours"] - 0.420)
    assert t5["seeds"] == 3 and t5["ours_low"] < t5["ours"] < t5["ours_high"]


def test_a_reversed_order_gives_a_negative_tau_and_noise_an_interval_across_zero() -> None:
    reversed_ = beside_papers(_copy_results(ORDER[::-1], 0.01))
    assert reversed_[0].tau == pytest.approx(-1.0) and reversed_[0].high < 0
    noisy = beside_papers(_copy_results(ORDER, 0.4, step=0.0))
    assert noisy[0].low < 0 < noisy[0].high


def test_our_interval_beside_theirs_stays_inside_0_and_1() -> None:
    """Exact match is a share: with seeds spread wide, the t interval would run below 0 and
    above 1; the one printed beside the paper's number is cut to 0..1."""
    results = _copy_results(ORDER, 0.0)
    t5 = (results["encoding"] == "t5") & (results["eval_len"] != 20)
    results.loc[t5, "value"] = results.loc[t5, "seed"].map({0: 0.0, 1: 0.0, 2: 0.9})
    (copy,) = [c for c in beside_papers(results) if c.task == "copy"]
    row = next(row for row in copy.rows if row["encoding"] == "t5")
    assert row["ours"] == pytest.approx(0.3)  # the t interval: 0.3 -/+ 1.29
    assert (row["ours_low"], row["ours_high"]) == (0.0, 1.0)


def test_tasks_and_options_the_papers_did_not_run_are_left_out() -> None:
    frame = _copy_results(["t5", "alibi"], 0.0, task="lookback")
    assert beside_papers(frame) == []
    labelled = _copy_results(["t5", "alibi", "nope"], 0.0)
    labelled.loc[labelled["encoding"] == "t5", "encoding_label"] = "t5-paper"  # other options
    (copy,) = beside_papers(labelled)
    assert [row["encoding"] for row in copy.rows] == ["alibi", "nope"]


def test_mean_reciprocal_rank_carries_a_bootstrap_interval_over_seeds() -> None:
    frame = _copy_results(["t5", "alibi", "nope"], 0.05)
    frame = pd.concat(
        [frame, _copy_results(["nope", "alibi", "t5"], 0.05, task="reverse")], ignore_index=True
    )
    ranking = cross_task_ranking(frame).set_index("encoding_label")
    alibi = ranking.loc["alibi"]
    assert alibi["mrr_exact_match"] == pytest.approx(0.5)  # second on both tasks
    assert alibi["mrr_exact_match_low"] <= 0.5 <= alibi["mrr_exact_match_high"]
    one_seed = cross_task_ranking(
        pd.concat(
            [
                _copy_results(["t5", "alibi"], 0.0, seeds=1),
                _copy_results(["alibi", "t5"], 0.0, seeds=1, task="reverse"),
            ],
            ignore_index=True,
        )
    )
    assert one_seed["mrr_exact_match_low"].isna().all() and not math.isnan(
        one_seed["mrr_exact_match"].iloc[0]
    )


def test_an_encoding_that_did_not_learn_is_listed_but_not_ranked() -> None:
    frame = _copy_results(ORDER[::-1], 0.01)
    rope_in_distribution = (frame["encoding"] == "rope") & (frame["eval_len"] == 20)
    frame.loc[rope_in_distribution, "value"] = 0.2
    (copy,) = beside_papers(frame)
    rope = next(row for row in copy.rows if row["encoding"] == "rope")
    assert not rope["learned"] and len(copy.rows) == 5
    assert copy.tau == pytest.approx(-1.0)  # the four that learned, still reversed
