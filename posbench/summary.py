"""Headline numbers from tidy results: in-distribution and beyond-length accuracy per
encoding and task, averaged over seeds. Shared by the terminal table and the report."""
from __future__ import annotations

import math

from typing import Iterable

import pandas as pd

from posbench.encodings import BUILTINS


def encoding_order(labels: Iterable[str]) -> list[str]:
    """Built-in encodings first in their usual order, then the rest alphabetically."""
    return sorted(set(labels), key=lambda s: (BUILTINS.index(s) if s in BUILTINS else len(BUILTINS), s))


def _accuracy_rows(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    rows = frame[(frame["metric"] == metric) & frame["eval_len"].notna()]
    return rows.assign(eval_len=rows["eval_len"].astype(int))


def length_at(frame: pd.DataFrame, multiple: float) -> pd.Series:
    """Per row, the smallest evaluated length >= multiple x train_len_max of that task."""
    evaluated = frame.groupby("task")["eval_len"].unique()

    def pick(row: pd.Series) -> float:
        target = multiple * row["train_len_max"]
        candidates = sorted(e for e in evaluated[row["task"]] if e >= target)
        return candidates[0] if candidates else math.nan

    return frame.apply(pick, axis=1) if len(frame) else pd.Series(dtype=float)


def headline(frame: pd.DataFrame, metric: str = "exact_match") -> pd.DataFrame:
    """One row per (task, encoding_label): mean accuracy in distribution, at 2x and 4x the
    longest training length (full context), and through the longest finite cache at the
    longest evaluation length; plus the number of seeds."""
    rows = _accuracy_rows(frame, metric)
    full = rows[rows["mem_len"].isna()]
    keys = ["task", "encoding_label"]
    if full.empty:
        return pd.DataFrame(columns=keys + ["in_distribution", "at_2x", "at_4x", "longest_cache", "seeds"])
    in_dist = full[full["eval_len"] <= full["train_len_max"]].groupby(keys)["value"].mean().rename("in_distribution")
    out = [in_dist]
    for name, multiple in (("at_2x", 2), ("at_4x", 4)):
        picked = full[full["eval_len"] == length_at(full, multiple)]
        out.append(picked.groupby(keys)["value"].mean().rename(name))
    cached = rows[rows["mem_len"].notna() & (rows["mem_len"] != math.inf)]
    if not cached.empty:
        longest = cached[cached["mem_len"] == cached.groupby("task")["mem_len"].transform("max")]
        longest = longest[longest["eval_len"] == longest.groupby("task")["eval_len"].transform("max")]
        out.append(longest.groupby(keys)["value"].mean().rename("longest_cache"))
    seeds = full.groupby(keys)["seed"].nunique().rename("seeds")
    table = pd.concat(out + [seeds], axis=1).reset_index()
    order = encoding_order(table["encoding_label"])
    table = table.sort_values(["task", "encoding_label"], key=lambda c: c.map(order.index) if c.name == "encoding_label" else c)
    table = table.reset_index(drop=True)
    for column in ("in_distribution", "at_2x", "at_4x", "longest_cache"):
        if column not in table:
            table[column] = math.nan
    return table
