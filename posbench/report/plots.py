"""matplotlib figures for the report, returned as base64 PNG so the HTML is self-contained.
One colour per encoding across every plot; log-scaled length axes where lengths double."""

from __future__ import annotations

import base64
import io
import math
from typing import Sequence

import functools
from typing import Any, Callable, TypeVar

import matplotlib
import matplotlib.colors
import matplotlib.patches
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from posbench.report.overview import HEADLINE_METRICS
from posbench.report.stats import SHARE_BOUNDS, SHARE_METRICS, mean_interval
from posbench.report.summary import CHANCE_SHOWN, RANDOM_SUFFIX, encoding_order, token_metric

#: The report's look, applied per figure through rc_context: the caller's rcParams and
#: backend are never touched (no pyplot, no matplotlib.use).
STYLE = {"figure.dpi": 100, "font.size": 9, "axes.grid": True, "grid.alpha": 0.3}
F = TypeVar("F", bound=Callable[..., Any])


def styled(fn: F) -> F:
    """Draw inside the report's style, restoring the caller's rcParams afterwards."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with matplotlib.rc_context(STYLE):
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def colour_map(labels: Sequence[str]) -> dict[str, str]:
    """A fixed colour per encoding label: built-ins first in their usual order, then the rest.
    A randomized twin (NAME+random beside NAME) shares NAME's colour and is drawn dashed
    (line_style), so a figure of 14 encodings pairs them at a glance."""
    order = encoding_order(labels)
    present = set(order)
    own = [label for label in order if _plain_twin(label) not in present]
    palette = matplotlib.colormaps["tab10"].colors + matplotlib.colormaps["Dark2"].colors
    colours = {
        label: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, label in enumerate(own)
    }
    return {label: colours.get(label) or colours[str(_plain_twin(label))] for label in order}


def line_style(label: str) -> str:
    """Dashed for a randomized twin, solid otherwise."""
    return "--" if label.endswith(RANDOM_SUFFIX) else "-"


def _plain_twin(label: str) -> str | None:
    """NAME for a label NAME+random, else None."""
    return label.removesuffix(RANDOM_SUFFIX) if label.endswith(RANDOM_SUFFIX) else None


def to_png(fig: Figure) -> str:
    """Encode a figure as a base64 PNG (an object-oriented Figure: nothing to close)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _mean_interval(rows: pd.DataFrame, x: str) -> pd.DataFrame:
    """Per x: the mean over seeds and its 95% t interval (NaN bounds, so no band, with one
    seed), cut to 0..1 for a share."""
    shares = "metric" in rows and rows["metric"].isin(SHARE_METRICS).all()
    out = []
    for value, group in rows.groupby(x):
        interval = mean_interval(group["value"].values, bounds=SHARE_BOUNDS if shares else None)
        out.append({x: value, "mean": interval.mean, "low": interval.low, "high": interval.high})
    return pd.DataFrame(out, columns=[x, "mean", "low", "high"]).sort_values(x)


def _lines(
    ax: Axes, rows: pd.DataFrame, x: str, colours: dict[str, str], positions: dict | None = None
) -> None:
    for label in sorted(rows["encoding_label"].unique(), key=list(colours).index):
        stats = _mean_interval(rows[rows["encoding_label"] == label], x)
        xs = stats[x].map(positions) if positions else stats[x]
        ax.plot(
            xs,
            stats["mean"],
            marker="o",
            ms=3,
            color=colours[label],
            ls=line_style(label),
            label=label,
        )
        ax.fill_between(
            xs, stats["low"], stats["high"], color=colours[label], alpha=0.15, linewidth=0
        )


#: How the accuracy figures title each metric.
METRIC_TITLES = {
    "exact_match": "exact match",
    "greedy_token_accuracy": "free-running token accuracy",
    "token_accuracy": "token accuracy, teacher-forced",
}


def _task_metrics(frame: pd.DataFrame, task: str) -> list[str]:
    """The accuracy metrics a task's figure shows: exact match (when meaningful) and token
    accuracy, free-running (the headline's) where the task generates its answers, else as
    stored (teacher-forced)."""
    rows = frame[frame["task"] == task]
    present = set(rows["metric"])
    return [m for m in ("exact_match", token_metric(rows).get(task, "")) if m in present]


