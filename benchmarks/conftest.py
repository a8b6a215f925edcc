"""Benchmarks (outside the default test run): `pytest benchmarks/ -s`.

Each goal is a ratio against a baseline measured in the same run, interleaved, median of
torch.utils.benchmark's blocked autorange; the closing summary prints every ratio, its goal and
by how much a missed goal is missed."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from posbench.kernels.cpu import configure_cpu, cpu_model, keep_freed_memory, last_level_cache_mib
from posbench.experiment.timing import guarded, interleaved_times

THREADS = int(os.environ.get("POSBENCH_BENCH_THREADS", "2"))
configure_cpu(THREADS)
keep_freed_memory()  # as in the posbench command's own processes


@dataclass
class Goal:
    name: str
    ratio: float
    limit: float
    higher_is_better: bool = False

    @property
    def met(self) -> bool:
        return self.ratio >= self.limit if self.higher_is_better else self.ratio <= self.limit

    def line(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        verdict = "met" if self.met else f"MISSED by {abs(self.ratio / self.limit - 1):.0%}"
        return f"{self.name:58s} {self.ratio:8.2f}x  goal {sign} {self.limit:g}x  {verdict}"


GOALS: list[Goal] = []
NOTES: list[str] = []


@pytest.fixture
def record_goal():
    """Record a measured ratio against its goal for the closing summary."""

    def record(name: str, ratio: float, limit: float, higher_is_better: bool = False) -> Goal:
        goal = Goal(name, ratio, limit, higher_is_better)
        GOALS.append(goal)
        return goal

    return record


ROUNDS = 3  # the fastest round of each side counts: on a shared machine interference only adds time


@pytest.fixture
def interleaved_ratio():
    """ratio(run, baseline_run, config): median latency of run over baseline_run, timed
    alternately (baseline, run, baseline, run, ...) over ROUNDS rounds of config.min_run_time."""

    def ratio(run, baseline_run, config) -> float:
        guard = guarded(
            lambda: interleaved_times(
                {"base": baseline_run, "run": run},
                config.threads,
                config.min_run_time * ROUNDS,
                rounds=ROUNDS,
            )
        )
        if guard.contended:
            NOTES.append(f"NOISY: {guard.note()}; treat that ratio as unreliable")
        return guard.value["run"][0] / guard.value["base"][0]

    return ratio


@pytest.fixture
def note():
    return NOTES.append


def pytest_terminal_summary(terminalreporter) -> None:
    if not GOALS and not NOTES:
        return
    terminalreporter.section(f"posbench goals (medians, {THREADS} threads, float32)")
    cache, kernels = last_level_cache_mib(), torch.backends.cpu.get_cpu_capability()
    terminalreporter.write_line(  # ratios differ between CPUs: each run says which it ran on
        f"CPU: {cpu_model() or 'unknown model'}, torch's kernels {kernels}, last-level cache "
        f"{'unknown' if cache is None else f'{cache:g} MiB'}"
    )
    for goal in GOALS:
        terminalreporter.write_line(goal.line())
    for line in NOTES:
        terminalreporter.write_line(line)
