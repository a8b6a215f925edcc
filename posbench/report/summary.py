"""Headline numbers from tidy results: in-distribution and beyond-length accuracy per
encoding and task, averaged over seeds. Shared by the terminal table and the report."""

from __future__ import annotations

import math

from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from posbench.encodings import BUILTINS
from posbench.tasks import REGISTRY as TASKS
from posbench.experiment.config import UNDERTRAINED_BELOW, UNLEARNED_EXCESS
from posbench.report.stats import (
    GENERALISES_AT,
    SHARE_BOUNDS,
    Interval,
    mean_interval,
    percentile_interval,
    seed_resamples,
)


#: How suites label an encoding trained with randomized positions: its name plus this suffix,
#: beside the same encoding with default options (its name as label).
RANDOM_SUFFIX = "+random"


def encoding_order(labels: Iterable[str]) -> list[str]:
    """Built-in encodings first in their usual order, then the rest alphabetically."""
    return sorted(
        set(labels), key=lambda s: (BUILTINS.index(s) if s in BUILTINS else len(BUILTINS), s)
    )


def multi_size_tasks(frame: pd.DataFrame) -> list[str]:
    """The tasks the results hold at more than one model size."""
    trained = frame[frame["task"].notna() & frame["model"].notna()]
    sizes = trained.groupby("task")["model"].nunique()
    return sorted(str(task) for task in sizes[sizes > 1].index)


def sized_tasks(frame: pd.DataFrame) -> pd.DataFrame:
    """The results with each task that ran at several model sizes split by size: its task label
    becomes ``copy @ d32 L4 H4``, so every table and figure keeps sizes apart (seeds of one size
    are pooled, sizes never are). Tasks run at one size keep their label."""
    split = frame["task"].isin(multi_size_tasks(frame)) & frame["model"].notna()
    if not split.any():
        return frame
    frame = frame.copy()
    frame.loc[split, "task"] = frame.loc[split, "task"] + " @ " + frame.loc[split, "model"]
    return frame


