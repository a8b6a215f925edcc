"""`posbench report`: results.csv, summary.csv and one self-contained report.html, built only
from the stored results (so it can be regenerated any time, also from a partial sweep)."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection

import pandas as pd
from jinja2 import Environment, PackageLoader, select_autoescape

from posbench.report import plots, published, scale
from posbench.errors import ResultsError
from posbench.experiment.memory import MEMORY_METHOD
from posbench.experiment.config import UNLEARNED_EXCESS
from posbench.report.literature import check_findings
from posbench.store import (
    DISTANCE_FILE,
    RESULTS_FILE,
    TERMS_FILE,
    RunFolder,
    atomic_write_files,
    check_overwritable,
    collect,
    other_runs,
    run_folders,
    sweep_marker,
    sweep_members,
    sweep_temporary_files,
)
from posbench.report.stats import GENERALISES_AT, Interval, rank_groups
from posbench.report.summary import (
    EFFECTIVE_AT,
    EFFECTIVE_PENALTY,
    HEADLINE_COLUMNS,
    LM_COLUMNS,
    comparison_kind,
    cost_columns,
    FAMILIES,
    cross_task_ranking,
    deepmind_scores,
    effective_lengths,
    encoding_order,
    family_scores,
    headline,
    learned_in_distribution,
    lm_headline,
    multi_size_tasks,
    sized_tasks,
    summarise,
)
from posbench.experiment.timing import describe_method
from posbench.version import __version__

#: The report's folder of PNG figures.
FIGURES_DIR = "figures"
ACCURACY_COLUMNS = tuple(column for column, _, _ in HEADLINE_COLUMNS)
COST_COLUMNS = ("latency_ratio", "memory_ratio")


@dataclass
class Report:
    """What was written and what the report could not include."""

    out_dir: Path
    html: Path
    results_csv: Path
    summary_csv: Path
    headline: pd.DataFrame
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    other_runs: list[dict[str, str]] = field(default_factory=list)
    lm_headline: pd.DataFrame = field(default_factory=pd.DataFrame)


def default_report_dir(sweep_dir: Path) -> Path:
    """Where a sweep's report goes: reports/NAME for a sweep in ./results/NAME (the documented
    layout), else a report/ folder inside the sweep folder, so reports never collide."""
    sweep_dir = Path(sweep_dir)
    if sweep_dir.resolve().parent == (Path.cwd() / "results").resolve():
        return Path("reports") / sweep_dir.name
    return sweep_dir / "report"


def _headline_rows(frame: pd.DataFrame) -> tuple[list[dict[str, Any]], dict[str, str]]:
    table = headline(frame)
    comparisons = comparison_kind(frame)
    costs = cost_columns(frame)
    if not costs.empty:
        table = table.merge(costs, on="encoding_label", how="left")
    for column in COST_COLUMNS:
        if column not in table:
            table[column] = math.nan
    noisy = (
        table["latency_noisy"].fillna(False).astype(bool)
        if "latency_noisy" in table
        else pd.Series(False, index=table.index)
    )
    learned = learned_in_distribution(frame)
    ranked = pd.Series(
        [bool(learned.get((t, e), True)) for t, e in zip(table["task"], table["encoding_label"])],
        index=table.index,
        dtype=bool,
    )  # a model that did not learn its task is never "best"
    best: dict[tuple[str, str], float] = {}
    for task, group in table.groupby("task"):
        for column in ACCURACY_COLUMNS:
            rows = group[ranked[group.index] & group[column].notna()]
            intervals = [
                Interval(r[column], r[f"{column}_low"], r[f"{column}_high"], int(r["seeds"]))
                for r in rows.to_dict("records")
            ]
            groups = rank_groups(intervals)
            if groups.count(1) == 1 and len(groups) > 1:  # bold only a group of one
                best[(task, column)] = intervals[groups.index(1)].mean
        for column in COST_COLUMNS:
            values = (
                group[column][~noisy[group.index]]
                if column == "latency_ratio"
                else group[column][ranked[group.index]]
            ).dropna()
            if values.nunique() > 1:  # a tie everywhere marks nothing
                best[(task, column)] = values.min()
    rows = []
    for record in table.to_dict("records"):
        cells = {}
        for column in ACCURACY_COLUMNS + COST_COLUMNS:
            value = record.get(column)
            missing = value is None or (isinstance(value, float) and math.isnan(value))
            if column in ACCURACY_COLUMNS:
                text = Interval(
                    value if not missing else math.nan,
                    record[f"{column}_low"],
                    record[f"{column}_high"],
                    0,
                ).text()
            else:
                text = "n/a" if missing else f"{value:.2f}x"
            flagged = (
                column == "latency_ratio" and bool(record.get("latency_noisy")) and not missing
            )
            untrained = _reads_untrained(record, column) and not missing
            cells[column] = {
                "text": text + (" (noisy)" if flagged else "") + (" †" if untrained else ""),
                "best": not missing and not flagged and best.get((record["task"], column)) == value,
            }
        effective = record.get("effective_length")
        cells["effective_length"] = {
            "text": "n/a"
            if effective is None or math.isnan(effective)
            else Interval(
                effective, record["effective_length_low"], record["effective_length_high"], 0
            ).text(1),
            "best": False,
        }
        chance = record.get("chance_at_2x")
        cells["chance_at_2x"] = {
            "text": "n/a" if chance is None or math.isnan(chance) else f"{chance:.2f}",
            "best": False,
        }
        rows.append(
            {
                "task": record["task"],
                "comparison": comparisons.get(record["task"], ""),
                "label": record["encoding_label"],
                "seeds": int(record["seeds"]),
                "best_at_2x": "n/a"
                if math.isnan(record["best_at_2x"])
                else f"{record['best_at_2x']:.2f}",
                "generalising": "n/a"
                if math.isnan(record["generalising"])
                else f"{record['generalising']:.0%}",
                "steps": ""
                if not isinstance(record.get("reached_threshold"), str)
                else (
                    f"{record['steps_to_threshold']:.0f} ({record['reached_threshold']})"
                    if not math.isnan(record["steps_to_threshold"])
                    else f"not reached (0/{record['reached_threshold'].split('/')[1]})"
                ),
                "undertrained": not learned.get((record["task"], record["encoding_label"]), True),
                "cells": cells,
            }
        )
    notes = {
        "interval": "mean over seeds ± the half-width of its 95% Student-t interval"
        if (table["seeds"] > 1).any()
        else "one seed per encoding: no interval can be given (run --seeds 0,1,2)",
        "generalises": f"{GENERALISES_AT:.0%}",
        "unlearned_excess": f"{UNLEARNED_EXCESS}",
        "effective_at": f"{EFFECTIVE_AT}",
        "effective_penalty": f"{EFFECTIVE_PENALTY}",
    }
    if costs["latency_at"].notna().any():
        notes["latency"] = f"fwd+bwd latency / nope at L={int(costs['latency_at'].max())}"
    if costs["memory_at"].notna().any():
        notes["memory"] = f"peak memory / nope at L={int(costs['memory_at'].max())}"
    return rows, notes


def _reads_untrained(record: dict[str, Any], column: str) -> bool:
    """Whether a headline cell's length reads parameter rows that training never reached."""
    for multiple in ("2x", "4x"):
        if column.endswith(f"at_{multiple}"):
            share = record.get(f"untrained_at_{multiple}")
            return isinstance(share, float) and share > 0
    return False


