"""Rich progress for a sweep (runs done / total with ETA) and the current run (step, loss,
steps/s), and the closing summary table."""
from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from posbench.config import RunConfig
from posbench.results import collect
from posbench.runner import SweepOutcome
from posbench.summary import headline

QUICK_BANNER = "QUICK RUN: few training steps and a small evaluation sample, for a first look only."


class RichReporter:
    """A runner Reporter drawing two progress bars."""

    def __init__(self, console: Console, quick: bool = False) -> None:
        self.console = console
        self.quick = quick
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._sweep = None
        self._run = None
        self._run_start = 0.0

    def __enter__(self) -> "RichReporter":
        if self.quick:
            self.console.print(f"[bold yellow]{QUICK_BANNER}[/]")
        self.progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.progress.__exit__(kind, value, tb)

    def sweep_started(self, total: int, to_run: int) -> None:
        skipped = total - to_run
        detail = f"{skipped} already done" if skipped else ""
        self._sweep = self.progress.add_task("sweep", total=to_run, detail=detail)

    def run_started(self, run: RunConfig, steps: int) -> None:
        if self._run is not None:
            self.progress.remove_task(self._run)
        label = Text(f"{run.task.name}/{run.encoding.display()}/s{run.seed}").plain
        self._run = self.progress.add_task(label, total=steps, detail="")
        self._run_start = time.perf_counter()

    def step(self, step: int, loss: float) -> None:
        if self._run is None or (step % 10 and step):
            return
        rate = (step + 1) / max(time.perf_counter() - self._run_start, 1e-9)
        self.progress.update(self._run, completed=step + 1, detail=f"loss {loss:.3f}  {rate:.0f} steps/s")

    def run_finished(self, run: RunConfig, status: str) -> None:
        if self._run is not None:
            task = self.progress.tasks[[t.id for t in self.progress.tasks].index(self._run)]
            self.progress.update(self._run, completed=task.total, detail=status)
        if self._sweep is not None:
            self.progress.advance(self._sweep)

    def note(self, message: str) -> None:
        self.progress.console.print(Text(message, style="dim"))


def _cell(value: float) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def print_outcome(console: Console, outcome: SweepOutcome) -> None:
    """The headline table (encoding x task), what was written, and one line per failure."""
    print_headline(console, headline(collect(outcome.out_dir)))
    console.print(f"ran {len(outcome.ran)} run(s), skipped {len(outcome.skipped)} finished run(s)")
    console.print(f"results: {outcome.results_csv}")
    for label, error in outcome.failures.items():
        console.print(Text(f"FAILED {label}: {error}", style="bold red"), soft_wrap=True)


def print_headline(console: Console, summary: pd.DataFrame) -> None:
    """encoding x task: in-distribution and beyond-length exact match."""
    table = Table(title="exact-match accuracy (mean over seeds)", title_justify="left")
    for column in ("task", "encoding", "in-dist", "2x len", "4x len", "seeds"):
        table.add_column(column, justify="left" if column in ("task", "encoding") else "right")
    for row in summary.itertuples():
        flag = " [yellow](undertrained)[/]" if not math.isnan(row.in_distribution) and row.in_distribution < 0.9 else ""
        table.add_row(Text(row.task), Text(row.encoding_label), _cell(row.in_distribution) + flag,
                      _cell(row.at_2x), _cell(row.at_4x), str(row.seeds))
    console.print(table)


def print_bench(console: Console, out_dir: Path) -> None:
    """Latency ratios to `nope` (forward+backward) and peak memory, encoding x length."""
    frame = collect(out_dir)
    rows = frame[frame["seq_len"].notna()]
    if rows.empty:
        console.print("no latency rows were measured")
        return
    table = Table(title="fwd+bwd latency vs nope (median ratio) | peak memory MiB", title_justify="left")
    table.add_column("encoding")
    lengths = sorted(rows["seq_len"].dropna().unique())
    for L in lengths:
        table.add_column(f"L={int(L)}", justify="right")
    for label, group in rows.groupby("encoding_label", sort=False):
        cells = []
        for L in lengths:
            at = group[group["seq_len"] == L].set_index("metric")["value"]
            ratio, mem = at.get("latency_fwdbwd_ratio", math.nan), at.get("peak_mem_mb", math.nan)
            cells.append(f"{_cell(ratio)}x | {_cell(mem)}" if not math.isnan(ratio) else "n/a")
        table.add_row(Text(str(label)), *cells)
    console.print(table)
    console.print(f"results: {out_dir / 'results.csv'}")
