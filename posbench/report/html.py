"""`posbench report`: results.csv, summary.csv and one self-contained report.html, built only
from the stored results (so it can be regenerated any time, also from a partial sweep)."""

from __future__ import annotations

import base64
import hashlib
import dataclasses
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Mapping

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape

from posbench.report import learning_rate, plots, press, published, scale
from posbench.report.overview import (
    HEADLINE_METRICS,
    SAME_AS_NOTE,
    overview,
    overview_cells,
    overview_label,
    unranked_tasks,
)
from posbench.tasks import REGISTRY as TASKS
from posbench.errors import ResultsError
from posbench.experiment.memory import MEMORY_METHOD
from posbench.experiment.config import UNLEARNED_EXCESS, EncodingSpec, to_jsonable
from posbench.report.calibration import calibrate
from posbench.report.literature import check_findings
from posbench.store import (
    is_archive,
    DISTANCE_FILE,
    RESULTS_FILE,
    TERMS_FILE,
    RunFolder,
    atomic_write_files,
    check_overwritable,
    check_report_folder,
    collect,
    other_runs,
    run_folders,
    sweep_marker,
    sweep_members,
    sweep_temporary_files,
)
from posbench.report.stats import GENERALISES_AT, Interval, sole_best
from posbench.report.summary import (
    EFFECTIVE_AT,
    EFFECTIVE_PENALTY,
    RANDOM_SUFFIX,
    comparison_kind,
    FAMILIES,
    cross_task_ranking,
    deepmind_scores,
    effective_length_text,
    effective_lengths,
    encoding_order,
    evaluation_variants,
    family_gains,
    family_scores,
    headline,
    headline_seeds,
    learned_bar,
    learned_in_distribution,
    lm_headline,
    multi_size_tasks,
    sized_tasks,
    summarise,
    task_names,
    unlearnable_tasks,
)
from posbench.experiment.timing import describe_method
from posbench.version import __version__

#: The report's folder of PNG figures.
FIGURES_DIR = "figures"
#: What each cost figure shows and what to look at in it.
COST_CAPTIONS = {
    "latency_fwdbwd": "Forward and backward time of one layer against sequence length: the "
    "training cost. Lines that bend up faster than nope's add work that grows with length.",
    "latency_fwd": "Forward time of one layer against sequence length: the cost of reading a "
    "whole sequence once.",
    "memory": "Peak memory of one layer's forward and backward pass: an encoding far above nope "
    "keeps a (heads, length, length) tensor that nope does not.",
    "decode": "Time per generated token against the cache length: lines that stay linear in "
    "the cache keep decoding cheap; a steeper line recomputes something per step.",
}
#: Every aggregate the report reads, per task x encoding x length x metric.
BY_LENGTH_FILE = "by_length.csv"


@dataclass
class Report:
    """What was written and what the report could not include."""

    out_dir: Path
    html: Path
    results_csv: Path
    summary_csv: Path
    by_length_csv: Path
    overview: pd.DataFrame
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    other_runs: list[dict[str, str]] = field(default_factory=list)
    unranked: list[str] = field(default_factory=list)  # tasks the overview has no row for


def default_report_dir(sweep_dir: Path) -> Path:
    """Where a sweep's report goes: reports/NAME for a sweep in ./results/NAME (the documented
    layout), the archive's own folder for a sweep archive (a published suite keeps its runs
    beside its report), else a report/ folder inside the sweep folder, so reports never collide."""
    sweep_dir = Path(sweep_dir)
    if is_archive(sweep_dir):  # a published suite's runs.tar.xz sits in its report folder
        return sweep_dir.parent
    if sweep_dir.resolve().parent == (Path.cwd() / "results").resolve():
        return Path("reports") / sweep_dir.name
    return sweep_dir / "report"


#: A task table's accuracy columns: (column, header). Accuracies are shares from 0 to 1.
ANSWER_COLUMNS = (
    ("in_distribution", "exact match in-dist"),
    ("at_2x", "exact match 2x"),
    ("at_4x", "exact match 4x"),
    ("greedy_at_2x", "free-running token 2x"),
    ("greedy_at_4x", "free-running token 4x"),
    ("token_at_2x", "teacher-forced token 2x"),
    ("token_at_4x", "teacher-forced token 4x"),
    ("longest_cache", "exact match, longest cache"),
)
#: A task table's columns about training and seeds rather than accuracy: a table of their own,
#: as the token accuracies are beside the whole-answer ones, so no table is wider than a screen.
TRAINING_KEYS = ("best_at_2x", "generalising", "steps", "seeds")
#: A loss-by-position task's columns: (column, header), all in nats.
LOSS_COLUMNS = (
    ("loss_in_distribution", "loss in-dist (nats)"),
    ("loss_longest", "loss at the end (nats)"),
    ("penalty_2x", "penalty 2x (nats)"),
    ("penalty_longest", "penalty at the end (nats)"),
    ("excess_in_distribution", "above floor (nats)"),
)


def _length_units(config: dict[str, Any]) -> dict[str, str]:
    """Each task label's length unit (from its registered task; none for a task posbench
    cannot look up, such as a plugin the report was built without)."""
    units = {}
    for entry in config.get("tasks", []):
        name = entry.get("name", "")
        if name in TASKS.names():
            units[entry.get("label") or name] = TASKS.get(name).length_unit
    return units


def _unit(units: dict[str, str], task: str) -> str:
    """A task's length unit, also under its sized label ("copy @ d64 L2 H4")."""
    return units.get(task, units.get(task.split(" @ ")[0], ""))


def _reads_untrained(record: dict[str, Any], column: str) -> bool:
    """Whether a headline cell's length reads parameter rows that training never reached."""
    for multiple in ("2x", "4x"):
        if column.endswith(f"at_{multiple}"):
            share = record.get(f"untrained_at_{multiple}")
            return isinstance(share, float) and share > 0
    return False


