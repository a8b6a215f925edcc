"""Rich progress for a sweep (runs done / total with ETA) and the current run (step, loss,
steps/s), and the closing summary table."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pandas as pd
from types import TracebackType
from typing import Sequence, TextIO

from rich.console import Console
from rich.progress import (
    TaskID,
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from posbench.experiment.config import UNDERTRAINED_BELOW, UNLEARNED_EXCESS, RunConfig
from posbench.errors import ResultsError
from posbench.experiment.reachability import untrained_share
from posbench.store import (
    DISTANCE_FILE,
    REACHABILITY_FILE,
    RESULTS_FILE,
    TERMS_FILE,
    RunFolder,
    collect,
    sweep_marker,
    training_runs,
)
from posbench.experiment.outcome import SweepOutcome
from posbench.report.overview import (
    HEADLINE_METRICS,
    SAME_AS_NOTE,
    overview,
    overview_cells,
    overview_label,
    unranked_tasks,
)
from posbench.report.summary import EFFECTIVE_AT, EFFECTIVE_PENALTY, sized_tasks

#: Above this fwd+bwd ratio to NoPE, `posbench bench` says why the encoding costs what it does.
COST_NOTE_ABOVE = 2.5
BENCH_TABLE_METRICS = ("latency_fwdbwd_ratio", "peak_mem_mb")  # its cells, by length
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


def _cell(value: float) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.2f}"
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


def print_bench(console: Console, out_dir: Path, device: str = "cpu") -> None:
    """Latency ratios to `nope` (forward+backward) and peak memory, encoding x length, with
    each costly encoding's cost note (they explain the CPU kernels, so not on CUDA)."""
    frame = collect(out_dir, [])
    rows = frame[frame["seq_len"].notna() & frame["metric"].isin(BENCH_TABLE_METRICS)]
    if rows.empty:
        console.print("no latency rows were measured")
        return
    table = Table(
        title="fwd+bwd latency vs nope (median ratio) | peak memory MiB", title_justify="left"
    )
    table.add_column("encoding")
    lengths = sorted(rows["seq_len"].dropna().unique())
    for L in lengths:
        table.add_column(f"L={int(L)}", justify="right")
    for label, group in rows.groupby("encoding_label", sort=False):
        cells = []
        for L in lengths:
            at = group[group["seq_len"] == L].set_index("metric")
            ratio = at["value"].get("latency_fwdbwd_ratio", math.nan)
            mem = at["value"].get("peak_mem_mb", math.nan)
            noisy = str(at["note"].get("latency_fwdbwd_ratio", "")).startswith("noisy")
            cells.append(
                f"{_cell(ratio)}x{'?' if noisy else ''} | {_cell(mem)}"
                if not math.isnan(ratio)
                else "n/a"
            )
        table.add_row(Text(str(label)), *cells)
    console.print(table)
    _print_cost_notes(console, rows, device)
    if rows["note"].fillna("").str.startswith("noisy").any():
        console.print(
            Text(
                "? marks a noisy timing (other processes competed for the CPU, or a wide IQR): "
                "see the note column of results.csv and measure again on a quiet machine.",
                style="yellow",
            )
        )
    console.print(Text(f"results: {out_dir / RESULTS_FILE}"), soft_wrap=True)


def _print_cost_notes(console: Console, rows: pd.DataFrame, device: str) -> None:
    """Why each encoding above COST_NOTE_ABOVE costs what it does: its cost note, which explains
    the CPU kernels, so on CUDA one line on the paths taken there instead."""
    if device.startswith("cuda"):
        console.print(
            Text(
                "On CUDA the encodings with a per-distance bias run through flex_attention "
                "(heads of 16 or more) and the others through SDPA; the cost notes, which "
                "explain the CPU kernels, are left out.",
                style="dim",
            ),
            soft_wrap=True,
        )
        return
    from posbench.encodings import REGISTRY

    for name, group in rows[rows["metric"] == "latency_fwdbwd_ratio"].groupby(
        "encoding", sort=False
    ):
        worst = group.loc[group["value"].idxmax()]
        if worst["value"] > COST_NOTE_ABOVE:
            reason = (
                getattr(REGISTRY.get(name), "cost_note", "") if name in REGISTRY.names() else ""
            )
            reason = reason or "it declares no cost_note"
            console.print(
                Text(
                    f"{name}: {worst['value']:.1f}x nope at L={int(worst['seq_len'])}, because "
                    f"{reason}"
                ),
                soft_wrap=True,
            )


def print_inspection(console: Console, folder: Path) -> None:
    """One stored run's diagnostics in the terminal, from the files it stored: its score terms
    at the last probe with the health flags, where its attention mass lies by key distance,
    and which indexed rows training reached. Any folder that is not a finished training run
    is one sentence naming the run folders it could mean."""
    run = RunFolder(Path(folder))
    _check_training_run(run)
    result = run.result() or {}
    console.print(Text(f"{run.label()}: {result.get('status')}"), soft_wrap=True)
    terms = run.table(TERMS_FILE)
    if terms is None:
        console.print(
            Text(
                "score terms: this run stored no probes (it evaluated a model another run trained)"
            )
        )
    else:
        _print_terms(console, terms, result.get("health_flags") or [])
    distances = run.table(DISTANCE_FILE)
    if distances is not None:
        _print_distances(console, distances)
    _print_reachability(console, run.table(REACHABILITY_FILE), result)