@styled
def accuracy_vs_length(frame: pd.DataFrame, task: str, colours: dict[str, str]) -> str:
    """Accuracy against evaluation length (full context), one panel per metric (exact match
    and token accuracy, see _task_metrics), the 95% interval over seeds shaded."""
    metrics = _task_metrics(frame, task)
    fig = Figure(figsize=(4.6 * len(metrics), 3.6))
    axes = fig.subplots(1, len(metrics), squeeze=False, sharey=True)[0]
    for ax, metric in zip(axes, metrics):
        rows = frame[
            (frame["task"] == task)
            & (frame["metric"] == metric)
            & frame["mem_len"].isna()
            & frame["eval_len"].notna()
        ]
        _lines(ax, rows, "eval_len", colours)
        train_max = rows["train_len_max"].max()
        ax.axvline(train_max, color="black", ls="--", lw=1)
        ax.text(train_max, 1.02, " longest training length", fontsize=8, va="bottom")
        ax.set_xscale("log", base=2)
        lengths = sorted(rows["eval_len"].unique())
        ax.set_xticks(lengths, [str(int(v)) for v in lengths])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("evaluation length (task units, log scale)")
        ax.set_ylabel(f"{METRIC_TITLES[metric]} (fraction)")
        ax.set_ylim(-0.03, 1.08)
        ax.set_title(METRIC_TITLES[metric], fontsize=9)
    axes[0].legend(fontsize=7, ncol=2, loc="lower left")
    fig.suptitle(f"{task}: accuracy vs evaluation length", fontsize=10)
    return to_png(fig)


@styled
def loss_vs_position(frame: pd.DataFrame, task: str, colours: dict[str, str]) -> str | None:
    """Language modelling: next-token loss by position far past the training length (full
    context solid, sliding window dotted), and the extrapolation penalty (full - window)."""
    rows = frame[
        (frame["task"] == task) & frame["metric"].isin(["lm_loss", "lm_loss_window", "lm_penalty"])
    ]
    if rows.empty:
        return None
    fig = Figure(figsize=(10, 3.6))
    left, right = fig.subplots(1, 2)
    _lines(left, rows[rows["metric"] == "lm_loss"], "position", colours)
    for label in sorted(rows["encoding_label"].unique(), key=list(colours).index):
        window = _mean_interval(
            rows[(rows["metric"] == "lm_loss_window") & (rows["encoding_label"] == label)],
            "position",
        )
        left.plot(window["position"], window["mean"], ls=":", lw=1, color=colours[label])
    _lines(right, rows[rows["metric"] == "lm_penalty"], "position", colours)
    train_max = rows["train_len_max"].max()
    for ax, ylabel in ((left, "next-token loss (nats)"), (right, "penalty: full - window (nats)")):
        ax.axvline(train_max, color="black", ls="--", lw=1)
        ax.set_xlabel("position (tokens of context)")
        ax.set_ylabel(ylabel)
    right.axhline(0, color="grey", lw=0.8)
    left.set_title("loss by position (dotted: sliding window of the training length)", fontsize=9)
    right.set_title("extrapolation penalty", fontsize=9)
    left.legend(fontsize=7, ncol=2)
    fig.suptitle(f"{task}: loss past the training length (dashed line)", fontsize=10)
    return to_png(fig)


@styled
def perplexity_ratio(
    ratios: pd.DataFrame, published: pd.DataFrame, task: str, colours: dict[str, str]
) -> str | None:
    """Press et al.'s view of a text task: the perplexity at each multiple of the training
    length over the perplexity at L (log scales; exp of the mean log ratio over seeds, its 95%
    interval shaded), with Press et al.'s Table 3 ratios dashed in the colour of the entry
    named like their encoding."""
    rows = ratios[ratios["task"] == task]
    if rows.empty:
        return None
    fig = Figure(figsize=(7.6, 4.0))
    ax = fig.subplots()
    for label in sorted(rows["encoding_label"].unique(), key=list(colours).index):
        stats = _mean_interval(rows[rows["encoding_label"] == label], "multiple").dropna(
            subset=["mean"]
        )
        if stats.empty:
            continue
        xs = [1.0, *stats["multiple"]]
        ax.plot(
            xs, np.exp([0.0, *stats["mean"]]), marker="o", ms=3, color=colours[label], label=label
        )
        ax.fill_between(
            stats["multiple"],
            np.exp(stats["low"]),
            np.exp(stats["high"]),
            color=colours[label],
            alpha=0.15,
            linewidth=0,
        )
    for name, theirs in published.groupby("encoding", sort=False):
        ax.plot(
            [1.0, *theirs["multiple"]],
            [1.0, *theirs["ratio"]],
            ls="--",
            lw=1,
            color=colours.get(name, "grey"),
            label=f"{name} (Press et al.)",
        )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ticks = sorted({1.0, *rows["multiple"]})
    ax.set_xticks(ticks, [f"{t:g}L" if t != 1 else "L" for t in ticks])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    low, high = ax.get_ylim()
    marks = [m for m in (0.8, 0.9, 1, 1.2, 1.5, 2, 3, 5, 10, 20, 50, 100) if low <= m <= high]
    ax.set_yticks(marks, [f"{m:g}" for m in marks])
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("evaluation window L_valid (non-overlapping, whole held-out text)")
    ax.set_ylabel("perplexity ratio to L_valid = L")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(
        f"{task}: perplexity past the training length (dashed: Press et al.'s Table 3)",
        fontsize=9,
    )
    return to_png(fig)


