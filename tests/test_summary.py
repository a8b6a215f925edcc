"""The headline tables on known inputs: intervals over seeds, rankings, effective lengths,
which models learned their task."""

from __future__ import annotations

import math

import pytest

from posbench.report.stats import mean_interval
from posbench.report.summary import comparison_kind, cross_task_ranking, headline

from helpers import tidy


def _rows(seed: int, at_2x: float) -> list[dict]:
    base = {
        "task": "copy",
        "encoding_label": "rope",
        "seed": seed,
        "train_len_max": 4,
        "mem_len": math.nan,
    }
    return [
        base | {"metric": "exact_match", "eval_len": 4, "value": 1.0},
        base | {"metric": "exact_match", "eval_len": 8, "value": at_2x},
        base | {"metric": "token_accuracy", "eval_len": 8, "value": 0.5 + at_2x / 2},
    ]


def test_headline_gives_intervals_best_seed_and_share_that_generalise() -> None:
    frame = tidy(_rows(0, 0.95) + _rows(1, 0.2) + _rows(2, 0.4))
    row = headline(frame).iloc[0]
    assert row["seeds"] == 3 and row["in_distribution"] == 1.0
    assert row["at_2x"] == pytest.approx(0.5166667)
    expected = mean_interval([0.95, 0.2, 0.4])
    assert expected.low < 0  # the t interval leaves 0..1; the headline's is cut at 0
    assert (row["at_2x_low"], row["at_2x_high"]) == pytest.approx((0.0, min(1.0, expected.high)))
    assert row["best_at_2x"] == 0.95 and row["generalising"] == pytest.approx(1 / 3)
    assert row["token_at_2x"] == pytest.approx(0.5 + 0.5166667 / 2)


def _accuracy_at_2x(scores: dict[tuple[str, str], float]) -> list[dict]:
    """Result rows for two seeds: free-running token accuracy 1.0 at the training length 8
    and `scores[(task, encoding)]` at 16, twice it."""
    return [
        {
            "task": t,
            "encoding_label": e,
            "seed": s,
            "metric": "greedy_token_accuracy",
            "mem_len": math.nan,
            "eval_len": length,
            "train_len_max": 8,
            "value": v if length > 8 else 1.0,
        }
        for (t, e), v in scores.items()
        for s in (0, 1)
        for length in (8, 16)
    ]


def test_mean_reciprocal_rank_across_tasks() -> None:
    # free-running token accuracy at 2x: task a ranks x > y > z, task b ranks y > x = z (tie: 2.5)
    scores = {
        ("a", "x"): 0.9,
        ("a", "y"): 0.5,
        ("a", "z"): 0.1,
        ("b", "x"): 0.2,
        ("b", "y"): 0.8,
        ("b", "z"): 0.2,
    }
    rows = _accuracy_at_2x(scores)
    table = cross_task_ranking(tidy(rows)).set_index("encoding_label")
    assert table.loc["x", "mrr_headline"] == pytest.approx((1 + 1 / 2.5) / 2)
    assert table.loc["y", "mrr_headline"] == pytest.approx((1 / 2 + 1) / 2)
    assert table.loc["z", "mrr_headline"] == pytest.approx((1 / 3 + 1 / 2.5) / 2)
    assert list(table.index) == ["y", "x", "z"] and (table["tasks"] == 2).all()
    assert cross_task_ranking(
        tidy([r for r in rows if r["task"] == "a"])
    ).empty  # one task: no ranking


