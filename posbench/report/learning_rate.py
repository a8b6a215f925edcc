"""Does the ranking survive another learning rate? For a sweep that trains the same task at
several learning rates (the lr-probe suite): each encoding's in-distribution validation score
and headline per rate, the rate validation picks for it (the papers' best of three), and per
task whether the order at the picked rates is the order at the suite's own rate."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd

from posbench.report.overview import HEADLINE_METRICS
from posbench.report.stats import kendall_tau
from posbench.report.summary import (
    headline,
    headline_per_seed,
    learned_in_distribution,
    lm_headline,
    task_names,
)

#: The columns of probe_scores, one row per (task label, encoding label).
SCORE_COLUMNS = [
    "task_name",
    "task",
    "lr",
    "encoding_label",
    "learned",
    "validation",
    "steps_to_threshold",
    "score",
    "metric",
]
#: What the validation score is, by the headline metric of the task.
VALIDATED_BY = {
    "greedy_token_accuracy": "exact match within the training lengths",
    "lm_penalty": "minus the loss above the task's floor within the training length (nats)",
}


def task_learning_rates(config: Mapping[str, Any]) -> dict[str, float]:
    """Task label -> the learning rate its runs trained at, from a sweep's stored config: the
    task's own `train.lr`, else the sweep's."""
    default = config.get("train", {}).get("lr")
    rates = {}
    for task in config.get("tasks", []):
        rate = task.get("train", {}).get("lr", default)
        if rate is not None:
            rates[str(task.get("label") or task["name"])] = float(rate)
    return rates


def varied_tasks(frame: pd.DataFrame, rates: Mapping[str, float]) -> list[str]:
    """The registered tasks the results hold at more than one learning rate."""
    names = task_names(frame)
    by_name: dict[str, set[float]] = {}
    for label, name in names.items():
        if label in rates:
            by_name.setdefault(name, set()).add(rates[label])
    return sorted(name for name, seen in by_name.items() if len(seen) > 1)


def probe_scores(frame: pd.DataFrame, rates: Mapping[str, float]) -> pd.DataFrame:
    """One row per (task label, encoding label) of the tasks run at several learning rates: the
    registered task, the rate, whether the model learned the task in distribution, its
    validation score (exact match within the training lengths, or minus the in-distribution
    loss above the floor for a language task; higher is better), the steps it took to its
    threshold (NaN where it hit the cap), and its headline score (the overview's headline, made
    higher-is-better), all means over seeds."""
    names = task_names(frame)
    tasks = set(varied_tasks(frame, rates))
    labels = [label for label, name in names.items() if name in tasks and label in rates]
    runs = frame[frame["task"].isin(labels)]
    if "variant_of" in runs:
        runs = runs[runs["variant_of"].isna()]
    if runs.empty:
        return pd.DataFrame(columns=SCORE_COLUMNS)
    learned = learned_in_distribution(runs)
    keys = ["task", "encoding_label"]
    scores = headline_per_seed(runs)
    scores["score"] = scores["value"].where(scores["metric"] != "lm_penalty", -scores["value"])
    table = scores.groupby(keys).agg(score=("score", "mean"), metric=("metric", "first"))
    validation = pd.concat(
        [
            headline(runs).set_index(keys)["in_distribution"],
            -lm_headline(runs).set_index(keys)["excess_in_distribution"],
        ]
    ).dropna()
    table["validation"] = validation[~validation.index.duplicated()]
    steps = runs[runs["metric"] == "steps_to_threshold"].groupby(keys)["value"].mean()
    table["steps_to_threshold"] = steps
    table = table.reset_index()
    table["task_name"] = table["task"].map(names)
    table["lr"] = table["task"].map(rates)
    keys_of = zip(table["task"], table["encoding_label"])
    table["learned"] = [learned.get(key, False) for key in keys_of]
    return table.reindex(columns=SCORE_COLUMNS).sort_values(["task_name", "encoding_label", "lr"])


def picked_rates(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (task_name, encoding label): the row of the rate in-distribution validation picks, as
    Deletang et al. and Ruoss et al. pick the best of three: a rate at which the model learned the
    task first; then, where training stops at a validation threshold, the fewest steps to it
    (every early-stopped run ends just past the threshold, so their validation scores differ by
    sampling noise alone); then the best validation score (what decides at equal compute, where
    no run stops early). An encoding that learned the task at no rate keeps a row, with learned
    False."""
    ordered = scores.assign(
        unlearned=~scores["learned"].astype(bool),
        steps=scores["steps_to_threshold"].fillna(math.inf),
        minus_validation=-scores["validation"],
    ).sort_values(["unlearned", "steps", "minus_validation", "lr"])
    picked = ordered.groupby(["task_name", "encoding_label"], sort=False).head(1)
    return picked.reindex(columns=SCORE_COLUMNS).sort_values(["task_name", "encoding_label"])