@styled
def accuracy_vs_cache(frame: pd.DataFrame, task: str, colours: dict[str, str]) -> str:
    """Accuracy against memory length M (segments through the cache), at the longest training
    length and at 2x it, one panel each (exact match, or token accuracy where exact match
    means nothing)."""
    metric = _task_metrics(frame, task)[0]
    rows = frame[(frame["task"] == task) & (frame["metric"] == metric) & frame["mem_len"].notna()]
    train_max = int(rows["train_len_max"].max())
    lengths = [L for L in sorted(rows["eval_len"].unique()) if L in (train_max, 2 * train_max)] or [
        rows["eval_len"].max()
    ]
    mems = sorted(rows["mem_len"].unique())
    positions = {m: i for i, m in enumerate(mems)}
    fig = Figure(figsize=(3.4 * len(lengths), 3.2))
    axes = fig.subplots(1, len(lengths), squeeze=False, sharey=True)
    for ax, length in zip(axes[0], lengths):
        _lines(ax, rows[rows["eval_len"] == length], "mem_len", colours, positions)
        ax.set_xticks(range(len(mems)), ["∞" if math.isinf(m) else str(int(m)) for m in mems])
        ax.set_xlabel("memory length M (tokens)")
        ax.set_title(f"length {int(length)}")
        ax.set_ylim(-0.03, 1.05)
    axes[0][0].set_ylabel(f"{METRIC_TITLES[metric]} (fraction)")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{task}: accuracy vs memory length", fontsize=10)
    return to_png(fig)


@styled
def cost_plot(
    frame: pd.DataFrame, metric: str, x: str, colours: dict[str, str], ylabel: str, title: str
) -> str | None:
    """A latency or memory metric against sequence or memory length (log-log)."""
    rows = frame[(frame["metric"] == metric) & frame[x].notna() & frame["value"].notna()]
    if rows.empty:
        return None
    fig = Figure(figsize=(5.2, 3.4))
    ax = fig.subplots()
    _lines(ax, rows, x, colours)
    lengths = sorted(rows[x].unique())
    if lengths[0] == 0:  # a zero memory length: linear near zero, log beyond
        ax.set_xscale("symlog", base=2, linthresh=lengths[1] if len(lengths) > 1 else 1)
    else:
        ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(int(v)) for v in lengths])
    if (rows["value"] > 0).all():
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(
        "sequence length (tokens)" if x == "seq_len" else "memory length mem_len (tokens)"
    )
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    return to_png(fig)


@styled
def score_vs_parameters(scores: pd.DataFrame, task: str, colours: dict[str, str]) -> str | None:
    """The ranking score of each encoding against its model's parameter count (log x), mean
    over seeds with its 95% interval: where lines cross, the ranking changes with size."""
    rows = scores[scores["task"] == task].rename(columns={"score": "value"})
    if rows.empty:
        return None
    fig = Figure(figsize=(5.2, 3.4))
    ax = fig.subplots()
    _lines(ax, rows, "parameters", colours)
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel(str(rows["scored_by"].iloc[0]))
    ax.set_title(f"{task}: does the ranking hold as the model grows?")
    ax.legend(fontsize=7, ncol=2)
    return to_png(fig)


@styled
def bias_heatmap(bias: np.ndarray, label: str) -> str:
    """One head's bias over (query, key) positions."""
    fig = Figure(figsize=(2.6, 2.4))
    ax = fig.subplots()
    finite = bias[np.isfinite(bias)]
    limit = float(np.abs(finite).max()) if finite.size else 1.0
    image = ax.imshow(bias, cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    ax.set_title(label, fontsize=9)
    ax.grid(False)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="logit bias")
    return to_png(fig)


@styled
def term_curves(terms: pd.DataFrame, label: str) -> str:
    """The score-term probe over training: each named term's spread (std of its logits) by
    step, one panel per layer, log scale so a term orders of magnitude below the rest shows."""
    layers = sorted(terms["layer"].unique())
    fig = Figure(figsize=(2.4 * len(layers) + 0.6, 2.3))
    axes = np.atleast_1d(fig.subplots(1, len(layers), sharey=True))
    for ax, layer in zip(axes, layers):
        for term, rows in terms[terms["layer"] == layer].groupby("term", sort=False):
            rows = rows.sort_values("step")
            ax.plot(rows["step"], rows["std"].clip(lower=1e-12), marker=".", label=str(term))
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_title(f"{label}, layer {layer}", fontsize=9)
    axes[0].set_ylabel("std of the term's logits")
    axes[-1].legend(fontsize=7, loc="best")
    return to_png(fig)


