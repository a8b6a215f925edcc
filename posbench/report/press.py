"""Press et al.'s evaluation of a text task: the loss over every token of the held-out text at
L_valid = L, 2L, 4L, ... (the `text_loss` metric), read as the perplexity ratio to L_valid = L
per encoding with its interval over seeds, the effective length it implies, and Press et al.'s
own ratios (their Table 3, trained at L = 1024 on WikiText-103) beside it."""

from __future__ import annotations

import functools
import math
from importlib import resources

import numpy as np
import pandas as pd

from posbench.report.stats import mean_interval
from posbench.report.summary import encoding_order, learned_in_distribution

#: The metric whose rows this module reads.
TEXT_METRIC = "text_loss"
#: Past L, the loss over the whole text may rise at most this many nats (a perplexity ratio of
#: exp(0.1) = 1.105) for the encoding to still count as reading that length: the same 0.1 nats
#: at which the loss-by-position view calls the loss broken.
EFFECTIVE_LOG_RATIO = 0.1
#: nanoGPT's published validation loss (nats per character) for its CPU configuration on Tiny
#: Shakespeare (learned positions, block 64): the anchor a text suite's learned entry sits beside.
NANOGPT_LOSS = 1.88
#: The training length of the published table set beside a text suite (Press et al.'s Table 3).
PRESS_TRAIN_LENGTH = 1024
PRESS_SOURCE = (
    "Press et al. 2022 (ALiBi), appendix Table 3: WikiText-103, 247M parameters, trained at "
    "L = 1024, one run per cell"
)


def text_tasks(frame: pd.DataFrame) -> list[str]:
    """The task labels whose runs measured the loss over a whole held-out text."""
    return sorted(set(frame.loc[frame["metric"] == TEXT_METRIC, "task"].dropna()))


def log_ratios(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (task, encoding_label, seed) and evaluation length past L (the longest training
    length): the whole-text loss there minus the loss at L, in nats: the log of Press et al.'s
    perplexity ratio. Columns task, encoding_label, seed, eval_len, multiple (eval_len / L),
    value; NaN where the encoding cannot read the length (a learned table past its rows)."""
    rows = frame[(frame["metric"] == TEXT_METRIC) & frame["mem_len"].isna()]
    rows = rows[["task", "encoding_label", "seed", "train_len_max", "eval_len", "value"]]
    keys = ["task", "encoding_label", "seed"]
    at_train = rows[rows["eval_len"].astype(float) == rows["train_len_max"].astype(float)]
    base = at_train.groupby(keys)["value"].mean().rename("at_train")
    past = rows[rows["eval_len"].astype(float) > rows["train_len_max"].astype(float)]
    past = past.join(base, on=keys)
    return pd.DataFrame(
        {
            "task": past["task"],
            "encoding_label": past["encoding_label"],
            "seed": past["seed"],
            "eval_len": past["eval_len"].astype(float),
            "multiple": past["eval_len"].astype(float) / past["train_len_max"].astype(float),
            "value": past["value"] - past["at_train"],
        }
    ).reset_index(drop=True)


def ratio_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (task, encoding_label) of a text task: the whole-text loss at L (mean over
    seeds with its 95% t interval), whether the model learned the text in distribution, and at
    each multiple m of L the perplexity ratio ppl(mL) / ppl(L) as exp of the mean log ratio,
    with exp of its t interval (ratio_<m>x, _low, _high; NaN where the encoding cannot read
    mL), then the effective length: the longest evaluated length up to which every mean log
    ratio stays within EFFECTIVE_LOG_RATIO (censored when it holds at the longest)."""
    tasks = text_tasks(frame)
    if not tasks:
        return pd.DataFrame()
    rows = frame[(frame["metric"] == TEXT_METRIC) & frame["task"].isin(tasks)]
    rows = rows[rows["mem_len"].isna()]
    at_train = rows[rows["eval_len"].astype(float) == rows["train_len_max"].astype(float)]
    ratios = log_ratios(frame)
    learned = learned_in_distribution(frame)
    records = []
    for (task, label), group in at_train.groupby(["task", "encoding_label"]):
        per_seed = group.groupby("seed")["value"].mean()
        loss = mean_interval(per_seed.to_numpy())
        train_len = float(group["train_len_max"].iloc[0])
        record = {
            "task": task,
            "encoding_label": label,
            "train_len": train_len,
            "seeds": loss.n,
            "learned": learned.get((task, label)),
            "loss": loss.mean,
            "loss_low": loss.low,
            "loss_high": loss.high,
        }
        mine = ratios[(ratios["task"] == task) & (ratios["encoding_label"] == label)]
        effective, censored = train_len, True
        for multiple, part in sorted(mine.groupby("multiple"), key=lambda item: item[0]):
            values = part.groupby("seed")["value"].mean().to_numpy()
            column = f"ratio_{multiple:g}x"
            if np.isnan(values).all():
                record |= {column: math.nan, f"{column}_low": math.nan, f"{column}_high": math.nan}
                censored = False
                continue
            interval = mean_interval(values[~np.isnan(values)])
            record |= {
                column: math.exp(interval.mean),
                f"{column}_low": math.exp(interval.low),
                f"{column}_high": math.exp(interval.high),
            }
            if censored and interval.mean <= EFFECTIVE_LOG_RATIO:
                effective = multiple * train_len
            else:
                censored = False
        longest = mine["multiple"].max() * train_len if not mine.empty else train_len
        record["effective_length"] = effective
        record["effective_length_censored"] = bool(censored and effective == longest)
        records.append(record)
    table = pd.DataFrame(records)
    order = encoding_order(table["encoding_label"])
    table = table.sort_values(
        ["task", "encoding_label"],
        key=lambda c: c.map(order.index) if c.name == "encoding_label" else c,
    )
    return table.reset_index(drop=True)


def multiples(table: pd.DataFrame) -> list[float]:
    """The multiples of L a ratio_table has columns for, in order."""
    found = {
        float(c.removeprefix("ratio_").removesuffix("x"))
        for c in table.columns
        if c.startswith("ratio_") and c.endswith("x")
    }
    return sorted(found)


def press_ratios(train_length: int = PRESS_TRAIN_LENGTH) -> pd.DataFrame:
    """Press et al.'s perplexity ratios ppl(L_valid) / ppl(L) at the training length given
    (their Table 3 at 1024, Table 2 at 512), per encoding (posbench's names) and multiple: the
    power of two nearest L_valid / L. Columns encoding, eval_len, multiple, perplexity, ratio."""
    table = _read_press()
    table = table[table["train_len"] == train_length].copy()
    at_train = table[table["eval_len"] == train_length].set_index("encoding")["perplexity"]
    table["multiple"] = 2.0 ** np.round(np.log2(table["eval_len"] / train_length))
    table["ratio"] = table["perplexity"] / table["encoding"].map(at_train)
    table = table[table["eval_len"] > train_length]
    return table[["encoding", "eval_len", "multiple", "perplexity", "ratio"]].reset_index(drop=True)


@functools.cache
def _read_press() -> pd.DataFrame:
    return pd.read_csv(resources.files(__package__) / "perplexity" / "press2022.csv")
