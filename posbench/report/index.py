"""The front page of a folder of reports: one self-contained index.html that links every report
in it with its purpose, headline (effective lengths, mean reciprocal rank, and whether the
ranking holds across model sizes), when and from which code it was built, and how much compute
its runs took, read from each report's report.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from posbench.errors import ResultsError
from posbench.report.html import REPORT_RECORD
from posbench.store import atomic_write_text, check_overwritable

INDEX_FILE = "index.html"
#: What the front page reads from a report's record.
RECORD_FIELDS = frozenset(
    {"about", "built", "built_by", "posbench_versions", "commits", "runs", "failed", "missing"}
    | {"compute_seconds", "effective_lengths", "mrr"}
)
#: What a field of a report record must be: the types it may have and how to say so.
TEXT = ((str,), "text")
WHOLE = ((int,), "a whole number")
NUMBER = ((int, float), "a number")
NUMBER_OR_NULL = ((int, float, type(None)), "a number or null")
ROWS = ((list,), "a list")
#: The type of each field the front page reads, and of each field of the rows in a list.
RECORD_TYPES = {
    "about": TEXT,
    "built": TEXT,
    "built_by": TEXT,
    "posbench_versions": ROWS,
    "commits": ROWS,
    "runs": WHOLE,
    "failed": WHOLE,
    "missing": WHOLE,
    "compute_seconds": NUMBER,
    "effective_lengths": ROWS,
    "mrr": ROWS,
}
ROW_TYPES = {
    "effective_lengths": {"task": TEXT, "encoding": TEXT, "value": NUMBER_OR_NULL},
    "mrr": {"encoding": TEXT, "value": NUMBER_OR_NULL},
}
NOT_LEARNED = "no encoding learned the task in distribution"
#: Encodings shown per task on the front page (by effective length, longest first).
TOP_ENCODINGS = 3


@dataclass
class IndexedReport:
    """One report on the front page (`record` empty for a report built before report.json)."""

    folder: str
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def best_by_task(self) -> list[dict[str, str]]:
        """Per task, the encodings with the longest effective length, with their intervals,
        among those that learned the task in distribution (a record from before that flag
        counts every encoding as learned)."""
        by_task: dict[str, list[dict[str, Any]]] = {}
        for row in self.record.get("effective_lengths", []):
            rows = by_task.setdefault(row["task"], [])
            if row["value"] is not None and row.get("learned", True):
                rows.append(row)
        learned = {task: rows for task, rows in by_task.items() if rows}
        lines = [
            {
                "task": task,
                "best": "effective length: "
                + ", ".join(
                    f"{row['encoding']} {_interval(row)}"
                    for row in sorted(rows, key=lambda r: -r["value"])[:TOP_ENCODINGS]
                ),
            }
            for task, rows in sorted(learned.items())
        ]
        unlearned = sorted(set(by_task) - set(learned))
        if len(unlearned) == 1:
            lines.append({"task": unlearned[0], "best": NOT_LEARNED})
        elif unlearned:  # one line, however many: a suite mostly not learned says so once
            lines.append(
                {
                    "task": f"{len(unlearned)} of {len(by_task)} tasks",
                    "best": f"{NOT_LEARNED}: {', '.join(unlearned)}",
                }
            )
        return lines

    @property
    def mrr_scope(self) -> str:
        """What the MRR row averages over: a sweep of several model sizes averages each task's
        sizes before averaging across tasks, as it averages a task's protocols."""
        sizes = bool(self.record.get("scale"))
        return "across tasks (each task's sizes averaged)" if sizes else "across tasks"

    @property
    def best_mrr(self) -> str:
        """The encodings with the highest MRR, each with how many tasks it was ranked on (those
        it learned): an MRR over one task does not compare with one over four."""
        rows = [r for r in self.record.get("mrr", []) if r["value"] is not None]
        return ", ".join(
            f"{row['encoding']} {_interval(row, 2)}{_over_tasks(row)}"
            for row in sorted(rows, key=lambda r: -r["value"])[:TOP_ENCODINGS]
        )


def _over_tasks(row: dict[str, Any]) -> str:
    """' over 3 tasks', or nothing for a record from before the count was kept."""
    tasks = row.get("tasks")
    if tasks is None:
        return ""
    return f" over {tasks} task{'' if tasks == 1 else 's'}"


def _interval(row: dict[str, Any], digits: int = 0) -> str:
    """'32 [24, 40]', or the value alone without an interval; '>= 64' where every seed held to
    the longest evaluated length (an effective length whose real limit lies beyond)."""
    value = f"{row['value']:.{digits}f}"
    if (row.get("censored") or 0) >= 1:
        return f">= {value}"
    if row.get("low") is None:
        return value
    return f"{value} [{row['low']:.{digits}f}, {row['high']:.{digits}f}]"


def _wrong_field(record: dict[str, Any]) -> str | None:
    """The first field of a report record the front page cannot read, described; None where
    every field is readable."""

    def wrong(value: Any, kind: tuple[tuple[type, ...], str]) -> bool:
        return isinstance(value, bool) or not isinstance(value, kind[0])

    for key, kind in RECORD_TYPES.items():
        if wrong(record[key], kind):
            return f"{key} is {json.dumps(record[key])}, not {kind[1]}"
    for key, fields in ROW_TYPES.items():
        for row in record[key]:
            if not isinstance(row, dict):
                return f"{key} holds {json.dumps(row)}, not a row with {', '.join(fields)}"
            for name, kind in fields.items():
                if wrong(row.get(name), kind):
                    return f"a row of {key} has {name} = {json.dumps(row.get(name))}, not {kind[1]}"
    return None