def test_effective_length_is_the_longest_length_before_the_metric_first_fails() -> None:
    from posbench.report.summary import EFFECTIVE_AT, effective_lengths

    def rows(seed: int, greedy: dict[int, float], label: str = "alibi") -> list[dict]:
        base = {
            "task": "copy",
            "encoding_label": label,
            "seed": seed,
            "train_len_max": 8,
            "mem_len": math.nan,
            "metric": "greedy_token_accuracy",
        }
        return [base | {"eval_len": n, "value": v} for n, v in greedy.items()]

    frame = tidy(
        rows(0, {4: 1.0, 8: 0.95, 16: 0.91, 32: 0.5, 64: 0.95})  # recovers at 64: does not count
        + rows(1, {4: 1.0, 8: 0.95, 16: 0.2, 32: 0.1, 64: 0.1})
        + rows(2, {4: 1.0, 8: 0.97, 16: 0.95, 32: 0.92, 64: math.nan})  # n/a past 32
        + rows(0, {4: 0.5, 8: 1.0, 16: 1.0, 32: 1.0, 64: 1.0}, "nope")
    )
    table = effective_lengths(frame).set_index("encoding_label")
    assert EFFECTIVE_AT == 0.9
    # seed 0 crosses 0.9 between 16 (0.91) and 32 (0.5), seed 1 between 8 (0.95) and 16 (0.2),
    # seed 2 holds to 32 and has no value at 64 (no interpolation there)
    crossings = (16 + 0.01 / 0.41 * 16, 8 + 0.05 / 0.75 * 8, 32)
    assert table.loc["alibi", "effective_length"] == pytest.approx(sum(crossings) / 3)
    assert 0 <= table.loc["alibi", "effective_length_low"] < table.loc["alibi", "effective_length"]
    assert table.loc["alibi", "effective_length_high"] <= 64  # never past the evaluated range
    assert table.loc["alibi", "effective_length_censored"] == 0
    assert table.loc["nope", "effective_length"] == 0  # fails at the shortest length
    lm = tidy(
        [
            {
                "task": "lm",
                "encoding_label": "rope",
                "seed": 0,
                "train_len_max": 64,
                "mem_len": math.nan,
                "metric": "lm_penalty",
                "eval_len": 512,
                "position": p,
                "value": v,
            }
            for p, v in {16: 0.0, 64: 0.01, 128: 0.05, 256: 0.3, 512: 0.05}.items()
        ]
    )
    # crosses 0.1 nats between 128 (0.05) and 256 (0.3)
    rope = effective_lengths(lm).set_index("encoding_label").loc["rope"]
    assert rope["effective_length"] == pytest.approx(128 + 0.05 / 0.25 * 128)


def test_an_effective_length_held_to_the_longest_length_prints_as_at_least() -> None:
    from posbench.report.summary import effective_length_text, effective_lengths

    rows = [
        {
            "task": "copy",
            "encoding_label": "t5",
            "seed": seed,
            "train_len_max": 8,
            "mem_len": math.nan,
            "metric": "greedy_token_accuracy",
            "eval_len": n,
            "value": 0.99,
        }
        for seed in (0, 1, 2)
        for n in (8, 16, 24)
    ]
    record = effective_lengths(tidy(rows)).iloc[0].to_dict()
    assert record["effective_length"] == 24 and record["effective_length_censored"] == 1.0
    assert effective_length_text(record) == ">= 24"


def test_models_that_did_not_learn_a_task_are_left_out_of_its_ranking() -> None:
    from posbench.report.summary import learned_in_distribution

    def rows(
        task: str, label: str, in_dist: float, beyond: float, extra: list[dict] | None = None
    ) -> list[dict]:
        base = {
            "task": task,
            "encoding_label": label,
            "seed": 0,
            "train_len_max": 8,
            "mem_len": math.nan,
        }
        return (
            [
                base | {"metric": m, "eval_len": 8, "value": in_dist}
                for m in ("exact_match", "greedy_token_accuracy")
            ]
            + [
                base | {"metric": m, "eval_len": 16, "value": beyond}
                for m in ("exact_match", "greedy_token_accuracy")
            ]
            + (extra or [])
        )

    frame = tidy(
        rows("copy", "alibi", 1.0, 0.5)
        + rows("copy", "nope", 0.3, 0.9)  # nope never learned copy
        + rows("reverse", "alibi", 1.0, 0.2)
        + rows("reverse", "nope", 1.0, 0.6)
        + [
            {
                "task": "copy",
                "encoding_label": "alibi",
                "seed": 0,
                "train_len_max": 8,
                "mem_len": math.nan,
                "metric": "steps_to_threshold",
                "eval_len": math.nan,
                "value": 500.0,
            }
        ]
    )
    assert learned_in_distribution(frame) == {
        ("copy", "alibi"): True,
        ("copy", "nope"): False,
        ("reverse", "alibi"): True,
        ("reverse", "nope"): True,
    }
    ranking = cross_task_ranking(frame).set_index("encoding_label")
    assert ranking.loc["alibi", "mrr_headline"] == pytest.approx((1 + 0.5) / 2)
    assert (
        ranking.loc["nope", "mrr_headline"] == 1.0 and ranking.loc["nope", "tasks"] == 1
    )  # ranked on reverse only
    assert comparison_kind(frame) == {"copy": "equal accuracy", "reverse": "equal compute"}


