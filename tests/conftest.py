"""Shared test setup: run from the repository root so its plugin folders load."""

from __future__ import annotations

import os
from pathlib import Path

import dataclasses
import textwrap

import pytest
import torch

from posbench.experiment.runner import run_sweep
from posbench.plugins import load_plugin_dir, load_plugins

from helpers import EVIL, TINY_BENCH, tiny_sweep

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)
torch.set_num_threads(1)
load_plugins()  # the repository's plugin folders (pyproject.toml), before tests are collected


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _time_once(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each timing is taken once: the other test worker always keeps a core busy, so every
    timing would otherwise be retried as contended. Tests of the retry itself (test_timing)
    and of published reports, which describe it (test_rebuild), keep it; the others read
    which rows a profile writes, not how fast it ran."""
    if request.module.__name__ not in ("test_timing", "test_rebuild"):
        monkeypatch.setattr("posbench.experiment.timing.NOISE_TRIES", 1)


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-seed sweep of nope, t5, alibi and an encoding whose name is markup, with
    its latency/memory profiles and two stated differences (one of them markup): what the
    report and the terminal read."""
    plugins = tmp_path_factory.mktemp("plugins")
    (plugins / "evil.py").write_text(
        textwrap.dedent(
            f'''
            from posbench import PositionalEncoding, register_encoding

            @register_encoding({EVIL!r})
            class Evil(PositionalEncoding):
                """An encoding whose name is markup."""
            '''
        )
    )
    load_plugin_dir(plugins)
    out = tmp_path_factory.mktemp("sweep")
    sweep = dataclasses.replace(
        tiny_sweep("nope", "t5", "alibi", EVIL, seeds=(0, 1)),
        profile=True,
        differences=("Size: <b>tiny</b>; theirs is large.", "Seeds: two."),
    )
    with pytest.MonkeyPatch.context() as patch:  # a session fixture: _time_once is not in force
        patch.setattr("posbench.experiment.profiling.SMALL_PROFILE", TINY_BENCH)
        patch.setattr("posbench.experiment.timing.NOISE_TRIES", 1)
        run_sweep(sweep, out)
    return out