@dataclass(frozen=True)
class HeadlineTable:
    """Encodings x reports: each cell the report's mean reciprocal rank of that encoding with
    its interval and the number of tasks it was ranked on; "-" where the report ran the
    encoding but it learned none of its tasks, "" where the report did not run it. Rows are
    configurations (name and options), so an entry two reports label differently is one row."""

    reports: list[str]
    rows: list[tuple[str, list[str]]]  # (configuration, one cell per report)


def headline_table(reports: list[IndexedReport]) -> HeadlineTable:
    """The headline table of the reports whose record ranks encodings across tasks with an
    interval over seeds, but for learning-rate probes (their ranking pools the rates): a
    one-seed run (the default) has a pattern to confirm, not a ranking."""
    ranked = [
        r
        for r in reports
        if r.record.get("mrr")
        and not r.record.get("probes_learning_rate")
        and any(row.get("low") is not None for row in r.record["mrr"])
    ]
    cells: dict[str, dict[str, str]] = {}
    for report in ranked:
        entries = {e["label"]: _configuration(e) for e in report.record.get("encodings", [])}
        for entry in entries.values():
            cells.setdefault(entry, {})[report.folder] = "-"
        for row in report.record["mrr"]:
            if row["value"] is not None:
                entry = entries.get(row["encoding"], row["encoding"])
                cells.setdefault(entry, {})[report.folder] = (
                    f"{_interval(row, 2)} ({row.get('tasks', '?')})"
                )
    order = sorted(cells, key=lambda e: (-sum(c != "-" for c in cells[e].values()), e))
    return HeadlineTable(
        [r.folder for r in ranked],
        [(entry, [cells[entry].get(r.folder, "") for r in ranked]) for entry in order],
    )


def _configuration(entry: dict[str, Any]) -> str:
    """An encoding entry as its registered name and options: `t5 (max_distance=train/4)`."""
    options = entry.get("options") or {}
    if not options:
        return entry["name"]
    return f"{entry['name']} ({', '.join(f'{k}={v}' for k, v in sorted(options.items()))})"


def headline_markdown(table: HeadlineTable, page: str = "reports/{report}/README.md") -> str:
    """The headline table in Markdown, each report's column linking `page`."""
    header = ["encoding", *(f"[{r}]({page.format(report=r)})" for r in table.reports)]
    lines = [
        "| " + " | ".join(header) + " |",
        "| --- |" + " ---: |" * len(table.reports),
        *("| " + " | ".join([f"`{entry}`", *cells]) + " |" for entry, cells in table.rows),
    ]
    return "\n".join(lines) + "\n"


#: The markers between which `posbench index --readme FILE` writes the headline table.
HEADLINE_START, HEADLINE_END = "<!-- headline:start -->", "<!-- headline:end -->"


def write_headline(reports_dir: Path, readme: Path) -> None:
    """Write the headline table of the reports in `reports_dir` between the markers of
    `readme`, leaving the rest of the file as it is."""
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    start, end = text.find(HEADLINE_START), text.find(HEADLINE_END)
    if start < 0 or end < start:
        raise ResultsError(
            f"{readme} has no lines {HEADLINE_START} and {HEADLINE_END}; add them where the "
            "headline table belongs and run the same command again."
        )
    table = headline_markdown(headline_table(read_reports(reports_dir)))
    atomic_write_text(
        readme, text[: start + len(HEADLINE_START)] + "\n" + table + text[end:], "--readme"
    )


def read_reports(reports_dir: Path) -> list[IndexedReport]:
    """Every report folder in `reports_dir` (those with a report.html), with its record."""
    found = []
    for folder in sorted(p for p in Path(reports_dir).iterdir() if (p / "report.html").is_file()):
        record_file = folder / REPORT_RECORD
        record: dict[str, Any] = {}
        if record_file.is_file():
            try:
                record = json.loads(record_file.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ResultsError(
                    f"{record_file} is corrupt ({err}); rebuild that report with `posbench "
                    "report` and run the same command again."
                ) from None
            lacking = sorted(RECORD_FIELDS - set(record if isinstance(record, dict) else ()))
            if lacking:
                raise ResultsError(
                    f"{record_file} is not a posbench report record (it lacks "
                    f"{', '.join(lacking)}); rebuild that report with `posbench report` and run "
                    "the same command again."
                )
            wrong = _wrong_field(record)
            if wrong:
                raise ResultsError(
                    f"{record_file} is not a posbench report record ({wrong}); rebuild that "
                    "report with `posbench report` and run the same command again."
                )
        found.append(IndexedReport(folder.name, record))
    return found


def build_index(reports_dir: Path) -> Path:
    """Write `reports_dir`/index.html linking every report in it; returns its path."""
    reports_dir = Path(reports_dir)
    if not reports_dir.is_dir():
        raise ResultsError(
            f"{reports_dir} is not a folder; pass the folder that holds your reports (e.g. "
            "reports)."
        )
    reports = read_reports(reports_dir)
    if not reports:
        raise ResultsError(
            f"{reports_dir} holds no report (no <folder>/report.html); build one with "
            "`posbench report` first."
        )
    path = reports_dir / INDEX_FILE
    check_overwritable(path, "<title>posbench reports", "folder")
    env = Environment(
        loader=PackageLoader("posbench.report", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
    )
    html = env.get_template("index.html.j2").render(
        reports=reports, top=TOP_ENCODINGS, headline=headline_table(reports)
    )
    atomic_write_text(path, html)
    return path