def suite_groups(overview_table: pd.DataFrame) -> dict[tuple[str, str], tuple[str, float]]:
    """(task, encoding label) -> rank-group letters and score (higher is better) from a suite's
    overview (summary.csv's rows), for the tasks ranked there; variants carry no group."""
    out = {}
    for row in overview_table.to_dict("records"):
        letters = row.get("rank_group")
        if not isinstance(letters, str) or not letters or pd.isna(row.get("value")):
            continue
        value = float(row["value"])
        score = value if HEADLINE_METRICS[row["headline_metric"]].higher_is_better else -value
        out[(str(row["task"]), str(row["encoding_label"]))] = (letters, score)
    return out


@dataclass
class RateVerdict:
    """The order at each encoding's picked rate against the order at the suite's rate, for one
    task. `reversed_pairs` are pairs a seed test separated in the suite (`separated`) whose order
    the picked rates reverse."""

    task: str
    suite_rate: float
    encodings: int
    tau: float
    moved: list[str] = field(default_factory=list)  # encodings whose picked rate is another
    learned_elsewhere: list[str] = field(default_factory=list)
    reversed_pairs: list[tuple[str, str]] = field(default_factory=list)
    checked_pairs: int | None = None  # None: no suite groups were given

    @property
    def changes(self) -> bool | None:
        """Whether the ranking changes with the rate: an encoding learns the task only at another
        rate, or a separated pair swaps; None where no separated pairs were given to check."""
        if self.learned_elsewhere or self.reversed_pairs:
            return True
        return None if self.checked_pairs is None else False

    def sentence(self) -> str:
        tau = "undefined" if math.isnan(self.tau) else f"{self.tau:.2f}"
        text = (
            f"{self.task}: validation picks another rate than {self.suite_rate:g} for "
            f"{len(self.moved)} encoding(s) ({', '.join(self.moved) or 'none'}); Kendall's "
            f"tau between the order at the picked rates and at {self.suite_rate:g} is {tau} over "
            f"{self.encodings} encodings that learned the task at both."
        )
        if self.learned_elsewhere:
            text += (
                f" Learned the task in distribution only at another rate: "
                f"{', '.join(self.learned_elsewhere)}."
            )
        if self.checked_pairs is not None:
            swapped = "; ".join(f"{a} now above {b}" for a, b in self.reversed_pairs)
            text += (
                f" Of the {self.checked_pairs} pairs the suite's seeds separate, "
                f"{len(self.reversed_pairs)} swap order{f' ({swapped})' if swapped else ''}."
            )
        verdict = {
            True: " The ranking changes with the learning rate.",
            False: " The ranking the suite publishes survives the rate validation picks.",
            None: "",
        }[self.changes]
        return text + verdict


def rate_verdicts(
    scores: pd.DataFrame,
    suite_rate: float,
    suite: Mapping[tuple[str, str], tuple[str, float]] | None = None,
) -> list[RateVerdict]:
    """Per task: the picked rates against `suite_rate`. `suite` maps (task name, encoding label)
    to the suite's rank-group letters and score (see suite_groups); two encodings that share no
    letter were separated by a test over the suite's seeds, and only such a pair whose order at
    the picked rates is the reverse of the suite's counts as a change of order."""
    picked = picked_rates(scores)
    verdicts = []
    for task, rows in picked.groupby("task_name"):
        at_suite = scores[(scores["task_name"] == task) & (scores["lr"] == suite_rate)]
        at_suite = at_suite.set_index("encoding_label")
        rows = rows.set_index("encoding_label")
        both = [
            label
            for label in rows.index
            if label in at_suite.index
            and bool(rows.at[label, "learned"])
            and bool(at_suite.at[label, "learned"])
        ]
        tau = kendall_tau(
            [float(rows.at[b, "score"]) for b in both],
            [float(at_suite.at[b, "score"]) for b in both],
        )
        verdict = RateVerdict(
            task=str(task),
            suite_rate=suite_rate,
            encodings=len(both),
            tau=tau,
            moved=[
                label
                for label in rows.index
                if bool(rows.at[label, "learned"]) and rows.at[label, "lr"] != suite_rate
            ],
            learned_elsewhere=[
                f"{label} ({rows.at[label, 'lr']:g})"
                for label in rows.index
                if bool(rows.at[label, "learned"])
                and label in at_suite.index
                and not bool(at_suite.at[label, "learned"])
            ],
        )
        if suite is not None:
            letters = {b: suite.get((str(task), b), ("", math.nan))[0] for b in both}
            pairs = [
                (a, b)
                for i, a in enumerate(both)
                for b in both[i + 1 :]
                if letters[a] and letters[b] and not set(letters[a]) & set(letters[b])
            ]
            verdict.checked_pairs = len(pairs)
            for a, b in pairs:
                before = suite[(str(task), a)][1] - suite[(str(task), b)][1]
                after = rows.at[a, "score"] - rows.at[b, "score"]
                if before * after < 0:
                    verdict.reversed_pairs.append((a, b) if after > 0 else (b, a))
        verdicts.append(verdict)
    return verdicts