def _best_accuracy(
    group: pd.DataFrame,
    column: str,
    ranked: Collection[str],
    seeds: Mapping[tuple[str, str, str], Any],
) -> float | None:
    """The value to bold in a task's accuracy column: the mean of the encoding (among `ranked`:
    learned, not evaluation variants) that a pairwise test over seeds separates from every
    other, the overview's rule for "best" (None where none is)."""
    rows = group[group["encoding_label"].isin(ranked) & group[column].notna()]
    rows = rows.sort_values(column, ascending=False)
    samples = {
        label: seeds.get((task, label, column), [])
        for task, label in zip(rows["task"], rows["encoding_label"])
    }
    return None if sole_best(samples) is None else float(rows[column].iloc[0])


def _keep_informative(
    columns: list[tuple[str, str]], rows: list[dict[str, Any]]
) -> tuple[list[tuple[str, str]], list[str]]:
    """The columns that say something for this task: none that is n/a for every encoding; one
    that is the same for every encoding (of several) is stated once instead ("header: value")."""
    kept, same = [], []
    for key, header in columns:
        texts = {row["cells"][key]["text"] for row in rows}
        if texts <= {"n/a", ""}:
            continue
        if len(rows) > 1 and len(texts) == 1:
            same.append(f"{header}: {texts.pop()}")
            continue
        kept.append((key, header))
    return kept, same


def _answer_table(
    task: str,
    group: pd.DataFrame,
    learned: dict[tuple[str, str], bool],
    unit: str,
    ranked: Collection[str],
    seeds: Mapping[tuple[str, str, str], Any],
) -> dict[str, Any]:
    """A task with answers: its accuracy columns, effective length, seeds, best seed, share
    generalising and steps to threshold, one row per encoding. `ranked` are the labels that
    may be bolded, `seeds` the per-seed values the test compares (summary.headline_seeds)."""
    best = {c: _best_accuracy(group, c, ranked, seeds) for c, _ in ANSWER_COLUMNS}
    rows = []
    for record in group.to_dict("records"):
        cells: dict[str, dict[str, Any]] = {}
        for column, _ in ANSWER_COLUMNS:
            value = record[column]
            text = Interval(value, record[f"{column}_low"], record[f"{column}_high"], 0).text()
            if _reads_untrained(record, column) and text != "n/a":
                text += " †"
            cells[column] = {
                "text": text,
                "best": not pd.isna(value) and best[column] == value,
            }
        extra = {
            "effective_length": effective_length_text(record, 1),
            "seeds": str(int(record["seeds"])),
            "best_at_2x": "n/a" if pd.isna(record["best_at_2x"]) else f"{record['best_at_2x']:.2f}",
            "generalising": "n/a"
            if pd.isna(record["generalising"])
            else f"{record['generalising']:.0%}",
            "steps": ""
            if not isinstance(record.get("reached_threshold"), str)
            else (
                f"{record['steps_to_threshold']:.0f} ({record['reached_threshold']})"
                if not pd.isna(record["steps_to_threshold"])
                else f"not reached (0/{record['reached_threshold'].split('/')[1]})"
            ),
        }
        cells |= {key: {"text": text, "best": False} for key, text in extra.items()}
        rows.append(
            {
                "label": record["encoding_label"],
                "unlearned": not learned.get((task, record["encoding_label"]), True),
                "cells": cells,
            }
        )
    length = f"effective length ({unit})" if unit else "effective length"
    columns = [("effective_length", length), *ANSWER_COLUMNS]
    columns += [
        ("best_at_2x", "best seed, exact match 2x"),
        ("generalising", "seeds generalising"),
        ("steps", "steps to threshold (seeds)"),
        ("seeds", "seeds"),
    ]
    kept, same = _keep_informative(columns, rows)
    chance = group["chance_at_2x"].dropna()
    training = [(key, header) for key, header in kept if key in TRAINING_KEYS]
    tokens = [(key, header) for key, header in kept if "token" in header]
    whole = [(k, h) for k, h in kept if k not in TRAINING_KEYS and (k, h) not in tokens]
    return {
        "kind": "answers",
        "parts": [part for part in (whole, tokens, training) if part],
        "same": same,
        "rows": rows,
        "chance": f"{chance.mean():.2f}" if len(chance) else "",
        "flag": "did not learn the task",
    }


def _loss_table(task: str, group: pd.DataFrame, unit: str) -> dict[str, Any]:
    """A loss-by-position task: loss and extrapolation penalty (nats, mean ± 95% interval),
    the excess over the task's floor and the effective length, one row per encoding."""
    rows = []
    for record in group.to_dict("records"):
        cells = {
            c: {
                "text": Interval(record[c], record[f"{c}_low"], record[f"{c}_high"], 0).text(3),
                "best": False,
            }
            for c, _ in LOSS_COLUMNS
        }
        cells["effective_length"] = {
            "text": effective_length_text(record),
            "best": False,
        }
        cells["seeds"] = {"text": str(int(record["seeds"])), "best": False}
        rows.append(
            {
                "label": record["encoding_label"],
                "unlearned": record["learned"] is False,
                "cells": cells,
            }
        )
    length = f"effective length ({unit})" if unit else "effective length"
    columns = [*LOSS_COLUMNS, ("effective_length", length), ("seeds", "seeds")]
    kept, same = _keep_informative(columns, rows)
    return {
        "kind": "loss",
        "parts": [kept] if kept else [],
        "same": same,
        "rows": rows,
        "chance": "",
        "flag": "did not learn the language",
    }


