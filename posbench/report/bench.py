"""`posbench bench` in the terminal: fwd+bwd latency as a ratio to NoPE and peak memory, encoding
by length, with the reason each costly encoding costs what it does."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posbench.store import RESULTS_FILE, RunFolder, collect

#: Above this fwd+bwd ratio to NoPE, `posbench bench` says why the encoding costs what it does.
COST_NOTE_ABOVE = 2.5
BENCH_TABLE_METRICS = ("latency_fwdbwd_ratio", "peak_mem_mb")  # its cells, by length


def _cell(value: float) -> str:
    return (
        "n/a"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else f"{value:.2f}"
    )


def _print_kernels(console: Console, out_dir: Path, rows: pd.DataFrame) -> None:
    """Per encoding, the attention backends that served its timed calls (the profile's env.json;
    why each faster one refused is recorded there too)."""
    for label, group in rows.groupby("encoding_label", sort=False):
        chosen: list[str] = []
        for run_id in group["run_id"].dropna().unique():
            env = RunFolder(out_dir / str(run_id)).env() or {}
            chosen += [b for b in env.get("attention") or {} if b not in chosen]
        if chosen:
            console.print(Text(f"{label} ran on {', '.join(chosen)}"), soft_wrap=True)


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
    _print_kernels(console, out_dir, rows)
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
