"""Does the ranking hold as the model grows? For a sweep with a model-size axis: each
encoding's score and rank per size, Kendall's tau between the ranks at two sizes with a
bootstrap interval over seeds, and one sentence per task saying whether the ranking holds,
flips, or is not resolved at this budget."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from posbench.report.stats import BOOTSTRAP_REPLICATES, kendall_tau, seed_bootstrap_interval
from posbench.report.summary import (
    headline_per_seed,
    learned_in_distribution,
    multi_size_tasks,
    sized_tasks,
)

#: What a task's ranking score is, by the metric it is computed from: the overview's headline.
SCORED_BY = {
    "greedy_token_accuracy": "free-running token accuracy at 2x the longest training length",
    "lm_penalty": "minus the extrapolation penalty at 2x the longest training length (nats)",
}


@dataclass
class ScaleVerdict:
    """The ranking at the smallest size against the largest, for one task."""

    task: str
    small: str
    large: str
    encodings: int
    tau: float
    low: float
    high: float
    verdict: str  # "holds", "flips" or "not resolved"

    def sentence(self) -> str:
        if not self.small:
            return (
                f"{self.task}: not resolved at this budget; no encoding learned the task in "
                "distribution at two sizes."
            )
        if self.encodings < 3:
            return (
                f"{self.task}: not resolved at this budget; only {self.encodings} encoding(s) "
                f"learned the task at both {self.small} and {self.large}."
            )
        what = {
            "holds": "holds",
            "flips": "flips",
            "not resolved": "is not resolved at this budget",
        }[self.verdict]
        return (
            f"{self.task}: the ranking {what} from {self.small} to {self.large} (Kendall's tau "
            f"{self.tau:.2f}, 95% bootstrap interval over seeds [{self.low:.2f}, {self.high:.2f}], "
            f"{self.encodings} encodings that learned the task at both sizes)."
        )


def scale_scores(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, model, encoding label, seed) for tasks run at several sizes: the
    score that ranks encodings (higher is better), the overview's headline per seed, and the
    model's parameter count. Tasks with answers score free-running token accuracy at 2x the
    longest training length; language tasks minus the extrapolation penalty there (nats). Runs
    of an encoding that did not learn the task in distribution at that size are left out."""
    columns = ["task", "model", "encoding_label", "seed", "score", "parameters", "scored_by"]
    trained = frame[frame["task"].isin(multi_size_tasks(frame)) & frame["model"].notna()]
    if trained.empty:
        return pd.DataFrame(columns=columns)
    sized = sized_tasks(trained)
    learned = learned_in_distribution(sized)
    keep = [bool(learned.get(key, True)) for key in zip(sized["task"], sized["encoding_label"])]
    trained = trained[keep]
    keys = ["task", "encoding_label", "seed"]
    parts = []
    for model, runs in trained.groupby("model"):
        scores = headline_per_seed(runs)
        scores["score"] = scores["value"].where(scores["metric"] != "lm_penalty", -scores["value"])
        parameters = runs[runs["metric"] == "parameters"].groupby(keys)["value"].mean()
        scores = scores.join(parameters.rename("parameters"), on=keys)
        parts.append(scores.assign(model=model, scored_by=scores["metric"].map(SCORED_BY)))
    if not parts:
        return pd.DataFrame(columns=columns)
    table = pd.concat(parts, ignore_index=True)
    return table.dropna(subset=["score"]).reindex(columns=columns).reset_index(drop=True)


