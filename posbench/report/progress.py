"""Progress of a sweep in the terminal: a bar for the sweep (runs done of those to run, with an
ETA) and one per run in progress (step, loss, steps/s), or plain lines where stdout is not a
terminal; then the closing summary of what ran."""

from __future__ import annotations

import time
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from posbench.experiment.config import RunConfig
from posbench.experiment.outcome import SweepOutcome
from posbench.report.overview import overview, unranked_tasks
from posbench.report.summary import sized_tasks
from posbench.report.terminal import print_overview
from posbench.store import collect

QUICK_BANNER = "QUICK RUN: few training steps and a small evaluation sample, for a first look only."


class RichReporter:
    """A runner Reporter drawing a sweep bar and one bar per run in progress (several when
    workers run in parallel). Labels are shown literally, never read as markup."""

    def __init__(self, console: Console, quick: bool = False) -> None:
        self.console = console
        self.quick = quick
        self.progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._sweep: TaskID | None = None
        self._runs: dict[str, tuple[TaskID, float]] = {}  # run id -> (bar, start time)

    def __enter__(self) -> "RichReporter":
        if self.quick:
            self.console.print(Text(QUICK_BANNER, style="bold yellow"))
        self.progress.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.progress.__exit__(kind, value, tb)

    def sweep_started(self, total: int, to_run: int) -> None:
        skipped = total - to_run
        detail = f"{skipped} already done" if skipped else ""
        self._sweep = self.progress.add_task("sweep", total=to_run, detail=detail)

    def run_started(self, run: RunConfig, steps: int) -> None:
        bar = self.progress.add_task(run.label, total=steps, detail="")
        self._runs[run.run_id] = (bar, time.perf_counter())

    def step(self, run: RunConfig, step: int, loss: float) -> None:
        if run.run_id not in self._runs:
            return
        bar, start = self._runs[run.run_id]
        rate = (step + 1) / max(time.perf_counter() - start, 1e-9)
        self.progress.update(bar, completed=step + 1, detail=f"loss {loss:.3f}  {rate:.0f} steps/s")

    def evaluating(self, run: RunConfig) -> None:
        if run.run_id in self._runs:
            self.progress.update(self._runs[run.run_id][0], detail="evaluating")

    def run_finished(self, run: RunConfig, status: str, seconds: float) -> None:
        if run.run_id in self._runs:
            bar, _ = self._runs.pop(run.run_id)
            self.progress.remove_task(bar)
        self.progress.console.print(Text(f"{run.label}: {status} ({seconds:.1f} s)", style="dim"))
        if self._sweep is not None:
            self.progress.advance(self._sweep)

    def note(self, message: str) -> None:
        self.progress.console.print(Text(message, style="dim"))


class PlainReporter:
    """A runner Reporter for logs (stdout not a terminal: CI, nohup, Slurm): one plain,
    flushed line per event, a training line every tenth of the steps."""

    def __init__(self, stream: TextIO, quick: bool = False) -> None:
        self.stream = stream
        self.quick = quick
        self._done = 0
        self._to_run = 0
        self._runs: dict[str, tuple[float, int]] = {}  # run id -> (start time, next step to print)

    def __enter__(self) -> "PlainReporter":
        if self.quick:
            self._line(QUICK_BANNER)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stream.flush()

    def _line(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=self.stream, flush=True)

    def sweep_started(self, total: int, to_run: int) -> None:
        self._to_run = to_run
        self._line(f"sweep: {total} run(s), {total - to_run} already done, {to_run} to run")

    def run_started(self, run: RunConfig, steps: int) -> None:
        self._runs[run.run_id] = (time.perf_counter(), 0)
        self._line(f"{run.label}: started, {steps} steps")

    def step(self, run: RunConfig, step: int, loss: float) -> None:
        if run.run_id not in self._runs:
            return
        start, due = self._runs[run.run_id]
        if step + 1 < due:
            return
        every = max(1, run.train.steps // 10)
        self._runs[run.run_id] = (start, (step + 1) // every * every + every)
        rate = (step + 1) / max(time.perf_counter() - start, 1e-9)
        self._line(
            f"{run.label}: step {step + 1}/{run.train.steps}, loss {loss:.4f}, {rate:.1f} steps/s"
        )

    def evaluating(self, run: RunConfig) -> None:
        self._line(f"{run.label}: evaluating")

    def run_finished(self, run: RunConfig, status: str, seconds: float) -> None:
        self._runs.pop(run.run_id, None)
        self._done += 1
        self._line(
            f"{run.label}: stored, {status} in {seconds:.1f} s [{self._done}/{self._to_run}]"
        )

    def note(self, message: str) -> None:
        self._line(message)


def make_reporter(console: Console, quick: bool = False) -> RichReporter | PlainReporter:
    """Rich bars on a terminal, plain lines otherwise."""
    return (
        RichReporter(console, quick) if console.is_terminal else PlainReporter(console.file, quick)
    )


def print_outcome(console: Console, outcome: SweepOutcome) -> None:
    """The headline table (encoding x task), what was written, and one line per failure,
    damaged run set aside and problem."""
    if outcome.finished_any:
        frame = sized_tasks(collect(outcome.out_dir, []))
        table = overview(frame)
        print_overview(console, table, unranked_tasks(frame, table))
    took = len(outcome.took_twin_model)
    console.print(
        Text(
            f"ran {len(outcome.ran)} run(s), skipped {len(outcome.skipped)} finished run(s)"
            + (
                f"; {took} fixed-budget run(s) took the model of an early-stopping twin that "
                "never stopped (the same weights; evaluated, not trained again)"
                if took
                else ""
            )
        ),
        soft_wrap=True,
    )
    console.print(Text(f"results: {outcome.results_csv}"), soft_wrap=True)
    for label, damage in outcome.set_aside.items():
        console.print(
            Text(f"set aside and redone: {label} ({damage})", style="yellow"), soft_wrap=True
        )
    for problem in outcome.problems:
        console.print(Text(f"skipped: {problem}", style="yellow"), soft_wrap=True)
    if outcome.missing:
        console.print(
            Text(
                f"{len(outcome.missing)} run(s) of this sweep are not stored although the sweep "
                f"ran them (their folders were removed while it ran?): "
                f"{', '.join(outcome.missing)}; run the same command again to redo them.",
                style="bold red",
            ),
            soft_wrap=True,
        )
    for label, error in outcome.failures.items():
        console.print(Text(f"FAILED {label}: {error}", style="bold red"), soft_wrap=True)