def _lm_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The loss-by-position headline as table cells (mean ± 95% interval)."""
    table = lm_headline(frame)
    rows = []
    for record in table.to_dict("records"):
        cells = {
            c: Interval(record[c], record[f"{c}_low"], record[f"{c}_high"], 0).text(3)
            for c in [c for c, _, _ in LM_COLUMNS] + ["excess_in_distribution"]
        }
        cells["effective_length"] = Interval(
            record["effective_length"],
            record["effective_length_low"],
            record["effective_length_high"],
            0,
        ).text(0)
        rows.append(
            {
                "task": record["task"],
                "label": record["encoding_label"],
                "seeds": int(record["seeds"]),
                "cells": cells,
                "unlearned": record["learned"] is False,
            }
        )
    return rows


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

    def cell(label: str, family: str, column: str) -> str:
        return f"{table.at[(label, family), column]:.3f}" if (label, family) in table.index else ""

    gains = []
    for label in labels:
        twin = f"{label}+random"
        if twin in labels:
            gains.append(
                {
                    "label": label,
                    "cells": [
                        f"{table.at[(twin, f), 'mean'] - table.at[(label, f), 'mean']:+.3f}"
                        if (twin, f) in table.index and (label, f) in table.index
                        else ""
                        for f in columns
                    ],
                }
            )
    return {
        "columns": columns,
        "tasks": {f: int(scores.loc[scores["family"] == f, "task"].nunique()) for f in FAMILIES},
        "rows": [
            {
                "label": label,
                "cells": [
                    f"{cell(label, f, 'mean')} ({cell(label, f, 'best')})"
                    if cell(label, f, "mean")
                    else ""
                    for f in columns
                ],
            }
            for label in labels
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
    return {
        "sizes": len(size_names),
        "size_names": size_names,
        "scored_by": " or ".join(sorted(scale.SCORED_BY.values())),
        "sentences": [v.sentence() for v in scale.scale_verdicts(taus, scores, tasks)],
        "ranks": rows,
        "taus": [
            {
                "task": r.task,
                "small": r.small,
                "large": r.large,
                "tau": f"{r.tau:.2f}",
                "interval": f"[{r.low:.2f}, {r.high:.2f}]",
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


#: What a report folder says about itself, for the index of published reports.
REPORT_RECORD = "report.json"


def _report_record(
    sweep_dir: Path,
    out_dir: Path,
    frame: pd.DataFrame,
    config: dict[str, Any],
    failures: list[dict[str, str]],
    missing: list[str],
) -> dict[str, Any]:
    """The report's name and purpose, when it was built and from which code, how much compute
    its runs took, and its headline (effective lengths, mean reciprocal ranks), so an index
    of reports needs no results of its own."""
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
            }
            for r in effective.to_dict("records")
        ],
        "mrr": [
            {
                "encoding": r["encoding_label"],
                "value": _finite(r["mrr_token_accuracy"]),
                "low": _finite(r["mrr_token_accuracy_low"]),
                "high": _finite(r["mrr_token_accuracy_high"]),
            }
            for r in cross_task_ranking(frame).to_dict("records")
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


def _environment(sweep_dir: Path) -> dict[str, Any]:
    """The versions and machine of the sweep's first run that recorded them."""
    for folder in run_folders(sweep_dir):
        try:
            env = folder.env()
        except ResultsError:
            continue
        if env:
            return env
    return {}


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
    figures |= {f"cost_{name}": png for name, png in context["costs"].items()}
    for plot in (context["scale"] or {}).get("plots", []):
        figures[f"score_vs_parameters_{plot['task']}"] = plot["png"]
    if context["diagnostics"].get("distance_plot"):
        figures["attention_distance"] = context["diagnostics"]["distance_plot"]
    files = {
        "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name): png
        for name, png in figures.items()
    }
    unknown = sorted(set(linked) - set(files))
    if unknown:
        raise ResultsError(
            f"--link-figures names no figure of this report: {', '.join(unknown)}; "
            f"its figures are {', '.join(sorted(files))}."
        )
    return files