def ranks_by_size(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (task, model, encoding label): the mean score over seeds, its rank among the
    encodings at that size (1 = best; ties share the average rank), seeds and parameters."""
    grouped = scores.groupby(["task", "model", "encoding_label"])
    table = grouped.agg(
        score=("score", "mean"), seeds=("seed", "nunique"), parameters=("parameters", "mean")
    ).reset_index()
    table["rank"] = table.groupby(["task", "model"])["score"].rank(
        ascending=False, method="average"
    )
    return table


def tau_between(
    scores: pd.DataFrame, task: str, small: str, large: str, replicates: int, seed: int = 0
) -> tuple[float, float, float, int]:
    """Kendall's tau between the encodings' mean scores at sizes `small` and `large` on `task`,
    with the 2.5 and 97.5 percentiles of its bootstrap distribution (seeds of each encoding
    and size drawn with replacement), and the number of encodings scored at both sizes."""
    rows = scores[(scores["task"] == task) & scores["model"].isin([small, large])]
    groups = {key: g["score"].to_numpy() for key, g in rows.groupby(["model", "encoding_label"])}
    labels = sorted({label for _, label in groups})
    both = [label for label in labels if (small, label) in groups and (large, label) in groups]
    groups = {key: values for key, values in groups.items() if key[1] in both}

    def tau(means: dict) -> float:
        return kendall_tau([means[(small, b)] for b in both], [means[(large, b)] for b in both])

    return (*seed_bootstrap_interval(groups, tau, replicates, seed), len(both))


def tau_cells(tau: float, low: float, high: float) -> tuple[str, str]:
    """Kendall's tau and its interval as table cells; a tau that is not defined (fewer than two
    encodings scored at both sizes, or one size scoring them all alike) says so."""
    if math.isnan(tau):
        return "undefined", "fewer than 2 encodings scored at both sizes, or all scored alike"
    return f"{tau:.2f}", f"[{low:.2f}, {high:.2f}]"


def sizes_by_parameters(scores: pd.DataFrame, task: str) -> list[str]:
    """The model sizes `task` ran at, smallest first (by their median parameter count)."""
    rows = scores[scores["task"] == task]
    return [str(m) for m in rows.groupby("model")["parameters"].median().sort_values().index]


def tau_table(scores: pd.DataFrame, replicates: int = BOOTSTRAP_REPLICATES) -> pd.DataFrame:
    """Kendall's tau with its bootstrap interval for every pair of sizes of every task (the
    smaller first), and how many encodings both sizes scored."""
    rows = []
    for task in sorted(scores["task"].unique()):
        sizes = sizes_by_parameters(scores, task)
        for i, small in enumerate(sizes):
            for large in sizes[i + 1 :]:
                tau, low, high, n = tau_between(scores, task, small, large, replicates)
                rows.append(
                    {"task": task, "small": small, "large": large, "tau": tau, "low": low,
                     "high": high, "encodings": n}
                )  # fmt: skip
    return pd.DataFrame(rows, columns=["task", "small", "large", "tau", "low", "high", "encodings"])


def scale_verdicts(
    taus: pd.DataFrame, scores: pd.DataFrame, tasks: list[str] | None = None
) -> list[ScaleVerdict]:
    """Per task (`tasks`, default those scored): the ranking at its smallest model (by
    parameters) against its largest; "holds" when the tau interval lies above zero, "flips"
    when below, else "not resolved" (also for a task no two sizes scored)."""
    verdicts = []
    for task in tasks if tasks is not None else sorted(taus["task"].unique()):
        sizes = sizes_by_parameters(scores, task)
        if len(sizes) < 2:
            nan = math.nan
            verdicts.append(ScaleVerdict(task, "", "", 0, nan, nan, nan, "not resolved"))
            continue
        row = taus[(taus["task"] == task) & (taus["small"] == sizes[0])]
        row = row[row["large"] == sizes[-1]].iloc[0]
        resolved = row["encodings"] >= 3
        if resolved and row["low"] > 0:
            verdict = "holds"
        elif resolved and row["high"] < 0:
            verdict = "flips"
        else:
            verdict = "not resolved"
        verdicts.append(
            ScaleVerdict(
                task, sizes[0], sizes[-1], int(row["encodings"]), float(row["tau"]),
                float(row["low"]), float(row["high"]), verdict,
            )
        )  # fmt: skip
    return verdicts