def _task_tables(frame: pd.DataFrame, units: dict[str, str]) -> list[dict[str, Any]]:
    """One table per task with only the columns that mean something for it."""
    answers, losses = headline(frame), lm_headline(frame)
    learned = learned_in_distribution(frame)
    comparisons = comparison_kind(frame)
    variants = evaluation_variants(frame)
    seeds = headline_seeds(frame)
    tables = []
    for task in sorted(frame["task"].dropna().unique()):
        loss = losses[losses["task"] == task] if not losses.empty else losses
        answer = answers[answers["task"] == task] if not answers.empty else answers
        if not loss.empty:
            table = _loss_table(task, loss, _unit(units, task))
        elif not answer.empty and answer[[c for c, _ in ANSWER_COLUMNS]].notna().any().any():
            ranked = [
                label
                for label in answer["encoding_label"]
                if learned.get((task, label), True) and label not in variants.get(task, ())
            ]
            table = _answer_table(task, answer, learned, _unit(units, task), ranked, seeds)
        else:
            continue
        tables.append(table | {"task": task, "comparison": comparisons.get(task, "")})
    return tables


def _headline_notes(frame: pd.DataFrame) -> dict[str, str]:
    """The numbers the report's notes quote: how intervals are given, and the thresholds."""
    seeds = frame.groupby(["task", "encoding_label"])["seed"].nunique()
    return {
        "interval": "mean over seeds ± the half-width of its 95% Student-t interval"
        if (seeds > 1).any()
        else "one seed per encoding: no interval can be given (run --seeds 0,1,2)",
        "generalises": f"{GENERALISES_AT:.0%}",
        "unlearned_excess": f"{UNLEARNED_EXCESS}",
        "effective_at": f"{EFFECTIVE_AT}",
        "effective_penalty": f"{EFFECTIVE_PENALTY}",
    }


def _glance(table: pd.DataFrame, units: dict[str, str], unranked: list[str]) -> dict[str, Any]:
    """The first screen: the overview heatmap and one compact table per task (headline with
    its interval and rank group, effective length, cost at the stated length), and why a task
    has none (`unranked`, see overview.unranked_tasks)."""
    tasks = []
    for task, group in table.groupby("task", sort=True):
        metric = HEADLINE_METRICS[group["headline_metric"].iloc[0]]
        rows = [
            {
                "label": overview_label(record),
                "unlearned": not record["learned"],
                "best": bool(record["best"]),
                "cells": overview_cells(record),
            }
            for record in group.to_dict("records")
        ]
        chance = group["chance"].dropna()
        latency_at, memory_at = group["latency_at"].dropna(), group["memory_at"].dropna()
        tasks.append(
            {
                "task": task,
                "metric": metric.title,
                "header": metric.short,
                "comparison": group["comparison"].iloc[0],
                "chance": f"{chance.mean():.2f}" if len(chance) else "",
                "unit": _unit(units, task),
                "latency": f"latency (× nope, L={int(latency_at.max())})"
                if len(latency_at)
                else "",
                "memory": f"memory (× nope, L={int(memory_at.max())})" if len(memory_at) else "",
                "rows": rows,
            }
        )
    same_as = SAME_AS_NOTE if table["same_as"].astype(bool).any() else ""
    return {
        "tasks": tasks,
        "heatmap": plots.overview_heatmap(table),
        "same_as": same_as,
        "unranked": unranked,
    }


def _representative_runs(frame: pd.DataFrame, colours: dict[str, str]) -> list[Any]:
    """Each encoding's first run (first task, lowest seed), in the report's encoding order:
    the run whose stored pictures stand for the encoding."""
    trained = (
        frame[frame["task"].notna()].sort_values(["task", "seed"]).drop_duplicates("encoding_label")
    )
    order = list(colours)
    return sorted(trained.itertuples(), key=lambda r: order.index(r.encoding_label))


def _bias_pictures(
    sweep_dir: Path, frame: pd.DataFrame, colours: dict[str, str], problems: list[str]
) -> list[dict[str, Any]]:
    """One heatmap per encoding (first task, lowest seed) from the bias picture its run stored,
    so no model, plugin or torch computation is needed."""
    pictures = []
    for record in _representative_runs(frame, colours):
        folder = RunFolder(sweep_dir / record.run_id)
        try:
            stored = (folder.result() or {}).get("bias_picture")
            bias = folder.array(stored) if stored and stored != "none" else None
        except ResultsError as err:  # a corrupt file costs its picture, not the report
            problems.append(f"bias picture for {record.encoding_label}: {err}")
            continue
        if stored is None:
            problems.append(
                f"bias picture for {record.encoding_label}: its run stored none; "
                f"redo it with `posbench run --force` to draw one"
            )
            continue
        pictures.append(
            {
                "label": record.encoding_label,
                "task": record.task,
                "png": plots.bias_heatmap(bias, record.encoding_label)
                if bias is not None
                else None,
            }
        )
    return pictures


def _diagnostics(
    sweep_dir: Path, frame: pd.DataFrame, colours: dict[str, str], problems: list[str]
) -> dict[str, Any]:
    """The score-term curves with their health flags, and attention mass by distance, from the
    files each encoding's first run (first task, lowest seed) stored; a run that stored none
    (it only evaluated a model trained before) is skipped."""
    runs = _representative_runs(frame, colours)
    terms, distances = [], {}
    first_task = min((r.task for r in runs), default=None)
    for record in runs:
        folder = RunFolder(sweep_dir / record.run_id)
        try:
            result = folder.result() or {}
            probes = folder.table(TERMS_FILE)
            if probes is not None:
                terms.append(
                    {
                        "label": record.encoding_label,
                        "task": record.task,
                        "png": plots.term_curves(probes, record.encoding_label),
                        "flags": result.get("health_flags", []),
                    }
                )
            distance = folder.table(DISTANCE_FILE) if record.task == first_task else None
            if distance is not None:
                distances[record.encoding_label] = distance
        except ResultsError as err:  # a corrupt file costs its picture, not the report
            problems.append(f"diagnostics for {record.encoding_label}: {err}")
    return {
        "terms": terms,
        "distance_plot": plots.attention_distance(distances, colours),
        "distance_task": first_task,
    }


