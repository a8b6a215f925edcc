"""Issue #58's evaluation goal: on one standard run per task, evaluation takes at most half the
time it took on main when the issue was filed (BASELINE), with the same numbers.

The runs are the standard suite's Transformer-XL runs of seed 0 (every task), trained into
POSBENCH_EVAL_RUNS (default results/eval-speed) on first use, about 15 minutes here, and read
from there afterwards. Each run's stored model is evaluated in fresh processes by the baseline
commit's code (taken out of git) and by today's, alternating, ROUNDS times each; each side's
median counts (these machines are shared, and one round of either side may run slow). The
baseline builds its C++ kernels into a folder of its own, once, so that the two checkouts do not
rebuild each other's (torch's loader builds again when the sources' folder changes). The two
sides' measurements are compared value by value."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from posbench.store import RunFolder

#: main when issue #58 was filed, before evaluation reused its full-context pass.
BASELINE = "02ee5159"
ROOT = Path(__file__).resolve().parents[1]
RUNS = Path(os.environ.get("POSBENCH_EVAL_RUNS", ROOT / "results" / "eval-speed"))
THREADS = int(os.environ.get("POSBENCH_BENCH_THREADS", "2"))
ROUNDS = 3
#: Metrics whose value is a share of answer tokens or sequences: a float32 near-tie may flip
#: one prediction between the two codes' kernels, so they may differ by this much.
ACCURACY_SLACK = 0.01


def _baseline_tree(tmp: Path) -> Path:
    """The BASELINE commit's source, from this checkout's git history."""
    try:
        archive = subprocess.run(
            ["git", "archive", BASELINE, "posbench"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"this checkout's git history lacks commit {BASELINE} (a shallow clone?)")
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp


def _trained_runs() -> list[Path]:
    """One finished standard run per task (Transformer-XL, seed 0), trained here if missing."""
    if not any(RunFolder(p).is_finished() for p in RUNS.glob("*") if p.is_dir()):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "posbench.cli",
                "run",
                "--suite",
                "standard",
                "--encodings",
                "txl",
                "--seeds",
                "0",
                "--out",
                str(RUNS),
                "--threads",
                str(THREADS),
                "--no-report",
            ],
            cwd=ROOT,
            check=True,
        )
    return sorted(p for p in RUNS.iterdir() if p.is_dir() and (p / "model.pt").exists())


def _evaluate(source: Path, run: Path, kernels: Path | None = None) -> dict:
    """One evaluation of `run`'s model by the posbench in `source`, in a fresh process, its C++
    kernels built in `kernels` (None: where posbench builds them)."""
    worker = ROOT / "benchmarks" / "evaluate_stored_run.py"
    env = os.environ | {"PYTHONPATH": str(source)}
    if kernels is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(kernels)
    done = subprocess.run(
        [sys.executable, str(worker), str(run), str(THREADS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _differences(before: list[dict], after: list[dict]) -> list[str]:
    """Where the two sides' measurements differ beyond round-off (a loss) or one flipped
    prediction's worth (a share)."""
    key = ("eval_len", "mem_len", "metric", "position")
    old = {tuple(r[k] for k in key): r["value"] for r in before}
    new = {tuple(r[k] for k in key): r["value"] for r in after}
    # lm_penalty is lm_loss minus lm_loss_window: its round-off is the losses' (about 2 nats),
    # so near 0 it is compared on the loss's scale, not its own.
    loss_at = {
        (r["eval_len"], r["position"]): abs(r["value"])
        for r in before
        if r["metric"] == "lm_loss" and r["value"] is not None
    }
    out = [f"{k}: only before" for k in old.keys() - new.keys()]
    out += [f"{k}: only after" for k in new.keys() - old.keys()]
    for k in old.keys() & new.keys():
        a, b = old[k], new[k]
        if a is None or b is None:
            if a is not b:
                out.append(f"{k}: {a} -> {b}")
            continue
        share = "accuracy" in k[2] or k[2] == "exact_match"
        scale = loss_at.get((k[0], k[3]), 0.0) if k[2] == "lm_penalty" else 0.0
        close = (
            abs(a - b) <= ACCURACY_SLACK
            if share
            else math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4 * scale)
        )
        if not close:
            out.append(f"{k}: {a} -> {b}")
    return out


def test_evaluation_takes_half_the_baseline_time_with_the_same_numbers(
    tmp_path: Path, record_goal
) -> None:
    baseline = _baseline_tree(tmp_path)
    runs = _trained_runs()
    assert runs, f"no stored runs with weights in {RUNS}"
    for run in runs:
        before, after = [], []
        for _ in range(ROUNDS):
            before.append(_evaluate(baseline, run, tmp_path / "baseline-kernels"))
            after.append(_evaluate(ROOT, run))
        task = after[0]["task"]
        median_before = statistics.median(r["seconds"] for r in before)
        median_after = statistics.median(r["seconds"] for r in after)
        rounds = ", ".join(f"{b['seconds']:.1f}/{a['seconds']:.1f}" for b, a in zip(before, after))
        print(
            f"\n{task}: evaluation {median_before:.1f} s at {BASELINE}, {median_after:.1f} s now "
            f"(medians of {ROUNDS}; rounds before/now: {rounds})"
        )
        differences = _differences(before[0]["rows"], after[0]["rows"])
        assert not differences, f"{task}: " + "; ".join(differences[:10])
        record_goal(
            f"evaluation of the standard {task} run, baseline / now",
            median_before / median_after,
            2.0,
            higher_is_better=True,
        )