def build_report(sweep_dir: Path, out_dir: Path, linked: Collection[str] = ()) -> Report:
    """Write results.csv, summary.csv, report.html and figures/ for the sweep in `sweep_dir`.
    report.html embeds every figure (one self-contained file) except those named in `linked`,
    which it shows from figures/ (a published report whose README shows a figure holds it
    once). Everything is built before anything is written, and the files are written as one
    set: an interrupt leaves the previous report whole."""
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
    if out_dir.is_dir():
        sweep_temporary_files(out_dir)
    for path, signature in (
        (results_csv, "run_id,task,encoding,"),
        (summary_csv, "task,encoding_label,"),
        (out_dir / "report.html", "<title>posbench report"),
    ):
        check_overwritable(path, signature, "-o")

    colours = plots.colour_map(sorted(frame["encoding_label"].unique()))
    tasks = sorted(frame["task"].dropna().unique())
    headline_rows, headline_notes = _headline_rows(frame)
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
    config = sweep_marker(sweep_dir).get("config", {})
    others = other_runs(sweep_dir)
    context = {
        "title": f"posbench report: {sweep_dir.name}",
        "sweep_dir": str(sweep_dir),
        "headline": headline_rows,
        "headline_notes": headline_notes,
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
        "timing_method": describe_method(),
        "literature": [dataclasses.asdict(v) for v in check_findings(frame)],
        "lm_headline": _lm_rows(frame),
        "cross_task": [
            {
                "label": r["encoding_label"],
                **{
                    column: _with_interval(r[column], r[f"{column}_low"], r[f"{column}_high"])
                    for column in ("mrr_exact_match", "mrr_token_accuracy")
                },
                "tasks": int(r["tasks"]),
            }
            for r in cross_task_ranking(frame).to_dict("records")
        ],
        "papers": _paper_tables(frame),
        "deepmind": _deepmind_section(frame),
        "noisy_timings": int(frame["note"].fillna("").str.startswith("noisy").sum()),
        "bias": _bias_pictures(sweep_dir, frame, colours, problems) if tasks else [],
        "diagnostics": _diagnostics(sweep_dir, frame, colours, problems)
        if tasks
        else {"terms": [], "distance_plot": None},
        "config": json.dumps(config, indent=2, sort_keys=True),
        "config_rows": _config_rows(config),
        "environment": _environment(sweep_dir),
        "failures": failures,
        "missing": missing,
        "problems": problems,
        "other_runs": others,
        "quick": bool(config.get("quick")),
        "about": config.get("about", ""),
        "scale": _scale_section(results, colours),
    }
    record = _report_record(sweep_dir, out_dir, frame, config, failures, missing)
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
            summary_csv: summarise(frame).to_csv(index=False).encode("utf-8"),
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
        headline(frame),
        problems,
        missing,
        others,
        lm_headline(frame),
    )