@styled
def attention_distance(distances: dict[str, pd.DataFrame], colours: dict[str, str]) -> str | None:
    """Attention mass by key distance per encoding, in distribution and beyond the training
    length: an encoding whose attention scatters past the training length spreads its mass."""
    kinds = ["in distribution", "beyond"]
    if not distances:
        return None
    fig = Figure(figsize=(9, 3.0))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, kind in zip(axes, kinds):
        tokens = None
        for label in [l for l in colours if l in distances]:
            rows = distances[label][distances[label]["kind"] == kind]
            if rows.empty:
                continue
            ax.plot(
                rows["distance"] + 1,
                rows["mass"],
                color=colours[label],
                ls=line_style(label),
                label=label,
                linewidth=1.2,
            )
            tokens = int(rows["tokens"].iloc[0])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("key distance i - j + 1")
        ax.set_title(f"{kind}" + (f" ({tokens} tokens)" if tokens is not None else ""), fontsize=9)
    axes[0].set_ylabel("attention mass")
    drawn = [ax for ax in axes if ax.get_legend_handles_labels()[0]]
    if drawn:  # beyond the training length is empty for a task evaluated only within it
        drawn[-1].legend(fontsize=7, loc="best")
    return to_png(fig)


@styled
def overview_heatmap(table: pd.DataFrame) -> str | None:
    """Encodings x tasks coloured by each task's headline metric (one panel per metric, each
    with its own scale), every cell labelled with its value and rank group (its letters, or
    "variant" for an evaluation variant, shown unranked), each task's chance level under its
    name where it is not about 0: the suite's answer at a glance. A model that did not learn
    the task is grey and unranked."""
    if table.empty:
        return None
    labels = encoding_order(table["encoding_label"])
    panels = [m for m in HEADLINE_METRICS.values() if (table["headline_metric"] == m.column).any()]
    widths = [table.loc[table["headline_metric"] == m.column, "task"].nunique() for m in panels]
    width = min(2.4 + 1.15 * sum(widths) + 1.2 * len(panels), 13)
    # labels longer than the 2.4 in left for them (options, variants; about 0.07 in a
    # character) widen the figure where they would leave a task less than 0.8 in for its cells
    labels_width = 0.07 * max(len(label) for label in labels)
    if labels_width > 2.4:
        width = max(width, labels_width + 0.8 * sum(widths) + 1.2 * len(panels))
    fig = Figure(figsize=(width, 0.9 + 0.3 * len(labels)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(panels), width_ratios=widths, sharey=True))
    for ax, metric in zip(axes, panels):
        rows = table[table["headline_metric"] == metric.column]
        tasks = sorted(rows["task"].unique())
        grid = rows.pivot_table(
            index="encoding_label", columns="task", values="value", aggfunc="first"
        )
        grid = grid.reindex(index=labels, columns=tasks)  # (encodings, tasks)
        limit = max(float(np.nanmax(grid.to_numpy())), 0.5) if not metric.higher_is_better else 1.0
        image = ax.imshow(
            grid.to_numpy(dtype=float),
            cmap="viridis" if metric.higher_is_better else "viridis_r",
            vmin=0.0,
            vmax=limit,
            aspect="auto",
        )
        for record in rows.to_dict("records"):
            y, x = labels.index(record["encoding_label"]), tasks.index(record["task"])
            if not record["learned"]:
                ax.add_patch(
                    matplotlib.patches.Rectangle((x - 0.5, y - 0.5), 1, 1, color="#cccccc")
                )
                ax.text(x, y, "not learned", ha="center", va="center", fontsize=7, color="#555")
                continue
            shade = image.norm(record["value"])
            dark = shade < 0.55 if metric.higher_is_better else shade > 0.45
            group = record["rank_group"]
            ax.text(
                x,
                y,
                f"{record['value']:.{metric.digits}f} "
                + ("(variant)" if pd.isna(group) else f"({group})"),
                ha="center",
                va="center",
                fontsize=7,
                color="white" if dark else "black",
                fontweight="bold" if record["best"] else "normal",
            )
        chance = (
            rows.groupby("task")["chance"].mean() if "chance" in rows else pd.Series(dtype=float)
        )
        ticks = [
            f"{task}\nchance {chance[task]:.2f}"
            if task in chance.index and chance[task] >= CHANCE_SHOWN
            else task
            for task in tasks
        ]
        ax.set_xticks(range(len(tasks)), ticks, rotation=30, ha="right")
        ax.set_yticks(range(len(labels)), labels)
        ax.tick_params(axis="y", labelleft=ax is axes[0])
        ax.grid(False)
        ax.set_title(metric.title, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
    return to_png(fig)
