"""`posbench inspect` in the terminal: one stored training run's diagnostics (the attention
backend it ran on and why, score terms and their health flags, attention mass by key distance,
reachability of indexed rows), read from the files the run stored; any other folder is one
sentence naming the run folders it could mean."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posbench.errors import ResultsError
from posbench.experiment.reachability import untrained_share
from posbench.store import (
    DISTANCE_FILE,
    REACHABILITY_FILE,
    RESULTS_FILE,
    TERMS_FILE,
    RunFolder,
    sweep_marker,
    training_runs,
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
    _print_kernels(console, (run.env() or {}).get("attention") or {})
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


def _print_kernels(console: Console, chosen: dict) -> None:
    """Which backend attention chose for the run's calls, and why each earlier one refused
    (env.json's `attention`; runs stored before posbench recorded it have none)."""
    for backend, entry in chosen.items():
        refused = "; ".join(f"{name}: {why}" for name, why in entry.get("refused", {}).items())
        line = f"attention: {backend} ({entry.get('calls', 0)} calls)"
        console.print(Text(line + (f"; not {refused}" if refused else "")), soft_wrap=True)


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
