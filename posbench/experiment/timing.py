"""Latency timing that knows when it is noisy.

Timings use torch.utils.benchmark (warm-up, blocked autorange; median and IQR) with a fixed
thread count. Runs to compare alternate over rounds (the fastest round's median counts: on a
shared machine interference only adds time). Around each measurement the guard reads how much
CPU time *other* processes used (all CPUs' busy time in /proc/stat minus this process's own,
children included), repeats the measurement while that exceeds CONTENTION_LIMIT cores, and
reports what stayed noisy, so a busy machine's numbers are marked rather than printed as
findings."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Hashable, TypeVar

#: A measurement is repeated while other processes used more than this many cores during it.
CONTENTION_LIMIT = 0.3
#: How many times a contended measurement is tried in all.
NOISE_TRIES = 3
#: A timing whose IQR exceeds this fraction of its median is marked noisy too.
IQR_LIMIT = 0.25
T = TypeVar("T")


def time_ms(fn: Callable[[], Any], threads: int, min_run_time: float) -> tuple[float, float]:
    """Median and IQR of `fn` in milliseconds (blocked autorange on `threads` threads)."""
    from torch.utils import benchmark  # imported here: it imports the C++ extension builder

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads)
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return measurement.median * 1e3, measurement.iqr * 1e3


def interleaved_times(
    runs: dict[Hashable, Callable[[], Any]], threads: int, min_run_time: float, rounds: int = 2
) -> dict[Hashable, tuple[float, float]]:
    """Median and IQR in ms of each run, timed in turn over `rounds` rounds that share
    min_run_time; the fastest round's median counts."""
    times: dict[Hashable, tuple[float, float]] = {}
    for _ in range(rounds):
        for key, run in runs.items():
            measured = time_ms(run, threads, min_run_time / rounds)
            times[key] = min(times.get(key, measured), measured)
    return times


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU ticks: busy on all CPUs, elapsed on all CPUs, and this process's own."""

    busy: int
    total: int
    own: int
    cpus: int


def cpu_sample() -> CpuSample | None:
    """Read /proc/stat and /proc/self/stat now; None where they do not exist (not Linux)."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
        with open("/proc/self/stat") as own:
            fields = own.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = [
        int(v) for v in lines[0].split()[1:9]
    ]  # user nice system idle iowait irq softirq steal
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    own = sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return CpuSample(
        busy=sum(ticks) - ticks[3] - ticks[4], total=sum(ticks), own=own, cpus=max(cpus, 1)
    )


def foreign_cores(before: CpuSample, after: CpuSample) -> float:
    """Mean number of cores other processes kept busy between two samples."""
    elapsed_per_cpu = (after.total - before.total) / before.cpus
    if elapsed_per_cpu <= 0:
        return 0.0
    foreign = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, foreign / elapsed_per_cpu)


@dataclass
class Guarded:
    """A measurement's value with how contended its last try was (None: not measurable here)."""

    value: Any
    contention: float | None
    tries: int

    @property
    def contended(self) -> bool:
        return self.contention is not None and self.contention > CONTENTION_LIMIT

    def note(self) -> str:
        """The row note for a contended measurement ("" when it was quiet)."""
        if not self.contended:
            return ""
        return (
            f"noisy: other processes used {self.contention:.1f} cores during this timing "
            f"({self.tries} tries)"
        )


def guarded(
    measure: Callable[[], T],
    tries: int | None = None,
    sample: Callable[[], CpuSample | None] = cpu_sample,
) -> Guarded:
    """Run `measure`, repeating it (up to `tries` times in all, NOISE_TRIES unless given) while
    other processes used more than CONTENTION_LIMIT cores during it; keeps the least contended
    try."""
    tries = NOISE_TRIES if tries is None else tries
    best: Guarded | None = None
    for attempt in range(1, tries + 1):
        before = sample()
        value = measure()
        after = sample()
        contention = foreign_cores(before, after) if before and after else None
        if best is None or (
            contention is not None and best.contention is not None and contention < best.contention
        ):
            best = Guarded(value, contention, attempt)
        best.tries = attempt
        if not best.contended:
            break
        time.sleep(0.05 * attempt)  # give a passing burst of load a moment to end
    assert best is not None
    return best


def noise_note(guard: Guarded, *timings: tuple[float, float]) -> str:
    """Why a timing (or a ratio of several, each (median, IQR)) is not to be trusted, or ""."""
    notes = [guard.note()] if guard.contended else []
    spread = max((iqr / median for median, iqr in timings if median > 0), default=0.0)
    if spread > IQR_LIMIT:
        notes.append(f"noisy: IQR {spread:.0%} of the median")
    return "; ".join(notes)


def describe_method() -> str:
    """How noise was controlled, for reports."""
    return (
        "Medians of torch.utils.benchmark's blocked autorange on a fixed thread count; each "
        "encoding "
        "alternates with the baseline over rounds and the fastest round counts. Around each "
        "measurement the "
        "CPU time of other processes is read from /proc/stat (minus this process's own); a "
        "measurement during "
        f"which they used more than {CONTENTION_LIMIT} cores is repeated up to {NOISE_TRIES} "
        "times, and one that "
        f"stays contended, or whose IQR exceeds {IQR_LIMIT:.0%} of its median, is marked noisy "
        "(cpu count "
        f"{os.cpu_count()})."
    )
