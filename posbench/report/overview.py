"""The answer at a glance: one row per task x encoding with the task's headline metric, its
interval and rank group, the effective length and the cost. summary.csv, the terminal table and
the report's first screen all show this one table, so every reader gets the same answer."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from posbench.report.stats import Interval, letter_groups, separated_pairs, sole_best
from posbench.report.summary import (
    comparison_kind,
    cost_columns,
    effective_length_text,
    encoding_order,
    evaluation_variants,
    headline,
    headline_per_seed,
    learned_in_distribution,
    lm_headline,
)


@dataclass(frozen=True)
class HeadlineMetric:
    """What a task is ranked by in the overview."""

    column: str  # the name in summary.csv's headline_metric column
    title: str  # how tables and figures name it, with its unit
    short: str  # the terminal's name for it
    higher_is_better: bool
    digits: int

    def text(self, value: float, low: float, high: float) -> str:
        """The value with the half-width of its interval, as every overview prints it."""
        return Interval(value, low, high, 0).text(self.digits)


#: Tasks with answers are ranked by free-running token accuracy at twice the longest training
#: length (graded, unlike exact match, and free of teacher forcing); loss-by-position tasks by
#: the extrapolation penalty there.
GREEDY_AT_2X = HeadlineMetric(
    "greedy_token_accuracy_at_2x", "free-running token accuracy at 2x", "token acc. 2x", True, 2
)
PENALTY_AT_2X = HeadlineMetric(
    "lm_penalty_at_2x", "extrapolation penalty at 2x (nats)", "penalty 2x, nats", False, 3
)
HEADLINE_METRICS = {m.column: m for m in (GREEDY_AT_2X, PENALTY_AT_2X)}

OVERVIEW_COLUMNS = [
    "task",
    "encoding_label",
    "comparison",
    "headline_metric",
    "value",
    "low",
    "high",
    "seeds",
    "learned",
    "rank_group",
    "best",
    "same_as",
    "chance",
    "untrained_share",
    "effective_length",
    "effective_length_low",
    "effective_length_high",
    "effective_length_censored",
    "latency_ratio",
    "latency_at",
    "latency_noisy",
    "memory_ratio",
    "memory_at",
]


def overview(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, encoding label) that has a headline metric: its mean over seeds with
    the 95% t interval (NaN bounds with one seed), whether the model learned the task in
    distribution, its rank group among the trained encodings that did, as letters (a compact
    letter display: two encodings share a letter unless a Welch t test over their seeds,
    Holm-corrected over the task's pairs, separates them; "a" holds the best; none for an
    unlearned model or an evaluation variant, which is shown but not ranked), `best` where the
    top encoding is separated from every other, the chance level, the share of query-key
    pairs at 2x that read a parameter row training never reached, the effective length, and
    the fwd+bwd latency and peak-memory ratios to nope at the stated sequence length
    (latency_noisy where other processes disturbed the timing)."""
    answers, lm = headline(frame), lm_headline(frame)
    untrained = (
        answers.set_index(["task", "encoding_label"])["untrained_at_2x"]
        if not answers.empty
        else pd.Series(dtype=float)
    )
    learned = learned_in_distribution(frame)
    comparisons = comparison_kind(frame)
    records = []
    for row in answers.to_dict("records") if not answers.empty else []:
        if pd.isna(row["greedy_at_2x"]):
            continue
        records.append(
            _record(row, GREEDY_AT_2X, "greedy_at_2x", learned, untrained)
            | {"chance": row["chance_at_2x"]}
        )
    for row in lm.to_dict("records") if not lm.empty else []:
        if pd.isna(row["penalty_2x"]):
            continue
        records.append(
            _record(row, PENALTY_AT_2X, "penalty_2x", learned, untrained) | {"chance": math.nan}
        )
    table = pd.DataFrame(records, columns=[c for c in OVERVIEW_COLUMNS if c not in _COSTS])
    if table.empty:
        return table.reindex(columns=OVERVIEW_COLUMNS)
    table["comparison"] = table["task"].map(comparisons)
    table["rank_group"] = pd.Series([pd.NA] * len(table), dtype="object")
    table["best"] = False
    per_seed = headline_per_seed(frame).groupby(["task", "encoding_label"])["value"]
    seeds = {key: values.dropna().to_numpy() for key, values in per_seed}
    variants = evaluation_variants(frame)
    for task, group in table.groupby("task"):
        metric = HEADLINE_METRICS[group["headline_metric"].iloc[0]]
        ranked = group[group["learned"] & ~group["encoding_label"].isin(variants.get(task, ()))]
        ranked = ranked.sort_values("value", ascending=not metric.higher_is_better)
        samples = {label: seeds.get((task, label), []) for label in ranked["encoding_label"]}
        separated = separated_pairs(samples)
        letters = letter_groups(list(samples), separated)
        table.loc[ranked.index, "rank_group"] = [letters[label] for label in samples]
        if sole_best(samples, separated) is not None:
            table.loc[ranked.index[0], "best"] = True
    costs = cost_columns(frame)
    table = table.merge(costs, on="encoding_label", how="left").reindex(columns=OVERVIEW_COLUMNS)
    order = encoding_order(table["encoding_label"])
    table = table.sort_values(
        ["task", "encoding_label"],
        key=lambda c: c.map(order.index) if c.name == "encoding_label" else c,
    ).reset_index(drop=True)
    table["same_as"] = _same_as(table, _trained_models(frame))
    return table