def _check_training_run(run: RunFolder) -> None:
    """Raise ResultsError, in one sentence naming what to pass instead, unless `run` is a
    finished training run."""
    folder = run.path
    example = "e.g. results/default/<run id>"
    if not folder.is_dir():
        raise ResultsError(
            f"{folder} is not a folder; pass one training run's folder inside a sweep folder, "
            f"{example}."
        )
    if sweep_marker(folder) or not run.exists():
        is_sweep = bool(sweep_marker(folder))
        sweep = (
            folder if is_sweep else folder.parent
        )  # a sweep's report/ or damaged/ folder names its runs
        runs = training_runs(sweep) if is_sweep or sweep_marker(sweep) else {}
        what = "a sweep folder, not one run" if is_sweep else "not a posbench run folder"
        raise ResultsError(
            f"{folder} is {what}; pass one training run's folder, "
            f"{_examples(sweep, runs, example)}."
        )
    sweep = folder.parent
    if run.is_profile():
        runs = training_runs(sweep)
        raise ResultsError(
            f"{folder} is a latency/memory profile ({run.label()}), not a training run: its "
            "numbers are "
            f"in {sweep / RESULTS_FILE}; to inspect a training run pass "
            f"{_examples(sweep, runs, 'one that `posbench run` wrote')}."
        )
    result = run.result()
    if result is None or result.get("status") != "ok":
        state = (
            "has not finished" if result is None else f"ended with status {result.get('status')!r}"
        )
        raise ResultsError(
            f"{folder} ({run.label()}) {state}, so it stored no diagnostics; run the sweep's "
            "command again to finish it, or pass another run's folder."
        )
    damage = run.damage()
    if damage:
        raise ResultsError(
            f"{damage}; run the sweep's command again: the damaged run is set aside and redone."
        )


def _examples(sweep: Path, runs: dict[str, str], otherwise: str) -> str:
    """Up to three run folders of `sweep` with their labels, for an error message."""
    if not runs:
        return otherwise
    shown = ", ".join(f"{sweep / run_id} ({label})" for run_id, label in list(runs.items())[:3])
    more = f", or any of its other {len(runs) - 3} training runs" if len(runs) > 3 else ""
    return f"e.g. {shown}{more}"


def _print_terms(console: Console, terms: pd.DataFrame, flags: list[str]) -> None:
    last = terms[terms["step"] == terms["step"].max()]
    table = Table(title=f"score terms at step {int(last['step'].iloc[0])}", title_justify="left")
    for column in ("layer", "term", "mean", "std", "attention moved", "gradient"):
        table.add_column(column, justify="left" if column in ("term",) else "right", no_wrap=True)
    for row in last.itertuples():
        table.add_row(
            str(row.layer),
            Text(str(row.term)),
            f"{row.mean:+.4f}",
            f"{row.std:.4f}",
            f"{row.mass_moved:.3f}",
            "yes" if row.learns else "none",
        )
    console.print(table)
    for flag in flags:
        console.print(Text(f"flag: {flag}", style="yellow"), soft_wrap=True)
    if not flags:
        console.print(
            Text(
                "health: no flags (every term non-zero, reachable by a gradient, within 100x of "
                "the largest)"
            )
        )


def _print_distances(console: Console, distances: pd.DataFrame) -> None:
    spread = Table(title="attention mass by key distance", title_justify="left")
    for column in ("sequence", "tokens", "distance 0", "<= 3", "<= 15", "mean distance"):
        spread.add_column(column, justify="left" if column == "sequence" else "right", no_wrap=True)
    for kind, rows in distances.groupby("kind", sort=False):
        mass, distance = rows["mass"].to_numpy(), rows["distance"].to_numpy()
        spread.add_row(
            Text(str(kind)),
            str(int(rows["tokens"].iloc[0])),
            f"{mass[distance == 0].sum():.3f}",
            f"{mass[distance <= 3].sum():.3f}",
            f"{mass[distance <= 15].sum():.3f}",
            f"{(mass * distance).sum():.1f}",
        )
    console.print(spread)


def _print_reachability(console: Console, frame: pd.DataFrame | None, result: dict) -> None:
    """Which indexed rows training reached and how much of each evaluation length reads
    untrained ones, from the table the run stored."""
    messages = result.get("unreached")
    if messages is None:
        console.print(
            Text(
                "reachability: this run stored no table; `posbench run --force` redoes it with one"
            )
        )
        return
    if frame is None:
        console.print(
            Text("reachability: the encoding has no position- or distance-indexed parameters")
        )
        return
    table = Table(
        title="reachability: share of pairs (or tokens) reading rows training never reached",
        title_justify="left",
    )
    shares = untrained_share(frame.astype({"phase": str}))
    for length in shares:
        table.add_column(f"len {length}", justify="right", no_wrap=True)
    table.add_row(*(f"{share:.3f}" for share in shares.values()))
    console.print(table)
    for message in messages:
        console.print(Text(f"unreached: {message}", style="yellow"), soft_wrap=True)
    if not messages:
        console.print(Text("reachability: every row evaluation reads was reached in training"))