def _with_interval(value: float, low: float, high: float) -> str:
    """A value with its bootstrap interval, '0.62 [0.50, 0.75]' (the value alone without one;
    n/a without a value, as for a rank correlation of encodings that all scored the same)."""
    if math.isnan(value):
        return "n/a"
    if math.isnan(low):
        return f"{value:.2f}"
    return f"{value:.2f} [{low:.2f}, {high:.2f}]"


def _deepmind_section(frame: pd.DataFrame) -> dict[str, Any] | None:
    """DeepMind's score per encoding and language class, and what randomized positions add to
    each encoding that has a NAME+random twin (None without a task of their suite)."""
    scores = deepmind_scores(frame)
    if scores.empty:
        return None
    table = family_scores(scores).set_index(["encoding_label", "family"])
    columns = [f for f in FAMILIES if f in set(scores["family"])] + ["all"]
    labels = encoding_order(table.index.get_level_values(0).unique())

    def cell(label: str, family: str) -> str:
        row = table.loc[(label, family)]
        n, learned = int(row["tasks"]), int(row["learned"])
        if n == 0:
            return "no task learnable"
        if learned < n:
            return f"learned {learned} of {n}"
        return f"{row['mean']:.3f} ({row['best']:.3f}), {n} task{'s' if n > 1 else ''}"

    gains = []
    for label in labels:
        twin = f"{label}{RANDOM_SUFFIX}"
        if twin in labels:
            by_family = family_gains(scores, label, twin)
            gains.append(
                {
                    "label": label,
                    "cells": [
                        f"{by_family[f]:+.3f}"
                        if f in by_family and not math.isnan(by_family[f])
                        else "none both learned"
                        for f in columns
                    ],
                }
            )
    first = table.xs(labels[0], level="encoding_label")
    return {
        "columns": columns,
        "tasks": {f: int(scores.loc[scores["family"] == f, "task"].nunique()) for f in FAMILIES},
        "averaged": {f: int(first.at[f, "tasks"]) for f in columns},
        "unlearnable": unlearnable_tasks(scores),
        "rows": [{"label": label, "cells": [cell(label, f) for f in columns]} for label in labels],
        "chance": [
            "" if pd.isna(first.at[f, "chance"]) else f"{first.at[f, 'chance']:.3f}"
            for f in columns
        ],
        "gains": gains,
    }


