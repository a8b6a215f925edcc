"""Seed statistics: the mean with a Student-t 95% interval, the best seed, and the share of
seeds that generalise. Out-of-distribution accuracy is brittle across seeds, so a ranking
needs an interval, and one seed cannot give one."""

from __future__ import annotations

import math
import warnings
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
        """'0.83 ± 0.05'; '0.26 [0.00, 0.87]' where a bound cut the interval (it is no longer
        symmetric); '0.83' alone when there is no interval."""
        if math.isnan(self.mean):
            return "n/a"
        mean = _no_negative_zero(self.mean, digits)
        if math.isnan(self.low):
            return f"{mean:.{digits}f}"
        below, above = self.mean - self.low, self.high - self.mean
        if abs(below - above) > 1e-9 * max(1.0, abs(self.mean)):
            low, high = (_no_negative_zero(x, digits) for x in (self.low, self.high))
            return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
        return f"{mean:.{digits}f} ± {self.half_width:.{digits}f}"


def _no_negative_zero(value: float, digits: int) -> float:
    return value + 0.0 if round(value, digits) != 0 else 0.0  # never "-0.00"


#: The range of a share (accuracy, exact match): its intervals never leave it.
SHARE_BOUNDS = (0.0, 1.0)
#: The stored metrics that are shares.
SHARE_METRICS = frozenset(
    {"exact_match", "token_accuracy", "greedy_token_accuracy", "chance_token_accuracy"}
)


def mean_interval(
    values: Iterable[float],
    confidence: float = CONFIDENCE,
    bounds: tuple[float, float] | None = None,
) -> Interval:
    """The mean and its t interval: mean ± t_{(1+c)/2, n-1} * s / sqrt(n) (NaNs dropped), cut
    to `bounds` where the metric has them (a share cannot leave 0..1, so the part of the
    interval outside holds no possible mean; the cut keeps its coverage)."""
    data = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    n = len(data)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(data.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1) * data.std(ddof=1) / math.sqrt(n))
    low, high = mean - half, mean + half
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Interval(mean, low, high, n)


#: Bootstrap replicates for every interval over seeds a report gives (rank correlations with a
#: paper or between model sizes, mean reciprocal ranks): one count, so the intervals compare.
BOOTSTRAP_REPLICATES = 1000


def seed_resamples(
    groups: Mapping[Hashable, np.ndarray], replicates: int = BOOTSTRAP_REPLICATES, seed: int = 0
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


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of two scorings of the same encodings (NaN with fewer than two, or when
    either scoring is constant)."""
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return math.nan
    return float(stats.kendalltau(x, y).statistic)


def seed_bootstrap_interval(
    groups: Mapping[Hashable, np.ndarray],
    statistic: Callable[[dict[Hashable, float]], float],
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """A statistic of the groups' means, with the percentile interval of its bootstrap over
    each group's seeds (see seed_resamples): (value, low, high)."""
    value = statistic({key: float(values.mean()) for key, values in groups.items()})
    low, high = percentile_interval(
        statistic(means) for means in seed_resamples(groups, replicates, seed)
    )
    return value, low, high


# ---- Tests with a known error rate --------------------------------------------------------------
#: The family-wise error rate every set of verdicts in a report is held to: a report's
#: literature verdicts together, and each task's pairwise comparisons together (Holm).
ALPHA = 0.05
#: Label permutations per permutation test: p-values resolve to 1 / (PERMUTATIONS + 1).
PERMUTATIONS = 4999


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN entries are not tests and stay NaN): rejecting
    where the adjusted value is <= alpha keeps the chance of any false rejection among the
    tests <= alpha, whatever their dependence."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class OrderTest:
    """A permutation test that values follow a claimed order: the Jonckheere-Terpstra statistic
    (over every pair of seeds whose groups the claim orders, +1 where the seed of the group
    claimed higher is higher, -1 where lower) against its distribution when the values are
    exchanged at random among the groups of each stratum (no true difference between them).
    `p_agree` is the chance of a statistic at least as high under that exchange, `p_disagree`
    of one at least as low, both (1 + hits) / (1 + permutations), so neither is ever 0."""

    statistic: float
    p_agree: float
    p_disagree: float
    units: int


