"""Seed statistics: the mean with a Student-t 95% interval, the best seed, and the share of
seeds that generalise. Out-of-distribution accuracy is brittle across seeds, so a ranking
needs an interval, and one seed cannot give one."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Iterator, Mapping, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
#: A seed "generalises" when its exact match at twice the longest training length reaches this.
GENERALISES_AT = 0.9


@dataclass(frozen=True)
class Interval:
    """Mean of n values with a two-sided Student-t interval (NaN bounds when n < 2)."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def text(self, digits: int = 2) -> str:
        """'0.83 ± 0.05', or '0.83' alone when there is no interval."""
        if math.isnan(self.mean):
            return "n/a"
        mean = self.mean + 0.0 if round(self.mean, digits) != 0 else 0.0  # never "-0.00"
        if math.isnan(self.low):
            return f"{mean:.{digits}f}"
        return f"{mean:.{digits}f} ± {self.half_width:.{digits}f}"


def mean_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean and its t interval: mean ± t_{(1+c)/2, n-1} * s / sqrt(n) (NaNs dropped)."""
    data = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    n = len(data)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(data.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1) * data.std(ddof=1) / math.sqrt(n))
    return Interval(mean, mean - half, mean + half, n)


def seed_resamples(
    groups: Mapping[Hashable, np.ndarray], replicates: int, seed: int = 0
) -> Iterator[dict[Hashable, float]]:
    """Bootstrap replicates of each group's mean, each group's values (one per seed) drawn with
    replacement as many times as it has values: the spread a ranking owes to seed variance."""
    rng = np.random.default_rng(seed)
    for _ in range(replicates):
        yield {key: float(rng.choice(values, len(values)).mean()) for key, values in groups.items()}


def percentile_interval(
    values: Iterable[float], confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The central `confidence` percentile interval of bootstrap replicates (NaNs dropped; NaN
    bounds when none is left)."""
    data = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if len(data) == 0:
        return math.nan, math.nan
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(data, [tail, 100 - tail])
    return float(low), float(high)


def rank_groups(intervals: Sequence[Interval], higher_is_better: bool = True) -> list[int]:
    """Rank groups that respect the intervals, 1 for the best: the encodings in order of their
    means, each joining the group of the one that leads it unless their intervals are apart
    (then it leads a new group). An interval that is missing (one seed) is apart from nothing,
    so without seeds every encoding shares group 1: nothing is separated. NaN means rank
    last, in a group of their own."""
    order = sorted(
        (i for i, interval in enumerate(intervals) if not math.isnan(interval.mean)),
        key=lambda i: -intervals[i].mean if higher_is_better else intervals[i].mean,
    )
    groups = [0] * len(intervals)
    group, leader = 0, None
    for i in order:
        if leader is None or _apart(intervals[leader], intervals[i]):
            group, leader = group + 1, i
        groups[i] = group
    for i, interval in enumerate(intervals):
        if math.isnan(interval.mean):
            groups[i] = group + 1
    return groups


def sole_best(groups: Sequence[int]) -> int | None:
    """The index of the encoding alone in rank group 1, the only one a report may call best;
    None where group 1 holds several or there is only one encoding to compare."""
    if len(groups) > 1 and groups.count(1) == 1:
        return list(groups).index(1)
    return None


def _apart(a: Interval, b: Interval) -> bool:
    """Whether two intervals do not overlap (False when either is missing)."""
    if any(math.isnan(x) for x in (a.low, a.high, b.low, b.high)):
        return False
    return a.high < b.low or b.high < a.low


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two scorings of the same encodings (NaN with fewer than two, or when
    either scoring is constant)."""
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan
    return float(stats.kendalltau(x, y).statistic)


def seed_bootstrap_interval(
    groups: Mapping[Hashable, np.ndarray],
    statistic: Callable[[dict[Hashable, float]], float],
    replicates: int,
    seed: int = 0,
) -> tuple[float, float, float]:
    """A statistic of the groups' means, with the percentile interval of its bootstrap over
    each group's seeds (see seed_resamples): (value, low, high)."""
    value = statistic({key: float(values.mean()) for key, values in groups.items()})
    low, high = percentile_interval(
        statistic(means) for means in seed_resamples(groups, replicates, seed)
    )
    return value, low, high
