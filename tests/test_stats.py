"""Seed statistics on known inputs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from posbench.report.stats import mean_interval


def test_t_interval_on_known_values() -> None:
    interval = mean_interval([1.0, 2.0, 3.0])
    # mean 2, sample sd 1, t(0.975, 2) = 4.302653: half-width 4.302653 / sqrt(3)
    assert interval.mean == 2.0 and interval.n == 3
    assert interval.half_width == pytest.approx(2.484138, abs=1e-6)
    assert interval.text() == "2.00 ± 2.48"
    assert mean_interval([0.5, 0.5, 0.5]).half_width == 0.0


def test_one_seed_gives_no_interval_and_nans_are_dropped() -> None:
    single = mean_interval([0.7, math.nan])
    assert (
        single.n == 1 and single.mean == 0.7 and math.isnan(single.low) and single.text() == "0.70"
    )
    assert mean_interval([]).text() == "n/a"


def test_a_mean_that_rounds_to_zero_prints_without_a_sign() -> None:
    assert mean_interval([-0.0004]).text(3) == "0.000"
    assert mean_interval([-0.0004, -0.0002, -0.0003]).text(3).startswith("0.000 ± ")
    assert mean_interval([-0.004]).text(3) == "-0.004"


def test_only_an_encoding_a_test_separates_from_every_other_is_best() -> None:
    from posbench.report.stats import sole_best

    apart = {"a": [0.9, 0.91, 0.92], "b": [0.5, 0.51, 0.52], "c": [0.1, 0.11, 0.12]}
    assert sole_best(apart) == "a"
    assert sole_best({"a": [0.9, 0.91, 0.92], "b": [0.89, 0.9, 0.93], "c": [0.1, 0.1, 0.1]}) is None
    assert sole_best({"a": [0.9, 0.91]}) is None  # nothing to compare with
    assert sole_best({}) is None
    assert sole_best(apart, separated={frozenset("ab")}) is None  # a and c not separated


def test_holm_adjusts_step_down_and_skips_nan() -> None:
    from posbench.report.stats import holm

    adjusted = holm([0.01, 0.04, math.nan, 0.03])
    assert adjusted[0] == pytest.approx(0.03) and adjusted[3] == pytest.approx(0.06)
    assert adjusted[1] == pytest.approx(0.06) and math.isnan(adjusted[2])


def test_the_order_test_is_exact_and_calibrated() -> None:
    """Two groups of three seeds fully apart: 1 of the 20 arrangements is as extreme, so the
    p-value is about 1/20; under no difference, p <= 0.05 about 5% of the time."""
    from posbench.report.stats import order_test

    apart = order_test([3, 4, 5, 0, 1, 2], [0, 0, 0, 1, 1, 1], permutations=4999)
    assert apart.p_agree == pytest.approx(1 / 20, abs=0.01) and apart.p_disagree == 1.0
    rng = np.random.default_rng(0)
    ranks = np.repeat(np.arange(4), 5)
    p = [
        order_test(rng.normal(size=20), ranks, permutations=199, seed=i).p_agree for i in range(400)
    ]
    assert 0.02 <= np.mean(np.asarray(p) <= 0.05) <= 0.08


def test_letter_groups_share_a_letter_exactly_where_no_test_separates() -> None:
    from posbench.report.stats import letter_groups

    separated = {frozenset("AC"), frozenset("AD"), frozenset("BD")}
    letters = letter_groups(["A", "B", "C", "D"], separated)
    assert letters == {"A": "a", "B": "ab", "C": "bc", "D": "c"}
    for x, y in itertools.combinations("ABCD", 2):
        assert bool(set(letters[x]) & set(letters[y])) == (frozenset((x, y)) not in separated)
    assert letter_groups(["A", "B"], set()) == {"A": "a", "B": "a"}


def test_two_encodings_that_no_pairwise_test_separates_share_a_group() -> None:
    """Overlapping seeds (no separation) share a letter; a third encoding far above both
    leads alone; and with no true difference among five encodings, any pair is separated at
    most about 5% of the time (Holm over the ten pairs)."""
    from posbench.report.stats import letter_groups, separated_pairs

    samples = {
        "high": [0.90, 0.91, 0.92, 0.90, 0.91],
        "rope": [0.40, 0.55, 0.45, 0.60, 0.50],
        "t5": [0.50, 0.42, 0.58, 0.47, 0.52],
    }
    letters = letter_groups(["high", "t5", "rope"], separated_pairs(samples))
    assert letters == {"high": "a", "t5": "b", "rope": "b"}
    rng = np.random.default_rng(1)
    separating = [
        bool(separated_pairs({k: rng.normal(size=5) for k in "abcde"})) for _ in range(300)
    ]
    assert np.mean(separating) <= 0.07