def test_a_task_run_under_two_protocols_counts_once_in_the_mean_reciprocal_rank() -> None:
    """copy and copy-fixed (one task_name) weigh as one task beside lookback: x leads copy under
    both protocols and trails lookback, so its MRR is (1 + 1/2) / 2, not (1 + 1 + 1/2) / 3."""
    scores = {"copy": ("x", "y"), "copy-fixed": ("x", "y"), "lookback": ("y", "x")}
    rows = [
        {
            "task": label,
            "task_name": label.removesuffix("-fixed"),
            "encoding_label": encoding,
            "seed": seed,
            "metric": "greedy_token_accuracy",
            "mem_len": math.nan,
            "eval_len": length,
            "train_len_max": 8,
            "value": 1.0 if length == 8 else (0.9 if encoding == order[0] else 0.3),
        }
        for label, order in scores.items()
        for encoding in order
        for seed in (0, 1)
        for length in (8, 16)
    ]
    table = cross_task_ranking(tidy(rows)).set_index("encoding_label")
    assert table.loc["x", "mrr_headline"] == pytest.approx((1 + 1 / 2) / 2)
    assert table.loc["y", "mrr_headline"] == pytest.approx((1 / 2 + 1) / 2)
    assert (table["tasks"] == 2).all()
    two_protocols_only = [r for r in rows if r["task"] != "lookback"]
    assert cross_task_ranking(tidy(two_protocols_only)).empty  # one task under two protocols


def test_a_task_where_some_runs_hit_the_step_cap_is_not_called_equal_accuracy() -> None:
    """Runs that stopped at the step cap before the threshold trained to the budget, not to the
    same accuracy: the comparison says how many reached it."""

    def steps(label: str, seed: int, value: float) -> dict:
        return {
            "task": "copy",
            "encoding_label": label,
            "seed": seed,
            "train_len_max": 8,
            "mem_len": math.nan,
            "metric": "steps_to_threshold",
            "eval_len": math.nan,
            "value": value,
        }

    reached = [steps("alibi", 0, 500.0), steps("alibi", 1, 750.0)]
    assert comparison_kind(tidy(reached)) == {"copy": "equal accuracy"}
    capped = tidy(reached + [steps("nope", 0, math.nan), steps("nope", 1, 250.0)])
    assert comparison_kind(capped) == {
        "copy": "equal accuracy for 3 of 4 runs (the rest hit the step cap first)"
    }
    variant = steps("nope", 0, math.nan) | {"variant_of": "a1b2c3", "encoding_label": "nope [x]"}
    assert comparison_kind(tidy(reached + [steps("nope", 0, math.nan), variant])) == {
        "copy": "equal accuracy for 2 of 3 runs (the rest hit the step cap first)"
    }  # an evaluation-time variant repeats its trained run's steps: counted once


def test_the_effective_length_threshold_is_measured_from_chance() -> None:
    """Bits (chance 0.5): 0.93 is past 0.9 but only 86% of the way from chance to 1, so the
    effective length ends before length 16, where a chance of 0 would have let it hold."""
    from posbench.report.summary import effective_lengths

    def rows(chance: float) -> list[dict]:
        out = []
        for n, v in {8: 1.0, 16: 0.93, 24: 0.5}.items():
            base = {"task": "parity_check", "encoding_label": "rope", "seed": 0}
            base |= {"train_len_max": 8, "mem_len": math.nan, "eval_len": n}
            out.append(base | {"metric": "greedy_token_accuracy", "value": v})
            out.append(base | {"metric": "chance_token_accuracy", "value": chance})
        return out

    bits = effective_lengths(tidy(rows(0.5))).iloc[0]["effective_length"]
    assert bits == pytest.approx(8 + (1.0 - 0.95) / (1.0 - 0.95 + 0.95 - 0.93) * 8)
    none = effective_lengths(tidy(rows(0.0))).iloc[0]["effective_length"]
    assert none == pytest.approx(16 + 0.03 / 0.43 * 8)


def test_an_evaluation_variant_is_not_ranked_across_tasks() -> None:
    """A variant (rows with variant_of) reads its trained model again under other evaluation
    options: it gets no reciprocal rank and takes none from the encodings. Here the variant
    x-restart leads task a, which must leave x first there."""
    scores = {
        ("a", "x"): 0.6,
        ("a", "y"): 0.4,
        ("a", "x-restart"): 0.9,
        ("b", "x"): 0.2,
        ("b", "y"): 0.8,
        ("b", "x-restart"): 0.1,
    }
    rows = [
        row | {"variant_of": "run-x" if row["encoding_label"].endswith("-restart") else math.nan}
        for row in _accuracy_at_2x(scores)
    ]
    table = cross_task_ranking(tidy(rows)).set_index("encoding_label")
    assert "x-restart" not in table.index
    assert table.loc["x", "mrr_headline"] == pytest.approx((1 + 1 / 2) / 2)
    assert table.loc["y", "mrr_headline"] == pytest.approx((1 / 2 + 1) / 2)
