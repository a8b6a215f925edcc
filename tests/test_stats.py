"""Seed statistics on known inputs."""

from __future__ import annotations

import math

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
