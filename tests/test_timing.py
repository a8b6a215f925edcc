"""The timing noise guard: contention from other processes is measured, retried and marked."""

from __future__ import annotations

import subprocess
import sys

from posbench.experiment.config import EncodingSpec
from posbench.experiment.profiling import BenchConfig, latency_rows
from posbench.experiment.timing import (
    CONTENTION_LIMIT,
    NOISE_TRIES,
    CpuSample,
    foreign_cores,
    guarded,
    noise_note,
)


def test_foreign_cores_subtracts_this_process() -> None:
    before = CpuSample(busy=100, total=1000, own=20, cpus=2)
    after = CpuSample(busy=300, total=1200, own=70, cpus=2)  # 100 ticks per CPU elapsed
    assert foreign_cores(before, after) == 1.5  # 200 busy ticks, 50 of them ours
    assert foreign_cores(before, CpuSample(busy=150, total=1200, own=70, cpus=2)) == 0.0


def _samples(*cores: float):
    """A fake sampler whose consecutive (before, after) pairs show `cores` foreign cores."""
    readings, busy, total = [], 0, 0
    for c in cores:
        readings.append(CpuSample(busy, total, 0, 2))
        busy, total = busy + int(100 * c), total + 200
        readings.append(CpuSample(busy, total, 0, 2))
    return iter(readings).__next__


def test_guard_repeats_a_contended_measurement_and_keeps_the_quietest() -> None:
    calls = []
    quiet = guarded(lambda: calls.append(1) or len(calls), sample=_samples(1.0, 0.0))
    assert (quiet.value, quiet.tries, quiet.contended, quiet.note()) == (2, 2, False, "")
    calls.clear()
    noisy = guarded(lambda: calls.append(1) or len(calls), sample=_samples(1.5, 0.9, 1.2))
    assert (noisy.value, noisy.tries, noisy.contended) == (2, NOISE_TRIES, True)
    assert noisy.note() == "noisy: other processes used 0.9 cores during this timing (3 tries)"
    assert 0.9 > CONTENTION_LIMIT


def test_noise_note_flags_a_wide_iqr() -> None:
    quiet = guarded(lambda: None, sample=_samples(0.0))
    assert noise_note(quiet, (10.0, 1.0)) == ""
    assert noise_note(quiet, (10.0, 1.0), (4.0, 2.0)) == "noisy: IQR 50% of the median"


def test_a_timing_beside_a_busy_process_is_marked_noisy() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        config = BenchConfig(
            seq_lens=(32,), batch_size=2, n_heads=2, d_head=8, threads=1, min_run_time=0.2
        )
        rows = latency_rows(EncodingSpec("alibi"), config)
    finally:
        busy.kill()
        busy.wait()
    ratio = next(r for r in rows if r["metric"] == "latency_fwdbwd_ratio")
    assert ratio["note"].startswith("noisy: other processes used"), ratio