def unranked_tasks(frame: pd.DataFrame, table: pd.DataFrame) -> list[str]:
    """One sentence per trained task the overview has no row for: its headline is read at 2x
    the longest training length, and no evaluated length reaches it."""
    trained = frame[frame["task"].notna() & frame["eval_len"].notna()]
    ranked = set(table["task"]) if not table.empty else set()
    sentences = []
    for task, rows in trained.groupby("task"):
        if task in ranked:
            continue
        longest, trained_to = rows["eval_len"].astype(float).max(), rows["train_len_max"].max()
        sentences.append(
            f"{task} is not in the overview: its headline is read at 2x the longest training "
            f"length ({2 * trained_to:g}), and its longest evaluated length is {longest:g}; add "
            f"an evaluation length of at least {2 * trained_to:g} to rank it."
        )
    return sentences


def _trained_models(frame: pd.DataFrame) -> dict[tuple[str, str], tuple]:
    """(task, label) -> its runs' final training losses by seed: equal only for labels that
    read the same trained models (an evaluation variant and its base)."""
    trained = frame[frame["metric"] == "train_loss_final"]
    return {
        key: tuple(sorted(zip(group["seed"], group["value"])))
        for key, group in trained.groupby(["task", "encoding_label"])
    }


def _same_as(table: pd.DataFrame, models: dict[tuple[str, str], tuple]) -> list[str]:
    """For each row, the earlier label that reads the same trained models and whose headline
    it repeats to the last digit ("" for none): an evaluation variant (positions restarted
    per segment, say) that changes only measurements this headline does not read."""
    first: dict[tuple, str] = {}
    same = []
    for row in table.to_dict("records"):
        label = row["encoding_label"]
        numbers = (row["value"], row["low"], row["high"], row["effective_length"])
        model = models.get((row["task"], label), label)  # unknown: matches nothing else
        key = (row["task"], model, *(None if pd.isna(x) else float(x) for x in numbers))
        earlier = first.setdefault(key, label)
        same.append(earlier if earlier != label else "")
    return same


#: What "(= X)" after a label means, in the terminal and the report.
SAME_AS_NOTE = (
    "(= X): the same headline as X to the last digit: the same trained model, read under "
    "evaluation options this measurement does not use"
)


def overview_label(row: dict) -> str:
    """The encoding's label as the overview prints it, naming the label whose headline it
    repeats: "sinusoidal-restart (= sinusoidal)"."""
    same = row.get("same_as")
    return (
        f"{row['encoding_label']} (= {same})"
        if isinstance(same, str) and same
        else row["encoding_label"]
    )


_COSTS = ("latency_ratio", "latency_at", "latency_noisy", "memory_ratio", "memory_at")


def _record(
    row: dict,
    metric: HeadlineMetric,
    column: str,
    learned: dict[tuple[str, str], bool],
    untrained: pd.Series,
) -> dict[str, object]:
    key = (row["task"], row["encoding_label"])
    return {
        "task": row["task"],
        "encoding_label": row["encoding_label"],
        "headline_metric": metric.column,
        "value": row[column],
        "low": row[f"{column}_low"],
        "high": row[f"{column}_high"],
        "seeds": int(row["seeds"]),
        "learned": bool(learned.get(key, True)),
        "untrained_share": float(untrained.get(key, math.nan)),
        "effective_length": row["effective_length"],
        "effective_length_low": row["effective_length_low"],
        "effective_length_high": row["effective_length_high"],
        "effective_length_censored": row.get("effective_length_censored", math.nan),
    }


def overview_cells(row: dict) -> dict[str, str]:
    """A row of the overview as the terminal and the report print it: the headline with its
    interval (and † where it reads untrained parameter rows), the rank group's letters ("-" for
    a model that did not learn the task, "variant" for an evaluation variant, shown unranked),
    the effective length and the cost ratios ("" where not measured, "(noisy)" where the
    timing was disturbed)."""
    metric = HEADLINE_METRICS[row["headline_metric"]]
    group = row["rank_group"]
    share = row["untrained_share"]
    flag = row["latency_noisy"]
    noisy = " (noisy)" if pd.notna(flag) and bool(flag) else ""
    return {
        "headline": metric.text(row["value"], row["low"], row["high"])
        + (" †" if not pd.isna(share) and share > 0 else ""),
        "group": str(group)
        if not pd.isna(group)
        else "variant"
        if bool(row.get("learned", False))
        else "-",
        "effective_length": effective_length_text(row),
        "latency": "" if pd.isna(row["latency_ratio"]) else f"{row['latency_ratio']:.2f}x{noisy}",
        "memory": "" if pd.isna(row["memory_ratio"]) else f"{row['memory_ratio']:.2f}x",
    }
