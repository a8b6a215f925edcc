"""Papers' own per-task numbers set beside this sweep's: a table per task (theirs, ours,
difference) and the rank correlation across encodings with a bootstrap interval over seeds.
The numbers live in data files (published/*.csv: task, encoding, metric, value, source), each
row citing where it was read, so a reader can check every one."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from importlib import resources

import pandas as pd

from posbench.report.stats import (
    BOOTSTRAP_REPLICATES,
    SHARE_BOUNDS,
    kendall_tau,
    mean_interval,
    seed_bootstrap_interval,
)
from posbench.report.summary import learned_in_distribution


def published_numbers() -> pd.DataFrame:
    """Every data file's rows, with the file's stem as `paper` (a copy: callers may change it)."""
    return _read_published().copy()


@functools.cache
def _read_published() -> pd.DataFrame:
    folder = resources.files(__package__) / "published"
    frames = [
        pd.read_csv(folder / entry.name).assign(paper=entry.name.removesuffix(".csv"))
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".csv")
    ]
    return pd.concat(frames, ignore_index=True)


def unseen_scores(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (task, encoding, seed): the mean of `metric` over the full-context lengths past the
    longest training length L up to 2L (the papers' unseen range: 21..40 after training on 20),
    for each sweep entry labelled with its encoding's name (label = name). A suite may give
    that entry options of its own: the standard suite's `t5` is the fitted T5, its paper
    defaults run as `t5-paper`; the kazemnejad suite runs every encoding at its defaults, as
    the paper did."""
    rows = frame[
        frame["task"].notna()
        & (frame["metric"] == metric)
        & frame["mem_len"].isna()
        & (frame["encoding_label"] == frame["encoding"])
    ]
    lengths, longest = rows["eval_len"].astype(float), rows["train_len_max"].astype(float)
    rows = rows[(lengths > longest) & (lengths <= 2 * longest)]
    scores = rows.groupby(["task", "encoding", "seed"])["value"].mean()
    return scores.rename("value").reset_index()


@dataclass
class PaperComparison:
    """One task of one paper beside this sweep: per encoding theirs, ours (mean over seeds
    with its interval), the difference and whether our runs learned the task in distribution;
    Kendall's tau between the two orders (over the encodings that learned) with the 2.5-97.5
    percentiles of its bootstrap over our seeds."""

    paper: str
    task: str
    metric: str
    source: str
    rows: list[dict[str, float | str]] = field(default_factory=list)
    tau: float = math.nan
    low: float = math.nan
    high: float = math.nan


def beside_papers(
    frame: pd.DataFrame, replicates: int = BOOTSTRAP_REPLICATES
) -> list[PaperComparison]:
    """A comparison for every (paper, task) whose task and at least two of whose encodings
    this sweep ran. An encoding that did not learn the task in distribution is listed but
    left out of the rank correlation."""
    comparisons = []
    published = published_numbers()
    learned_runs = learned_in_distribution(frame)
    for (paper, task, metric), theirs in published.groupby(["paper", "task", "metric"]):
        ours = unseen_scores(frame, str(metric))
        ours = ours[ours["task"] == task]
        groups = {
            name: group["value"].to_numpy()
            for name, group in ours.groupby("encoding")
            if name in set(theirs["encoding"])
        }
        if len(groups) < 2:
            continue
        published_value = theirs.set_index("encoding")["value"]
        names = sorted(groups, key=lambda n: -published_value[n])
        learned = {n: bool(learned_runs.get((task, n), True)) for n in names}
        comparison = PaperComparison(str(paper), str(task), str(metric), theirs["source"].iloc[0])
        for name in names:
            # the papers' scores are shares: the interval stays inside 0..1
            interval = mean_interval(groups[name], bounds=SHARE_BOUNDS)
            comparison.rows.append(
                {
                    "encoding": name,
                    "theirs": float(published_value[name]),
                    "ours": interval.mean,
                    "ours_low": interval.low,
                    "ours_high": interval.high,
                    "difference": interval.mean - float(published_value[name]),
                    "seeds": interval.n,
                    "learned": learned[name],
                }
            )
        names = [n for n in names if learned[n]]  # a model that did not learn is not ranked
        groups = {n: groups[n] for n in names}
        reference = [float(published_value[n]) for n in names]

        def tau(means: dict) -> float:
            return kendall_tau(reference, [means[n] for n in names])

        comparison.tau, comparison.low, comparison.high = seed_bootstrap_interval(
            groups, tau, replicates
        )
        comparisons.append(comparison)
    return comparisons