def _accuracy_rows(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    rows = frame[(frame["metric"] == metric) & frame["eval_len"].notna()]
    return rows.assign(eval_len=rows["eval_len"].astype(int))


def length_at(frame: pd.DataFrame, multiple: float, column: str = "eval_len") -> pd.Series:
    """Per row, the smallest evaluated length (or, with column="position", token position)
    >= multiple x train_len_max of that task."""
    evaluated = frame.groupby("task")[column].unique()

    def pick(row: pd.Series) -> float:
        target = multiple * row["train_len_max"]
        candidates = sorted(e for e in evaluated[row["task"]] if e >= target)
        return candidates[0] if candidates else math.nan

    return frame.apply(pick, axis=1) if len(frame) else pd.Series(dtype=float)


#: The headline's accuracy columns: (column, metric, which lengths). token_* is teacher-forced
#: (the model reads the true answer so far); greedy_* is free running (it reads its own).
HEADLINE_COLUMNS = (
    ("in_distribution", "exact_match", "in"),
    ("at_2x", "exact_match", 2),
    ("at_4x", "exact_match", 4),
    ("token_at_2x", "token_accuracy", 2),
    ("token_at_4x", "token_accuracy", 4),
    ("greedy_at_2x", "greedy_token_accuracy", 2),
    ("greedy_at_4x", "greedy_token_accuracy", 4),
    ("longest_cache", "exact_match", "cache"),
)
#: Effective length: the longest evaluated length up to which (every shorter evaluated length
#: included) greedy token accuracy stays at or above this, in the spirit of RULER's effective
#: length.
EFFECTIVE_AT = 0.9
#: For loss by position: the longest position up to which the extrapolation penalty stays at or
#: below this many nats.
EFFECTIVE_PENALTY = 0.1


def _effective(
    lengths: list[float], values: list[float], thresholds: list[float], higher_is_better: bool
) -> tuple[float, bool]:
    """Where the metric first crosses `threshold` along the sorted `lengths`: between the last
    evaluated length at which it held (with every shorter one) and the first at which it failed,
    linearly interpolated, so the answer is not a point of the evaluation grid. 0 when it fails
    at the shortest length; the longest length, censored (True: the model held everywhere it
    was evaluated, so its real limit is longer), when it never fails. A NaN value fails without
    interpolation."""
    previous: tuple[float, float, float] | None = None
    for length, value, threshold in sorted(zip(lengths, values, thresholds)):
        holds = not math.isnan(value) and (
            value >= threshold if higher_is_better else value <= threshold
        )
        if not holds:
            if previous is None:
                return 0.0, False
            if math.isnan(value):
                return previous[0], False
            start, held, before = previous  # the margin above (or below) the threshold
            fraction = (held - before) / ((held - before) - (value - threshold))
            return start + fraction * (length - start), False
        previous = (length, value, threshold)
    return (previous[0], True) if previous else (math.nan, False)


def effective_lengths(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (task, encoding_label): the effective length (full context) as the mean over seeds
    with its 95% t interval cut to the evaluated range: for tasks with answers, where greedy
    token accuracy falls below EFFECTIVE_AT of the way from chance to 1 (the stored chance
    level at each length, 0 where none is stored); for loss by position, where the penalty rises
    above EFFECTIVE_PENALTY nats; interpolated between the evaluated lengths around the
    crossing (see _effective). `effective_length_censored` is the share of seeds that held at
    every evaluated length: their limit lies beyond the longest one, which reports print as
    ">= L". In the task's length unit."""
    records = []
    for metric, threshold, higher_is_better, x in (
        ("greedy_token_accuracy", EFFECTIVE_AT, True, "eval_len"),
        ("lm_penalty", EFFECTIVE_PENALTY, False, "position"),
    ):
        rows = frame[
            (frame["metric"] == metric)
            & frame["mem_len"].isna()
            & frame[x].notna()
            & frame["task"].notna()
        ]
        chance = frame[(frame["metric"] == "chance_token_accuracy") & frame["mem_len"].isna()]
        chance = chance.groupby(["task", "encoding_label", "seed", "eval_len"])["value"].mean()
        for (task, label), group in rows.groupby(["task", "encoding_label"]):
            per_seed = []
            for seed, g in group.groupby("seed"):
                lengths = g[x].astype(float).tolist()
                levels = (
                    [float(chance.get((task, label, seed, n), 0.0)) for n in g["eval_len"]]
                    if metric == "greedy_token_accuracy"
                    else [0.0] * len(g)
                )
                thresholds = (
                    [c + threshold * (1 - c) for c in levels]
                    if higher_is_better
                    else [threshold] * len(g)
                )
                per_seed.append(
                    _effective(
                        lengths, g["value"].astype(float).tolist(), thresholds, higher_is_better
                    )
                )
            lengths = [length for length, _ in per_seed]
            interval = mean_interval(lengths, bounds=(0.0, float(group[x].max())))
            records.append(
                {
                    "task": task,
                    "encoding_label": label,
                    "effective_length": interval.mean,
                    "effective_length_low": interval.low,
                    "effective_length_high": interval.high,
                    "effective_length_censored": sum(c for _, c in per_seed) / len(per_seed),
                    "effective_metric": metric,
                }
            )
    return pd.DataFrame(
        records,
        columns=[
            "task",
            "encoding_label",
            "effective_length",
            "effective_length_low",
            "effective_length_high",
            "effective_length_censored",
            "effective_metric",
        ],
    )


#: The effective-length columns the headline tables carry.
EFFECTIVE_COLUMNS = (
    "effective_length",
    "effective_length_low",
    "effective_length_high",
    "effective_length_censored",
)


def effective_length_text(record: Mapping[str, Any], digits: int = 0) -> str:
    """The effective length as reports print it: ">= L" where every seed held to the longest
    evaluated length L; else the mean with its interval, and how many seeds held to the end
    where some did (the mean then understates)."""
    value = record.get("effective_length")
    if value is None or pd.isna(value):
        return "n/a"
    censored = record.get("effective_length_censored")
    censored = 0.0 if censored is None or pd.isna(censored) else float(censored)
    if censored >= 1.0:
        return f">= {value:.{digits}f}"
    text = Interval(value, record["effective_length_low"], record["effective_length_high"], 0).text(
        digits
    )
    return text + (f" ({censored:.0%} held to the end)" if censored else "")


def _per_seed(rows: pd.DataFrame, which: object) -> pd.Series:
    """Each seed's mean accuracy over the lengths a headline column covers, by (task, label,
    seed)."""
    keys = ["task", "encoding_label", "seed"]
    full = rows[rows["mem_len"].isna()]
    if which == "in":
        picked = full[full["eval_len"] <= full["train_len_max"]]
    elif which == "cache":
        cached = rows[rows["mem_len"].notna() & (rows["mem_len"] != math.inf)]
        if cached.empty:
            return pd.Series(dtype=float)
        picked = cached[cached["mem_len"] == cached.groupby("task")["mem_len"].transform("max")]
        picked = picked[picked["eval_len"] == picked.groupby("task")["eval_len"].transform("max")]
    else:
        picked = full[full["eval_len"] == length_at(full, float(which))] if not full.empty else full
    return picked.groupby(keys)["value"].mean()


def token_metric(frame: pd.DataFrame) -> dict[str, str]:
    """Per task, the token accuracy that rankings read: free-running ("greedy_token_accuracy")
    where the task stores it, else the stored "token_accuracy" (teacher-forced in a decoder run
    from before free-running metrics; the encoder form stores both, equal)."""
    greedy = set(frame.loc[frame["metric"] == "greedy_token_accuracy", "task"])
    tasks = frame["task"].dropna().unique()
    return {t: "greedy_token_accuracy" if t in greedy else "token_accuracy" for t in tasks}


def token_accuracy_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of each task's token_metric."""
    return frame[frame["metric"] == frame["task"].map(token_metric(frame))]


def headline_per_seed(frame: pd.DataFrame) -> pd.DataFrame:
    """Each seed's headline, the values the overview averages, by (task, encoding_label,
    seed): free-running token accuracy at 2x the longest training length for tasks with
    answers (metric "greedy_token_accuracy"), the extrapolation penalty at 2x for loss by
    position ("lm_penalty", lower is better; such a task is ranked by it alone)."""
    keys = ["task", "encoding_label", "seed"]
    penalty = frame[(frame["metric"] == "lm_penalty") & frame["position"].notna()]
    if not penalty.empty:
        penalty = penalty[penalty["position"] == length_at(penalty, 2.0, "position")]
    by_penalty = set(penalty["task"])
    accuracy = _per_seed(_accuracy_rows(frame, "greedy_token_accuracy"), 2).reset_index()
    parts = [
        accuracy[~accuracy["task"].isin(by_penalty)].assign(metric="greedy_token_accuracy"),
        penalty.groupby(keys)["value"].mean().reset_index().assign(metric="lm_penalty"),
    ]
    parts = [p for p in parts if not p.empty]
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return table.reindex(columns=[*keys, "metric", "value"])


def headline_seeds(frame: pd.DataFrame) -> dict[tuple[str, str, str], np.ndarray]:
    """(task, encoding_label, headline column) -> each seed's value of that HEADLINE_COLUMNS
    column, the samples headline() averages and pairwise tests compare."""
    out = {}
    for column, metric, which in HEADLINE_COLUMNS:
        per_seed = _per_seed(_accuracy_rows(frame, metric), which)
        if per_seed.empty:
            continue
        for (task, label), seeds in per_seed.groupby(level=[0, 1]):
            out[(str(task), str(label), column)] = seeds.dropna().to_numpy()
    return out


def headline(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, encoding_label): each HEADLINE_COLUMNS value as the mean over seeds
    with its 95% t interval (<column>_low, <column>_high; NaN with one seed), the number of
    seeds, the best seed's exact match at 2x, the share of seeds that generalise (exact
    match >= GENERALISES_AT at 2x the longest training length), and with early stopping the
    mean steps to the threshold over the seeds that reached it ("k/n" seeds did)."""
    keys = ["task", "encoding_label"]
    records: dict[tuple[str, str], dict[str, object]] = {}
    for column, metric, which in HEADLINE_COLUMNS:
        per_seed = _per_seed(_accuracy_rows(frame, metric), which)
        if per_seed.empty:
            continue
        for (task, label), seeds in per_seed.groupby(level=[0, 1]):
            interval = mean_interval(seeds.values, bounds=SHARE_BOUNDS)
            record = records.setdefault((task, label), {"task": task, "encoding_label": label})
            record |= {
                column: interval.mean,
                f"{column}_low": interval.low,
                f"{column}_high": interval.high,
            }
            record["seeds"] = max(int(record.get("seeds", 0)), interval.n)
            if column == "at_2x":
                record["best_at_2x"] = float(seeds.max())
                record["generalising"] = float((seeds >= GENERALISES_AT).mean())
    steps = frame[(frame["metric"] == "steps_to_threshold") & frame["task"].notna()]
    for (task, label), group in steps.groupby(keys):
        record = records.setdefault((task, label), {"task": task, "encoding_label": label})
        record["steps_to_threshold"] = float(
            group["value"].mean()
        )  # over the seeds that reached it
        record["reached_threshold"] = (
            f"{int(group['value'].notna().sum())}/{group['seed'].nunique()}"
        )
    for (task, label), shares in untrained_shares(frame).items():
        records.setdefault((task, label), {"task": task, "encoding_label": label}).update(shares)
    chance = _per_seed(_accuracy_rows(frame, "chance_token_accuracy"), 2)
    for (task, label), seeds in chance.groupby(level=[0, 1]):
        records.setdefault((task, label), {"task": task, "encoding_label": label})[
            "chance_at_2x"
        ] = float(seeds.mean())
    effective = effective_lengths(frame)
    for record in effective[effective["effective_metric"] == "greedy_token_accuracy"].to_dict(
        "records"
    ):
        key = (record["task"], record["encoding_label"])
        records.setdefault(key, {"task": key[0], "encoding_label": key[1]}).update(
            {k: record[k] for k in EFFECTIVE_COLUMNS}
        )
    columns = keys + [
        f"{c}{suffix}" for c, _, _ in HEADLINE_COLUMNS for suffix in ("", "_low", "_high")
    ]
    columns += [
        "seeds",
        "best_at_2x",
        "generalising",
        "steps_to_threshold",
        "reached_threshold",
        "untrained_at_2x",
        "untrained_at_4x",
        "chance_at_2x",
        *EFFECTIVE_COLUMNS,
    ]
    table = pd.DataFrame(list(records.values())).reindex(columns=columns)
    if table.empty:
        return table
    table["seeds"] = table["seeds"].fillna(0).astype(int)
    order = encoding_order(table["encoding_label"])
    table = table.sort_values(
        ["task", "encoding_label"],
        key=lambda c: c.map(order.index) if c.name == "encoding_label" else c,
    )
    return table.reset_index(drop=True)


def untrained_shares(frame: pd.DataFrame) -> dict[tuple[str, str], dict[str, float]]:
    """Per (task, encoding label): the mean over seeds of the share of pairs that read a
    parameter row training never reached, at 2x and 4x the longest training length
    (untrained_at_2x, untrained_at_4x); absent for encodings without indexed parameters."""
    rows = _accuracy_rows(frame, "untrained_share")
    rows = rows[rows["mem_len"].isna()] if "mem_len" in rows else rows
    out: dict[tuple[str, str], dict[str, float]] = {}
    if rows.empty:
        return out
    for multiple in (2, 4):
        picked = rows[rows["eval_len"] == length_at(rows, float(multiple))]
        for (task, label), value in (
            picked.groupby(["task", "encoding_label"])["value"].mean().items()
        ):
            out.setdefault((task, label), {})[f"untrained_at_{multiple}x"] = float(value)
    return out


#: The loss-by-position headline: (column, metric, which positions).
LM_COLUMNS = (
    ("loss_in_distribution", "lm_loss", "in"),
    ("loss_longest", "lm_loss", "last"),
    ("penalty_2x", "lm_penalty", 2),
    ("penalty_longest", "lm_penalty", "last"),
)


def lm_headline(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, encoding_label) with loss-by-position results: mean loss within the
    training length and at the last position bin, the extrapolation penalty at 2x the
    training length and at the last bin, and the in-distribution loss above the task's floor,
    each the mean over seeds with its 95% t interval; `learned` says whether that excess is
    within UNLEARNED_EXCESS (None where the task has no floor)."""
    rows = frame[frame["metric"].isin(["lm_loss", "lm_penalty"]) & frame["position"].notna()]
    records: dict[tuple[str, str], dict[str, object]] = {}
    for column, metric, which in LM_COLUMNS:
        picked = rows[rows["metric"] == metric]
        if which == "in":
            picked = picked[picked["position"] <= picked["train_len_max"]]
        elif which == "last":
            picked = picked[
                picked["position"] == picked.groupby("task")["position"].transform("max")
            ]
        elif not picked.empty:
            picked = picked[picked["position"] == length_at(picked, float(which), "position")]
        per_seed = picked.groupby(["task", "encoding_label", "seed"])["value"].mean()
        for (task, label), seeds in per_seed.groupby(level=[0, 1]):
            interval = mean_interval(seeds.values)
            record = records.setdefault(
                (task, label), {"task": task, "encoding_label": label, "seeds": interval.n}
            )
            record |= {
                column: interval.mean,
                f"{column}_low": interval.low,
                f"{column}_high": interval.high,
            }
    excess = frame[
        (frame["metric"] == "excess_loss") & frame["mem_len"].isna() & frame["eval_len"].notna()
    ]
    excess = excess[excess["eval_len"].astype(float) <= excess["train_len_max"].astype(float)]
    for (task, label), seeds in (
        excess.groupby(["task", "encoding_label", "seed"])["value"].mean().groupby(level=[0, 1])
    ):
        interval = mean_interval(seeds.values)
        record = records.setdefault(
            (task, label), {"task": task, "encoding_label": label, "seeds": interval.n}
        )
        record |= {
            "excess_in_distribution": interval.mean,
            "excess_in_distribution_low": interval.low,
            "excess_in_distribution_high": interval.high,
        }
    effective = effective_lengths(frame)
    for record in effective[effective["effective_metric"] == "lm_penalty"].to_dict("records"):
        key = (record["task"], record["encoding_label"])
        if key in records:
            records[key].update({k: record[k] for k in EFFECTIVE_COLUMNS})
    columns = ["task", "encoding_label"] + [
        f"{c}{x}" for c, _, _ in LM_COLUMNS for x in ("", "_low", "_high")
    ]
    columns += [
        "excess_in_distribution",
        "excess_in_distribution_low",
        "excess_in_distribution_high",
        *EFFECTIVE_COLUMNS,
        "seeds",
        "learned",
    ]
    table = pd.DataFrame(list(records.values())).reindex(columns=columns)
    if table.empty:
        return table
    # a penalty means something only for a model that learned the language in distribution
    table["learned"] = table["excess_in_distribution"].map(
        lambda e: None if pd.isna(e) else bool(e <= UNLEARNED_EXCESS)
    )
    order = encoding_order(table["encoding_label"])
    table = table.sort_values(
        ["task", "encoding_label"],
        key=lambda c: c.map(order.index) if c.name == "encoding_label" else c,
    )
    return table.reset_index(drop=True)


def learned_in_distribution(frame: pd.DataFrame) -> dict[tuple[str, str], bool]:
    """Per (task, encoding_label): whether the model learned the task in distribution (mean
    over seeds): exact match within the training range at least UNDERTRAINED_BELOW, or, for a
    task with a loss floor, in-distribution loss within UNLEARNED_EXCESS of it, or, for real
    text, its in-distribution loss over the whole held-out text below the task's
    learned_loss_below (a bigram model's). Only such numbers are ranked. A plain dict, since
    callers look it up once per table row."""
    trained = frame[frame["task"].notna() & frame["mem_len"].isna() & frame["eval_len"].notna()]
    trained = trained[trained["eval_len"].astype(float) <= trained["train_len_max"].astype(float)]
    out: dict[tuple[str, str], bool] = {}
    exact = (
        trained[trained["metric"] == "exact_match"]
        .groupby(["task", "encoding_label"])["value"]
        .mean()
    )
    out |= {key: bool(value >= UNDERTRAINED_BELOW) for key, value in exact.items()}
    excess = (
        trained[trained["metric"] == "excess_loss"]
        .groupby(["task", "encoding_label"])["value"]
        .mean()
    )
    out |= {key: bool(value <= UNLEARNED_EXCESS) for key, value in excess.items()}
    text = trained[trained["metric"] == "text_loss"]
    for (task, label, name), value in (
        text.groupby(["task", "encoding_label", "task_name"])["value"].mean().items()
    ):
        bar = learned_bar(name)
        if bar is not None:
            out[(task, label)] = bool(value < bar)
    return out


def learned_bar(task_name: str) -> float | None:
    """The in-distribution loss a run of the registered task must beat to count as having
    learned the text (Task.learned_loss_below; None for an unknown task or no bar)."""
    return TASKS.get(task_name).learned_loss_below if task_name in TASKS.names() else None


def evaluation_variants(frame: pd.DataFrame) -> dict[str, set[str]]:
    """Per task, the labels that are evaluation variants of a trained model (rows with
    variant_of): shown beside their model, never ranked against it."""
    if "variant_of" not in frame:
        return {}
    rows = frame[frame["variant_of"].notna() & frame["task"].notna()]
    return {task: set(group["encoding_label"]) for task, group in rows.groupby("task")}


def comparison_kind(frame: pd.DataFrame) -> dict[str, str]:
    """Per task: "equal compute" where every encoding trained the same steps (no threshold),
    "equal accuracy" where every run stopped at its threshold, and otherwise how many runs
    reached it: a run that hit the step cap first trained as long as the budget allowed, not
    to the same accuracy, so the table is at equal accuracy only in part. Evaluation-time
    variants repeat their trained run's steps and are not counted again."""
    tasks = frame.loc[frame["task"].notna(), "task"].unique()
    trained = frame["variant_of"].isna() if "variant_of" in frame else True
    steps = frame[(frame["metric"] == "steps_to_threshold") & trained]
    kinds = {task: "equal compute" for task in tasks}
    for task, rows in steps.groupby("task"):  # one row per run, NaN where it hit the cap
        reached, total = int(rows["value"].notna().sum()), len(rows)
        kinds[task] = (
            "equal accuracy"
            if reached == total
            else f"equal accuracy for {reached} of {total} runs (the rest hit the step cap first)"
        )
    return kinds


def task_names(frame: pd.DataFrame) -> dict[str, str]:
    """Task label -> the registered task it runs (copy-fixed -> copy); a label whose rows give no
    task_name is its own."""
    named = frame[frame["task"].notna()]
    names = named.get("task_name", named["task"])
    # where, not fillna: a task_name column that is all NaN is float and takes no strings
    return dict(zip(named["task"], names.where(names.notna(), named["task"])))


def _group_ids(keys: list[Any]) -> list[np.ndarray]:
    """The positions of each distinct key, in order of first appearance."""
    positions: dict[Any, list[int]] = {}
    for position, key in enumerate(keys):
        positions.setdefault(key, []).append(position)
    return [np.asarray(members) for members in positions.values()]


def _nanmean_over(values: np.ndarray, groups: list[np.ndarray]) -> np.ndarray:
    """(R, columns) -> (R, groups): each group's columns averaged, NaNs skipped (NaN where a
    row has none), as pandas' mean does."""
    out = np.full((values.shape[0], len(groups)), np.nan)
    for index, members in enumerate(groups):
        part = values[:, members]
        counts = (~np.isnan(part)).sum(axis=1)
        sums = np.nansum(part, axis=1)
        out[:, index] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return out


def cross_task_ranking(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean reciprocal rank of each encoding across tasks (Kazemnejad et al.'s summary), two
    ways: by exact match averaged over the full-context lengths past the longest training
    length (their metric), and by each task's headline as the overview ranks it (free-running
    token accuracy at 2x, or the extrapolation penalty at 2x for loss by position, lower being
    better), both from each seed's value. Per task the encodings are ranked by their mean over
    seeds (ties share the average rank); the reciprocal ranks are averaged over the tasks an
    encoding ran, with the 2.5-97.5 percentiles of a bootstrap over seeds (NaN with one seed).
    A task run under several protocols (copy and copy-fixed share `task_name`) counts once: its
    protocols' reciprocal ranks are averaged first. Runs of an encoding that did not learn a
    task in distribution are left out of that task's ranking, and evaluation variants of any
    (they read a trained model again: shown, never ranked). Empty with fewer than two tasks."""
    exact = frame[
        frame["task"].notna()
        & (frame["metric"] == "exact_match")
        & frame["mem_len"].isna()
        & frame["eval_len"].notna()
    ]
    exact = exact[exact["eval_len"].astype(float) > exact["train_len_max"].astype(float)]
    keys = ["task", "encoding_label", "seed"]
    headlines = headline_per_seed(frame)
    higher = headlines["value"].where(headlines["metric"] != "lm_penalty", -headlines["value"])
    rows = pd.concat(
        [
            exact.groupby(keys)["value"].mean().reset_index().assign(metric="exact_match"),
            headlines.assign(value=higher, metric="headline"),
        ],
        ignore_index=True,
    ).reindex(columns=[*keys, "value", "metric"])
    learned = learned_in_distribution(frame)
    keep = [bool(learned.get(key, True)) for key in zip(rows["task"], rows["encoding_label"])]
    variants = evaluation_variants(frame)
    keep = [
        learned_it and label not in variants.get(task, ())
        for learned_it, task, label in zip(keep, rows["task"], rows["encoding_label"])
    ]
    rows = rows[np.array(keep, dtype=bool)]  # unlearned models and variants are not ranked
    metrics = ["exact_match", "headline"]
    columns = ["encoding_label"] + [
        f"mrr_{m}{suffix}" for m in metrics for suffix in ("", "_low", "_high")
    ]
    task_of = task_names(frame)
    if rows["task"].map(task_of).nunique() < 2:
        return pd.DataFrame(columns=columns + ["tasks"])
    per_seed = rows.groupby(["metric", "task", "encoding_label", "seed"])["value"].mean()
    groups = {key: seeds.to_numpy() for key, seeds in per_seed.groupby(level=[0, 1, 2])}
    keys = list(groups)  # (metric, task, encoding_label)
    ranked_within = _group_ids([(metric, task) for metric, task, _ in keys])
    task_level = _group_ids([(m, task_of[t], label) for m, t, label in keys])
    task_level_keys = list(dict.fromkeys((m, task_of[t], label) for m, t, label in keys))
    encoding_level = _group_ids([(m, label) for m, _, label in task_level_keys])
    encoding_level_keys = list(dict.fromkeys((m, label) for m, _, label in task_level_keys))

    def mrr_of(means: np.ndarray) -> np.ndarray:  # (R, keys) -> (R, (metric, label) pairs)
        reciprocal = np.full_like(means, np.nan)
        for members in ranked_within:
            ranks = rankdata(-means[:, members], axis=1, nan_policy="omit")
            reciprocal[:, members] = 1.0 / ranks
        return _nanmean_over(_nanmean_over(reciprocal, task_level), encoding_level)

    labels = sorted({label for _, label in encoding_level_keys})

    def as_table(values: np.ndarray) -> pd.DataFrame:  # (pairs,) -> (encoding, metric)
        index = pd.MultiIndex.from_tuples(encoding_level_keys)
        table = pd.Series(values, index=index).unstack(level=0)
        return table.reindex(index=labels, columns=metrics)

    observed = np.array([[float(groups[key].mean()) for key in keys]])
    table = as_table(mrr_of(observed)[0]).add_prefix("mrr_")
    if any(len(seeds) > 1 for seeds in groups.values()):
        draws = np.array(
            [[means[key] for key in keys] for means in seed_resamples(groups)]
        )  # (replicates, keys)
        replicated = mrr_of(draws)  # (replicates, (metric, label) pairs)
        for metric in metrics:
            by_label = {
                label: replicated[:, i]
                for i, (m, label) in enumerate(encoding_level_keys)
                if m == metric
            }
            bounds = [percentile_interval(by_label.get(label, [])) for label in labels]
            table[f"mrr_{metric}_low"] = [low for low, _ in bounds]
            table[f"mrr_{metric}_high"] = [high for _, high in bounds]
    table = table.reindex(columns=columns[1:])
    table["tasks"] = (
        rows.assign(task=rows["task"].map(task_of)).groupby("encoding_label")["task"].nunique()
    )
    table = table.rename_axis("encoding_label").reset_index()
    return table.sort_values("mrr_headline", ascending=False).reset_index(drop=True)


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per task x encoding x length, position or memory length x metric: mean, std, the 95%
    t interval of the mean over seeds (NaN with one seed), the best seed's value, seeds."""
    keys = ["task", "encoding_label", "metric", "eval_len", "position", "mem_len", "seq_len"]
    grouped = frame.groupby(keys, dropna=False)
    summary = grouped["value"].agg(mean="mean", std="std", best="max").reset_index()
    intervals = [mean_interval(group.values) for _, group in grouped["value"]]
    summary["ci95_low"] = [i.low for i in intervals]
    summary["ci95_high"] = [i.high for i in intervals]
    summary["n_seeds"] = grouped["seed"].nunique(dropna=False).values
    summary["n"] = grouped["value"].count().values
    return summary


def cost_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Per encoding: fwd+bwd latency ratio to nope and peak memory ratio to nope, at the
    longest sequence length profiled for both."""
    rows = frame[frame["seq_len"].notna() & frame["value"].notna()]
    out = []
    for label, group in rows.groupby("encoding_label"):
        entry: dict[str, Any] = {"encoding_label": label}
        ratio = group[group["metric"] == "latency_fwdbwd_ratio"]
        if not ratio.empty:
            longest = ratio["seq_len"].max()
            at_longest = ratio[ratio["seq_len"] == longest]
            entry["latency_ratio"] = at_longest["value"].median()
            entry["latency_at"] = int(longest)
            entry["latency_noisy"] = bool(at_longest["note"].str.startswith("noisy").any())
        memory = group[group["metric"] == "peak_mem_mb"]
        base = rows[(rows["encoding"] == "nope") & (rows["metric"] == "peak_mem_mb")]
        common = sorted(set(memory["seq_len"]) & set(base["seq_len"]))
        if common:
            L = common[-1]
            denominator = base[base["seq_len"] == L]["value"].median()
            if denominator > 0:
                entry["memory_ratio"] = (
                    memory[memory["seq_len"] == L]["value"].median() / denominator
                )
                entry["memory_at"] = int(L)
        out.append(entry)
    return pd.DataFrame(
        out,
        columns=[
            "encoding_label",
            "latency_ratio",
            "latency_at",
            "latency_noisy",
            "memory_ratio",
            "memory_at",
        ],
    )


#: Deletang et al.'s language classes, in the order their tables list them.
FAMILIES = ("regular", "context-free", "context-sensitive")
#: A chance level below this is about 0 and not printed beside the scores it qualifies.
CHANCE_SHOWN = 0.05


def task_family(task_label: str) -> str:
    """The language class of a task by its label (the registered name the shipped suites use);
    empty for a task outside DeepMind's suite or under a label of its own."""
    return TASKS.get(task_label).family if task_label in TASKS.names() else ""


def deepmind_scores(frame: pd.DataFrame) -> pd.DataFrame:
    """DeepMind's score per (task, encoding label, seed) for the tasks of their suite: token
    accuracy averaged over every full-context length past the longest training length, with the
    task's language class, the chance level over the same lengths (NaN where not stored) and
    whether the label learned the task in distribution. A task posed
    to a decoder is scored free-running (their encoder never reads its own answer); the encoder
    form emits its answer at once, so its token accuracy is already theirs."""
    rows = frame[frame["task"].notna() & frame["mem_len"].isna() & frame["eval_len"].notna()]
    rows = rows[rows["eval_len"].astype(float) > rows["train_len_max"].astype(float)]
    chance = rows[rows["metric"] == "chance_token_accuracy"]
    rows = token_accuracy_rows(rows)
    families = {task: task_family(str(task)) for task in rows["task"].unique()}
    rows = rows[rows["task"].map(families) != ""]
    keys = ["task", "encoding_label", "seed"]
    scores = rows.groupby(keys)["value"].mean().rename("score")
    table = scores.reset_index()
    chance_by_run = chance.groupby(keys)["value"].mean()
    table["chance"] = [chance_by_run.get(key, math.nan) for key in zip(*(table[k] for k in keys))]
    table.insert(1, "family", table["task"].map(families))
    learned = learned_in_distribution(frame)
    table["learned"] = [
        bool(learned.get(key, True)) for key in zip(table["task"], table["encoding_label"])
    ]
    return table


def unlearnable_tasks(scores: pd.DataFrame) -> list[str]:
    """The tasks of `scores` (deepmind_scores) that no encoding learned in distribution: at this
    model size and budget they measure nothing, so the class table leaves them out."""
    learned = scores.groupby("task")["learned"].any()
    return sorted(str(task) for task, any_learned in learned.items() if not any_learned)


def family_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """Per (encoding label, family, and "all"), over the same tasks for every label: the
    family's tasks that every label was trained on and at least one learned in distribution
    (`tasks` of them). Where the label learned all of them, the mean of each task's mean over
    seeds, the same mean of each task's best seed (their tables report the best) and of each
    task's chance level; where it did not (`learned` < `tasks`), NaN: a task it did not learn
    measures no length generalisation, and a mean over fewer tasks than the other rows' would
    not compare down a column."""
    if "chance" not in scores:
        scores = scores.assign(chance=math.nan)
    per_task = (
        scores.groupby(["family", "task", "encoding_label"])
        .agg(
            mean=("score", "mean"),
            best=("score", "max"),
            chance=("chance", "mean"),
            learned=("learned", "all"),
        )
        .reset_index()
    )
    labels = per_task["encoding_label"].unique()
    trained_by_all = per_task.groupby("task")["encoding_label"].nunique() == len(labels)
    learnable = per_task.groupby("task")["learned"].any()
    common = {str(t) for t in per_task["task"].unique() if trained_by_all[t] and learnable[t]}
    per_task = per_task[per_task["task"].isin(common)]
    per_task = pd.concat([per_task, per_task.assign(family="all")], ignore_index=True)
    rows = []
    for family in [*FAMILIES, "all"]:
        if family != "all" and family not in set(scores["family"]):
            continue
        tasks = per_task[per_task["family"] == family]
        for label in labels:
            mine = tasks[tasks["encoding_label"] == label]
            n, learned = int(mine["task"].nunique()), int(mine["learned"].sum())
            complete = n > 0 and learned == n
            rows.append(
                {
                    "encoding_label": label,
                    "family": family,
                    "mean": float(mine["mean"].mean()) if complete else math.nan,
                    "best": float(mine["best"].mean()) if complete else math.nan,
                    "chance": float(mine["chance"].mean()) if n else math.nan,
                    "learned": learned,
                    "tasks": n,
                }
            )
    return pd.DataFrame(
        rows, columns=["encoding_label", "family", "mean", "best", "chance", "learned", "tasks"]
    )


def family_gains(scores: pd.DataFrame, label: str, twin: str) -> dict[str, float]:
    """Per family and "all": the mean over tasks that both `label` and `twin` learned of the
    twin's mean score minus the label's (NaN where no task qualifies)."""
    per_task = scores.groupby(["family", "task", "encoding_label"]).agg(
        mean=("score", "mean"), learned=("learned", "all")
    )
    both = per_task.reset_index().pivot_table(
        index=["family", "task"], columns="encoding_label", values=["mean", "learned"]
    )
    if label not in both["mean"] or twin not in both["mean"]:
        return {}
    ok = both["learned"][label].eq(1) & both["learned"][twin].eq(1)
    gains = (both["mean"][twin] - both["mean"][label])[ok].reset_index(name="gain")
    out = gains.groupby("family")["gain"].mean().to_dict()
    out["all"] = float(gains["gain"].mean()) if len(gains) else math.nan
    return out