def _paper_tables(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Each task of a paper whose per-task numbers posbench keeps, beside this sweep's."""
    tables = []
    for comparison in published.beside_papers(frame):
        tables.append(
            {
                "title": f"{comparison.task} ({comparison.paper}, {comparison.metric})",
                "source": comparison.source,
                "tau": _with_interval(comparison.tau, comparison.low, comparison.high),
                "rows": [
                    {
                        "encoding": row["encoding"],
                        "theirs": f"{row['theirs']:.3f}",
                        "ours": Interval(
                            row["ours"], row["ours_low"], row["ours_high"], int(row["seeds"])
                        ).text(3),
                        "difference": f"{row['difference']:+.3f}",
                        "learned": row["learned"],
                    }
                    for row in comparison.rows
                ],
            }
        )
    return tables


def _text_section(frame: pd.DataFrame, colours: dict[str, str]) -> list[dict[str, Any]]:
    """Per text task, Press et al.'s evaluation: the loss over the whole held-out text at L,
    the perplexity ratio to L at each multiple with its interval over seeds, the effective
    length, Press et al.'s Table 3 ratios and the figure of both."""
    table = press.ratio_table(frame)
    if table.empty:
        return []
    theirs = press.press_ratios()
    ratios = press.log_ratios(frame)
    names = task_names(frame)
    sections = []
    for task, rows in table.groupby("task", sort=True):
        multiples = press.multiples(rows)
        unit = int(rows["train_len"].iloc[0])

        def ratio_cell(row: dict, m: float) -> str:
            column = f"ratio_{m:g}x"
            if pd.isna(row.get(column, math.nan)):
                return "n/a"
            return _with_interval(row[column], row[f"{column}_low"], row[f"{column}_high"])

        sections.append(
            {
                "task": task,
                "train_len": unit,
                "multiples": [f"{m:g}x ({int(m * unit)})" for m in multiples],
                "nanogpt": press.NANOGPT_LOSS if names.get(task) == "shakespeare" else None,
                "learned_below": learned_bar(names.get(task, "")),
                "rows": [
                    {
                        "label": row["encoding_label"],
                        "learned": row["learned"] is not False,
                        "loss": Interval(
                            row["loss"], row["loss_low"], row["loss_high"], int(row["seeds"])
                        ).text(3),
                        "ratios": [ratio_cell(row, m) for m in multiples],
                        "effective": (">= " if row["effective_length_censored"] else "")
                        + f"{int(row['effective_length'])}",
                    }
                    for row in rows.to_dict("records")
                ],
                "published": [
                    {
                        "encoding": name,
                        "ratios": [
                            f"{part.set_index('multiple')['ratio'].get(m, math.nan):.2f}"
                            if m in set(part["multiple"])
                            else "n/a"
                            for m in multiples
                        ],
                    }
                    for name, part in theirs.groupby("encoding", sort=False)
                ],
                "plot": plots.perplexity_ratio(ratios, theirs, task, colours),
            }
        )
    return sections


def _scale_section(results: pd.DataFrame, colours: dict[str, str]) -> dict[str, Any] | None:
    """The model-size section: scores and ranks per size, tau between sizes, one sentence per
    task and a score-against-parameters figure per task (None for a sweep of one size)."""
    tasks = multi_size_tasks(results)
    if not tasks:
        return None
    scores = scale.scale_scores(results)
    taus = scale.tau_table(scores)
    ranks = scale.ranks_by_size(scores)
    sizes = results[results["task"].isin(tasks) & (results["metric"] == "parameters")]
    size_names = [str(m) for m in sizes.groupby("model")["value"].median().sort_values().index]
    rows = []
    for (task, label), group in ranks.groupby(["task", "encoding_label"]):
        by_size = group.set_index("model")
        rows.append(
            {
                "task": task,
                "label": label,
                "cells": [
                    f"{by_size.at[m, 'score']:.2f} ({by_size.at[m, 'rank']:g})"
                    if m in by_size.index
                    else ""
                    for m in size_names
                ],
            }
        )
    kinds = comparison_kind(sized_tasks(results[results["task"].isin(tasks)]))
    return {
        "sizes": len(size_names),
        "size_names": size_names,
        "compared_at": [f"{task}: {kind}" for task, kind in sorted(kinds.items())],
        "scored_by": " or ".join(sorted(set(scores["scored_by"]))) or "its headline metric",
        "sentences": [v.sentence() for v in scale.scale_verdicts(taus, scores, tasks)],
        "ranks": rows,
        "taus": [
            {
                "task": r.task,
                "small": r.small,
                "large": r.large,
                **dict(zip(("tau", "interval"), scale.tau_cells(r.tau, r.low, r.high))),
                "encodings": int(r.encodings),
            }
            for r in taus.itertuples()
        ],
        "plots": [
            {"task": task, "png": png}
            for task in sorted(scores["task"].unique())
            if (png := plots.score_vs_parameters(scores, task, colours)) is not None
        ],
    }


def _learning_rate_section(
    frame: pd.DataFrame,
    config: dict[str, Any],
    source: str = "",
    suite: pd.DataFrame | None = None,
    suite_rate: float | None = None,
) -> dict[str, Any] | None:
    """The learning-rate section: per task trained at several rates, each encoding's score per
    rate, the rate validation picks, and one sentence per task on whether the order changes
    (None where no task varies the rate). `suite` (an overview) and `suite_rate` come from the
    suite this probe checks, when the probe is another sweep (`source`, its folder)."""
    rates = learning_rate.task_learning_rates(config)
    scores = learning_rate.probe_scores(frame, rates)
    if scores.empty:
        return None
    default_rate = config.get("train", {}).get("lr")
    suite_rate = suite_rate if suite_rate is not None else default_rate
    if suite is not None and suite_rate not in set(scores["lr"]):
        raise ResultsError(
            f"the learning-rate probe {source} trained at "
            f"{', '.join(f'{r:g}' for r in sorted(set(scores['lr'])))}, not at this suite's "
            f"rate {suite_rate:g}; add a task at {suite_rate:g} to the probe and run it again."
        )
    if suite_rate is None or suite_rate not in set(scores["lr"]):
        suite_rate = float(scores["lr"].mode().iloc[0])
    groups = learning_rate.suite_groups(suite) if suite is not None else None
    picked = learning_rate.picked_rates(scores).set_index(["task_name", "encoding_label"])
    rate_list = sorted(scores["lr"].unique())
    ranks = (
        scores[scores["learned"].astype(bool)]
        .groupby(["task_name", "lr"])["score"]
        .rank(ascending=False, method="average")
    )
    scores = scores.assign(rank=ranks)
    rows = []
    for (task, label), group in scores.groupby(["task_name", "encoding_label"], sort=False):
        by_rate = group.set_index("lr")

        def cell(rate: float) -> str:
            if rate not in by_rate.index:
                return ""
            row = by_rate.loc[rate]
            if not bool(row["learned"]):
                return f"not learned (validation {row['validation']:.2f})"
            return f"{row['score']:.3g} ({row['rank']:g}), validation {row['validation']:.2f}"

        rows.append(
            {
                "task": task,
                "label": label,
                "cells": [cell(rate) for rate in rate_list],
                "picked": f"{picked.at[(task, label), 'lr']:g}"
                if bool(picked.at[(task, label), "learned"])
                else "none: not learned at any rate",
            }
        )
    metrics = sorted(set(scores["metric"]))
    return {
        "source": source,
        "suite_rate": f"{suite_rate:g}",
        "rates": [f"{rate:g}" for rate in rate_list],
        "scored_by": " or ".join(scale.SCORED_BY[m] for m in metrics),
        "validated_by": " or ".join(learning_rate.VALIDATED_BY[m] for m in metrics),
        "seeds": int(frame.loc[frame["task"].notna(), "seed"].nunique()),
        "rows": rows,
        "sentences": [
            v.sentence() for v in learning_rate.rate_verdicts(scores, suite_rate, groups)
        ],
    }


def _probe_section(
    probe_dir: Path | None, suite: pd.DataFrame, config: dict[str, Any], shown: Path | None
) -> dict[str, Any] | None:
    """The learning-rate section of another sweep (`posbench report --probe`), checked against
    this suite's rank groups and learning rate; `shown` is the name the report gives the probe
    (the archive it was unpacked from; default `probe_dir`)."""
    if probe_dir is None:
        return None
    if not Path(probe_dir).is_dir():
        raise ResultsError(
            f"{probe_dir} is not a folder; pass --probe the sweep folder of a learning-rate "
            "probe (`posbench run --suite lr-probe` writes results/lr-probe)."
        )
    problems: list[str] = []
    probe = sized_tasks(collect(probe_dir, problems))
    section = _learning_rate_section(
        probe,
        sweep_marker(probe_dir).get("config", {}),
        str(shown or probe_dir),
        suite,
        config.get("train", {}).get("lr"),
    )
    if section is None:
        raise ResultsError(
            f"{probe_dir} holds no task trained at more than one learning rate; pass a "
            "learning-rate probe's sweep folder (`posbench run --suite lr-probe`) to --probe."
        )
    return section


#: What a report folder says about itself, for the index of published reports.
REPORT_RECORD = "report.json"


def _literature(frame: pd.DataFrame) -> dict[str, Any]:
    """The literature verdicts and, where any took a test, the rule's measured error rate at
    this sweep's seed count (see calibration.py)."""
    verdicts = check_findings(frame)
    calibration = ""
    if any(v.method for v in verdicts):
        trained = frame[frame["task"].notna() & frame["seed"].notna()]
        seeds = trained.groupby(["task", "encoding_label"])["seed"].nunique()
        calibration = calibrate(int(seeds.mode().iloc[0])).sentence()
    return {
        "literature": [dataclasses.asdict(v) for v in verdicts],
        "calibration": calibration,
    }


def report_command(source: Path, linked: Collection[str], probe: Path | None) -> str:
    """The `posbench report` command that builds this report into its folder again (its
    output folder aside): the results it read, the figures it links and the probe it reads."""
    parts = ["posbench", "report", str(source)]
    if linked:
        parts += ["--link-figures", ",".join(sorted(linked))]
    if probe is not None:
        parts += ["--probe", str(probe)]
    return " ".join(parts)


def _report_record(
    sweep_dir: Path,
    out_dir: Path,
    frame: pd.DataFrame,
    config: dict[str, Any],
    failures: list[dict[str, str]],
    missing: list[str],
    scale_sentences: list[str],
) -> dict[str, Any]:
    """The report's name and purpose, when it was built and from which code, how much compute
    its runs took, and its headline (effective lengths, mean reciprocal ranks, and for a sweep
    of several model sizes whether the ranking holds between them), so an index of reports
    needs no results of its own."""
    # the runs whose numbers the report holds: collect() already checked them whole
    read = sorted(set(frame["run_id"].dropna()))
    commits, versions, seconds = set(), set(), 0.0
    for folder in (RunFolder(sweep_dir / run_id) for run_id in read):
        try:
            env, result = folder.env() or {}, folder.result() or {}
        except ResultsError:
            continue
        seconds += float(result.get("seconds") or 0.0)
        commits.add(env.get("git_commit") or "not recorded")
        versions.add(env.get("posbench") or "not recorded")
    effective = effective_lengths(frame).dropna(subset=["effective_length"])
    learned = learned_in_distribution(frame)
    return {
        "name": out_dir.name,
        "about": config.get("about", ""),
        "built": time.strftime("%Y-%m-%d"),
        "built_by": __version__,
        "posbench_versions": sorted(versions),
        "commits": sorted(commits),
        "runs": len(read),
        "failed": len(failures),
        "missing": len(missing),
        "compute_seconds": round(seconds, 1),
        "effective_lengths": [
            {
                "task": r["task"],
                "encoding": r["encoding_label"],
                "value": _finite(r["effective_length"]),
                "low": _finite(r["effective_length_low"]),
                "high": _finite(r["effective_length_high"]),
                "censored": _finite(r["effective_length_censored"]),
                "learned": bool(learned.get((r["task"], r["encoding_label"]), True)),
            }
            for r in effective.to_dict("records")
        ],
        "mrr": [
            {
                "encoding": r["encoding_label"],
                "value": _finite(r["mrr_headline"]),
                "low": _finite(r["mrr_headline_low"]),
                "high": _finite(r["mrr_headline_high"]),
                "tasks": int(r["tasks"]),
            }
            for r in cross_task_ranking(frame).to_dict("records")
        ],
        "scale": scale_sentences,
        # a sweep that trains a task at several learning rates probes the rate: its ranking
        # across tasks pools the rates, so a front page does not show it beside the suites'
        "probes_learning_rate": bool(
            learning_rate.varied_tasks(frame, learning_rate.task_learning_rates(config))
        ),
        "encodings": [
            {"label": spec.display(), "name": spec.name, "options": to_jsonable(spec.options)}
            for spec in (
                EncodingSpec(e["name"], e.get("options", {}), e.get("label", ""))
                for e in config.get("encodings", [])
            )
        ],
    }


def _config_rows(config: dict[str, Any]) -> list[tuple[str, str]]:
    """The sweep's configuration as a reader takes it in: one row per setting, tasks and
    encodings by their labels and options, model, training and evaluation as key = value."""

    def options(entry: dict[str, Any], keys: tuple[str, ...]) -> str:
        values = {k: v for k, v in entry.get("options", {}).items()}
        values |= {k: entry[k] for k in keys if entry.get(k)}
        return ", ".join(
            f"{k}: {section(v)}" if isinstance(v, dict) else f"{k} = {v}"
            for k, v in sorted(values.items())
        )

    def named(entry: dict[str, Any], keys: tuple[str, ...] = ()) -> str:
        name = entry.get("label") or entry.get("name", "?")
        detail = options(entry, keys)
        return f"{name} ({detail})" if detail else name

    def section(values: Any) -> str:
        if not isinstance(values, dict):
            return str(values)
        return ", ".join(f"{k} = {v}" for k, v in sorted(values.items()) if v is not None)

    rows = [
        ("tasks", "; ".join(named(t, ("train",)) for t in config.get("tasks", []))),
        ("encodings", "; ".join(named(e) for e in config.get("encodings", []))),
        ("seeds", ", ".join(str(s) for s in config.get("seeds", []))),
    ]
    sizes = config.get("sizes") or [config.get("model", {})]
    rows.append(("model" if len(sizes) == 1 else "model sizes", "; ".join(map(section, sizes))))
    rows += [(key, section(config.get(key, {}))) for key in ("train", "eval")]
    if config.get("eval_variants"):
        rows.append(("evaluation variants", "; ".join(named(v) for v in config["eval_variants"])))
    rows += [(key, str(config[key])) for key in ("device", "threads") if config.get(key)]
    return [(key, value) for key, value in rows if value]


def _finite(value: float) -> float | None:
    """A number for JSON: None where there is none (an interval of one seed)."""
    return None if math.isnan(value) else float(value)


def _provenance(
    sweep_dir: Path, run_ids: Collection[str]
) -> tuple[dict[str, str], list[dict[str, str]]]:
    """What the runs the report holds ran on, and where their time went. Each environment
    field: its value where every run recorded the same, else every distinct value with its run
    count ("2.13.0 (12 runs); 2.12.1 (3 runs)"), so a sweep that mixed machines, versions or
    kernels shows all of them. The time split: each part's seconds summed over the runs that
    recorded one (result.json's time_split), its share, and how many runs that is."""
    values: dict[str, Counter[str]] = {}
    seconds: Counter[str] = Counter()
    timed = 0
    protocols: Counter[str] = Counter()  # a run that recorded none was scored under version 1
    for run_id in sorted(run_ids):
        try:
            folder = RunFolder(sweep_dir / run_id)
            env, result = folder.env() or {}, folder.result() or {}
        except ResultsError:
            continue
        if "attention_kernels" in result:  # which kernels served its attention calls
            env = env | {"attention kernels": ", ".join(result["attention_kernels"]) or "none"}
        if result.get("kind") != "profile":
            protocols[str(result.get("evaluation_protocol", ""))] += 1
        for key, value in env.items():
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            values.setdefault(key, Counter())[text] += 1
        if isinstance(result.get("time_split"), dict):
            timed += 1
            seconds.update({k: float(v) for k, v in result["time_split"].items()})
    if set(protocols) - {""}:  # shown once runs record it, which older archives do not
        values["evaluation protocol"] = Counter({k or "1": n for k, n in protocols.items()})
    environment = {
        key: next(iter(counts))
        if len(counts) == 1
        else "; ".join(
            f"{value} ({n} run{'' if n == 1 else 's'})" for value, n in counts.most_common()
        )
        for key, counts in values.items()
    }
    total = sum(seconds.values())
    split = [
        {"part": part, "seconds": f"{value:.0f}", "share": f"{value / total:.0%}", "runs": timed}
        for part, value in seconds.most_common()
    ]
    return environment, split


def _failures_and_missing(sweep_dir: Path) -> tuple[list[dict[str, str]], list[str]]:
    """The sweep's failed runs (with their errors) and the labels of its unfinished runs."""
    members = sweep_members(sweep_dir)
    failures, finished = [], set()
    for folder in run_folders(sweep_dir):
        if members is not None and folder.run_id not in members:
            continue
        try:
            result = folder.result()
            label = folder.label()
        except ResultsError:
            continue
        if result is None:
            continue
        if result.get("status") in ("error", "diverged"):
            failures.append({"run": label, "error": result.get("error", "")})
        elif folder.is_finished():
            finished.add(folder.run_id)
    missing = [
        label
        for run_id, label in (members or {}).items()
        if run_id not in finished and not any(f["run"] == label for f in failures)
    ]
    return failures, missing


def _file_name(name: str) -> str:
    """A figure's file name: its name where every character is safe in a path, else the name
    with each other character as "_" plus a digest of the name, so labels that differ only in
    such characters ("c+1", "c_1") never share a file."""
    safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_") else "_" for ch in name)
    if safe == name:
        return name
    return f"{safe}_{hashlib.sha256(name.encode('utf-8')).hexdigest()[:6]}"


def _figure_files(context: dict[str, Any], linked: Collection[str]) -> dict[str, str]:
    """The plots as PNG files too (figures/NAME.png, base64 here), for papers and READMEs. An
    unknown name in `linked` is one sentence listing the known ones."""
    figures = {f"accuracy_vs_length_{t['name']}": t["length_plot"] for t in context["tasks"]}
    figures |= {
        f"accuracy_vs_cache_{t['name']}": t["cache_plot"]
        for t in context["tasks"]
        if t["cache_plot"]
    }
    figures |= {
        f"loss_vs_position_{t['name']}": t["position_plot"]
        for t in context["tasks"]
        if t["position_plot"]
    }
    figures |= {f"perplexity_ratio_{t['task']}": t["plot"] for t in context["text"] if t["plot"]}
    figures |= {f"cost_{name}": png for name, png in context["costs"].items()}
    for plot in (context["scale"] or {}).get("plots", []):
        figures[f"score_vs_parameters_{plot['task']}"] = plot["png"]
    if context["diagnostics"].get("distance_plot"):
        figures["attention_distance"] = context["diagnostics"]["distance_plot"]
    files = {_file_name(name): png for name, png in figures.items()}
    unknown = sorted(set(linked) - set(files))
    if unknown:
        raise ResultsError(
            f"--link-figures names no figure of this report: {', '.join(unknown)}; "
            f"its figures are {', '.join(sorted(files))}."
        )
    return files


def build_report(
    sweep_dir: Path,
    out_dir: Path,
    linked: Collection[str] = (),
    probe_dir: Path | None = None,
    source: Path | None = None,
    probe_source: Path | None = None,
) -> Report:
    """Write results.csv, summary.csv, report.html and figures/ for the sweep in `sweep_dir`.
    report.html embeds every figure (one self-contained file) except those named in `linked`,
    which it shows from figures/ (a published report whose README shows a figure holds it
    once). `probe_dir`, a learning-rate probe's sweep, adds its table, checked against this
    sweep's ranking. Everything is built before anything is written, and the files are written
    as one set: an interrupt leaves the previous report whole. `source` is what the report
    names as its results (the archive `sweep_dir` was unpacked from; default `sweep_dir`), and
    `probe_source` the same for `probe_dir`."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ResultsError(
            f"{sweep_dir} is not a folder; pass the folder `posbench run` wrote (e.g. "
            "results/default)."
        )
    if RunFolder(sweep_dir).exists():
        raise ResultsError(
            f"{sweep_dir} is one run's folder; pass the sweep folder that holds it "
            f"({sweep_dir.parent})."
        )
    problems: list[str] = []
    results = collect(sweep_dir, problems)
    frame = sized_tasks(results)
    if frame.empty:
        detail = f" ({'; '.join(problems)})" if problems else ""
        raise ResultsError(
            f"{sweep_dir} holds no finished posbench runs{detail}; run `posbench run --out "
            f"{sweep_dir}` first."
        )
    results_csv, summary_csv = out_dir / RESULTS_FILE, out_dir / "summary.csv"
    check_report_folder(out_dir, sweep_dir)
    if out_dir.is_dir():
        sweep_temporary_files(out_dir)
    for path, signature in (
        (results_csv, "run_id,"),
        (summary_csv, "task,encoding_label,"),
        (out_dir / BY_LENGTH_FILE, "task,encoding_label,"),
        (out_dir / "report.html", "<title>posbench report"),
    ):
        check_overwritable(path, signature, "-o")

    colours = plots.colour_map(sorted(frame["encoding_label"].unique()))
    tasks = sorted(frame["task"].dropna().unique())
    config = sweep_marker(sweep_dir).get("config", {})
    units = _length_units(config)
    overview_table = overview(frame)
    unranked = unranked_tasks(frame, overview_table)
    costs = {
        "latency_fwdbwd": plots.cost_plot(
            frame,
            "latency_fwdbwd_ms",
            "seq_len",
            colours,
            "median latency (ms)",
            "forward+backward latency",
        ),
        "latency_fwd": plots.cost_plot(
            frame, "latency_fwd_ms", "seq_len", colours, "median latency (ms)", "forward latency"
        ),
        "memory": plots.cost_plot(
            frame,
            "peak_mem_mb",
            "seq_len",
            colours,
            "peak memory (MiB)",
            "peak memory, forward+backward",
        ),
        "decode": plots.cost_plot(
            frame,
            "latency_decode_ms",
            "mem_len",
            colours,
            "median latency per token (ms)",
            "decoding through the cache",
        ),
    }
    failures, missing = _failures_and_missing(sweep_dir)
    others = other_runs(sweep_dir)
    environment, time_split = _provenance(sweep_dir, set(frame["run_id"].dropna()))
    context = {
        # the report's own name (reports/standard, even when built from reports/standard/runs)
        "title": f"posbench report: {sweep_dir.name if out_dir.name == 'report' else out_dir.name}",
        "sweep_dir": str(source or sweep_dir),
        "glance": _glance(overview_table, units, unranked),
        "task_tables": _task_tables(frame, units),
        "headline_notes": _headline_notes(frame),
        "tasks": [
            {
                "name": t,
                "length_plot": plots.accuracy_vs_length(frame, t, colours),
                "position_plot": plots.loss_vs_position(frame, t, colours),
                "cache_plot": plots.accuracy_vs_cache(frame, t, colours)
                if frame[(frame["task"] == t) & frame["mem_len"].notna()].shape[0]
                else None,
            }
            for t in tasks
        ],
        "costs": {k: v for k, v in costs.items() if v is not None},
        "memory_method": MEMORY_METHOD,
        "cost_captions": COST_CAPTIONS,
        "timing_method": describe_method(),
        **_literature(frame),
        "cross_task": [
            {
                "label": r["encoding_label"],
                **{
                    column: _with_interval(r[column], r[f"{column}_low"], r[f"{column}_high"])
                    for column in ("mrr_exact_match", "mrr_headline")
                },
                "tasks": int(r["tasks"]),
            }
            for r in cross_task_ranking(frame).to_dict("records")
        ],
        "papers": _paper_tables(frame),
        "text": _text_section(frame, colours),
        "deepmind": _deepmind_section(frame),
        "noisy_timings": int(frame["note"].fillna("").str.startswith("noisy").sum()),
        "bias": _bias_pictures(sweep_dir, frame, colours, problems) if tasks else [],
        "diagnostics": _diagnostics(sweep_dir, frame, colours, problems)
        if tasks
        else {"terms": [], "distance_plot": None},
        "config": json.dumps(config, indent=2, sort_keys=True),
        "config_rows": _config_rows(config),
        "environment": environment,
        "time_split": time_split,
        "failures": failures,
        "missing": missing,
        "problems": problems,
        "other_runs": others,
        "quick": bool(config.get("quick")),
        "about": config.get("about", ""),
        "differences": list(config.get("differences", [])),
        "scale": _scale_section(results, colours),
        "learning_rate": _probe_section(probe_dir, overview_table, config, probe_source)
        or _learning_rate_section(frame, config),
    }
    scale_sentences = context["scale"]["sentences"] if context["scale"] else []
    record = _report_record(sweep_dir, out_dir, frame, config, failures, missing, scale_sentences)
    record["command"] = report_command(source or sweep_dir, linked, probe_source or probe_dir)
    figures = _figure_files(context, linked)
    links = {figures[name]: f"{FIGURES_DIR}/{name}.png" for name in linked}
    env = Environment(
        loader=PackageLoader("posbench.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
    )
    env.filters["img_src"] = lambda png: links.get(png, f"data:image/png;base64,{png}")
    html = env.get_template("report.html.j2").render(**context)
    html_path = out_dir / "report.html"
    atomic_write_files(
        {
            results_csv: results.to_csv(index=False).encode("utf-8"),
            summary_csv: overview_table.to_csv(index=False).encode("utf-8"),
            out_dir / BY_LENGTH_FILE: summarise(frame).to_csv(index=False).encode("utf-8"),
            **{
                out_dir / FIGURES_DIR / f"{name}.png": base64.b64decode(png)
                for name, png in figures.items()
            },
            out_dir / REPORT_RECORD: (json.dumps(record, indent=2) + "\n").encode("utf-8"),
            html_path: html.encode("utf-8"),
        },
        "-o",
    )
    return Report(
        out_dir,
        html_path,
        results_csv,
        summary_csv,
        out_dir / BY_LENGTH_FILE,
        overview_table,
        problems,
        missing,
        others,
        unranked,
    )
