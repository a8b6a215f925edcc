"""The overview table in the terminal: per task and encoding, the headline metric with its
interval, rank group, effective length and cost ratios, as summary.csv and the report's first
screen give it. Progress, `posbench bench` and `posbench inspect` have modules of their own
(report.progress, report.bench, report.inspect); their old names here still work, with a
DeprecationWarning, until 0.4.0."""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posbench.deprecation import warn_renamed
from posbench.experiment.config import UNDERTRAINED_BELOW, UNLEARNED_EXCESS
from posbench.report.overview import (
    HEADLINE_METRICS,
    SAME_AS_NOTE,
    overview_cells,
    overview_label,
)
from posbench.report.summary import EFFECTIVE_AT, EFFECTIVE_PENALTY


def print_overview(console: Console, table: pd.DataFrame, unranked: Sequence[str] = ()) -> None:
    """The answer at a glance, as summary.csv and the report's first screen give it: per task
    and encoding, the task's headline metric (mean over seeds ± the half-width of its 95% t
    interval), its rank group, the effective length and the cost ratios to nope; then why a
    task has no row (`unranked`, see overview.unranked_tasks)."""
    for sentence in unranked:
        console.print(Text(sentence, style="yellow"), soft_wrap=True)
    if table.empty:
        return
    one_seed = (table["seeds"] <= 1).all()
    interval = " (one seed: no interval)" if one_seed else " ± 95% t interval"
    out = Table(
        title="each task's headline metric, mean over seeds" + interval, title_justify="left"
    )
    costs = [c for c in ("latency", "memory") if table[f"{c}_ratio"].notna().any()]
    headers = ["task", "encoding", "metric", "value", "group", "eff. len", *costs]
    for header in headers:
        out.add_column(
            header,
            justify="left" if header in ("task", "encoding", "metric") else "right",
            no_wrap=True,
        )
    for task, group in table.groupby("task", sort=True):
        metric = HEADLINE_METRICS[group["headline_metric"].iloc[0]]
        for i, record in enumerate(group.to_dict("records")):
            cells = overview_cells(record)
            style = "bold" if record["best"] else ("dim" if not record["learned"] else "")
            out.add_row(
                Text(task if i == 0 else ""),
                Text(overview_label(record)),
                Text(metric.short if i == 0 else ""),
                Text(cells["headline"], style=style),
                cells["group"],
                cells["effective_length"],
                *[cells[c] for c in costs],
                end_section=i == len(group) - 1,
            )
    console.print(out)
    notes = [
        "group: letters, a holds the best; two encodings share a letter unless a Welch t test "
        "over seeds (Holm over the task's pairs, 5%) separates them; bold: separated from all",
        (
            f"eff. len: where free-running token accuracy falls below {EFFECTIVE_AT} of the way "
            f"from chance to 1 (loss tasks: the penalty rises above {EFFECTIVE_PENALTY} nats), "
            "interpolated between the evaluated lengths; >= L: it held to the longest length"
        ),
    ]
    if not table["learned"].all():
        notes.append(
            f"-: did not learn the task in distribution (exact match below "
            f"{UNDERTRAINED_BELOW}, or loss more than {UNLEARNED_EXCESS} nats above the floor); "
            "not ranked"
        )
    if (table["untrained_share"].fillna(0) > 0).any():
        notes.append("†: reads parameter rows training never reached (posbench inspect RUN_DIR)")
    if table["same_as"].astype(bool).any():
        notes.append(SAME_AS_NOTE)
    if costs:
        at = table["latency_at"].dropna()
        notes.append(
            "latency, memory: fwd+bwd time and peak memory of one layer / nope"
            + (f" at L={int(at.max())}" if len(at) else "")
        )
    for note in notes:
        console.print(Text(note, style="dim"), soft_wrap=True)


#: Names that moved out of this module in 0.3, and the module that holds each now.
MOVED = {
    "RichReporter": "posbench.report.progress",
    "PlainReporter": "posbench.report.progress",
    "make_reporter": "posbench.report.progress",
    "print_outcome": "posbench.report.progress",
    "QUICK_BANNER": "posbench.report.progress",
    "print_bench": "posbench.report.bench",
    "COST_NOTE_ABOVE": "posbench.report.bench",
    "BENCH_TABLE_METRICS": "posbench.report.bench",
    "print_inspection": "posbench.report.inspect",
}


def __getattr__(name: str) -> Any:
    """A moved name, from its new module, with a DeprecationWarning naming where it lives."""
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_renamed(f"{__name__}.{name}", f"{MOVED[name]}.{name}")
    return getattr(importlib.import_module(MOVED[name]), name)