def order_test(
    values: Sequence[float],
    ranks: Sequence[int],
    strata: Sequence[Hashable] | None = None,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
) -> OrderTest:
    """Test that `values` (one per seed and group) rise as the claimed `ranks` fall (rank 0 is
    the group claimed highest; equal ranks are not ordered against each other), within each
    stratum (values are exchanged only inside their stratum)."""
    x = np.asarray(values, dtype=float)
    r = np.asarray(ranks)
    s = np.asarray(strata if strata is not None else [0] * len(x))
    u, v = np.nonzero((s[:, None] == s[None, :]) & (r[:, None] < r[None, :]))  # u claimed above v
    if len(u) == 0:
        return OrderTest(math.nan, math.nan, math.nan, len(x))
    observed = float(np.sign(x[u] - x[v]).sum())
    rng = np.random.default_rng(seed)
    members = [np.nonzero(s == key)[0] for key in np.unique(s)]
    hits_high = hits_low = 0
    for start in range(0, permutations, 500):
        n = min(500, permutations - start)
        shuffled = np.repeat(x[None, :], n, axis=0)  # (n, units)
        for rows in members:
            shuffled[:, rows] = rng.permuted(shuffled[:, rows], axis=1)
        statistic = np.sign(shuffled[:, u] - shuffled[:, v]).sum(axis=1)  # (n,)
        hits_high += int((statistic >= observed - 1e-9).sum())
        hits_low += int((statistic <= observed + 1e-9).sum())
    return OrderTest(
        observed,
        (1 + hits_high) / (1 + permutations),
        (1 + hits_low) / (1 + permutations),
        len(x),
    )


def mean_test(
    values: Iterable[float], low: float, high: float | None = None
) -> tuple[float, float]:
    """One-sample Student t tests on per-seed values. With `low` alone: (p that the mean exceeds
    `low`, p that it falls below it), one-sided each. With `high` too: (p that the mean lies
    inside (low, high), two one-sided tests, the larger p; p that it lies outside, the smaller
    of the two one-sided p). NaN with fewer than two values; a spread of zero is taken as 1e-12
    of the mean, so that identical seeds give a finite t statistic (and a p-value near 0)."""
    data = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    if len(data) < 2:
        return math.nan, math.nan
    mean = float(data.mean())
    spread = max(float(data.std(ddof=1)), 1e-12 * max(1.0, abs(mean)))
    scale = spread / math.sqrt(len(data))

    def above(bound: float) -> float:
        return float(stats.t.sf((mean - bound) / scale, len(data) - 1))

    if high is None:
        return above(low), 1.0 - above(low)
    inside = max(above(low), 1.0 - above(high))
    outside = min(1.0 - above(low), above(high))
    return inside, outside


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided Welch t test that two encodings' seed means differ (NaN with fewer than two
    seeds on either side). Where both spreads are zero the t statistic is undefined: the exact
    two-sided permutation p-value of the two samples is used instead (complete separation of
    n and m seeds: 2 / C(n + m, n))."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2 or len(y) < 2:
        return math.nan
    if x.std() == 0 and y.std() == 0:
        if x[0] == y[0]:
            return 1.0
        return min(1.0, 2.0 / math.comb(len(x) + len(y), len(x)))
    with warnings.catch_warnings():  # nearly equal seeds: scipy warns, the p-value stands
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_ind(x, y, equal_var=False).pvalue)


def letter_groups(order: Sequence[Hashable], separated: set[frozenset]) -> dict[Hashable, str]:
    """A compact letter display (Piepho 2004's insert-and-absorb): entries that share a letter
    were not separated by any pairwise test, entries in `separated` share none. `order` lists
    the entries best first; letters are given in that order, so "a" holds the best."""
    columns: list[set] = [set(order)]
    for pair in separated:
        i, j = tuple(pair)
        split = []
        for column in columns:
            if i in column and j in column:
                split += [column - {i}, column - {j}]
            else:
                split.append(column)
        columns = [c for c in split if c and not any(c < other for other in split)]
        columns = [c for k, c in enumerate(columns) if c not in columns[:k]]
    position = {name: k for k, name in enumerate(order)}
    columns.sort(key=lambda c: sorted(position[n] for n in c))
    letters = "abcdefghijklmnopqrstuvwxyz"
    return {name: "".join(letters[k] for k, c in enumerate(columns) if name in c) for name in order}


def separated_pairs(
    samples: Mapping[Hashable, Sequence[float]], alpha: float = ALPHA
) -> set[frozenset]:
    """The pairs of entries whose seed means a Welch t test separates, Holm-corrected over all
    pairs so that the chance of separating any pair with no true difference is <= alpha."""
    names = list(samples)
    pairs = [(a, b) for k, a in enumerate(names) for b in names[k + 1 :]]
    adjusted = holm([welch_p(samples[a], samples[b]) for a, b in pairs])
    return {frozenset(pair) for pair, p in zip(pairs, adjusted) if p <= alpha}


def sole_best(
    samples: Mapping[Hashable, Sequence[float]], separated: set[frozenset] | None = None
) -> Hashable | None:
    """The entry a report may call best: the first of `samples` (listed best first) when a
    pairwise test (`separated`, default separated_pairs(samples)) separates it from every other;
    None where one is not, or there is nothing to compare it with."""
    if len(samples) < 2:
        return None
    separated = separated_pairs(samples) if separated is None else separated
    top = next(iter(samples))
    return top if all(frozenset((top, o)) in separated for o in samples if o != top) else None
