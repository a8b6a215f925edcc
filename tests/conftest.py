"""Shared test setup: run from the repository root so its plugin folders load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from posbench.plugins import load_plugins

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)
torch.set_num_threads(1)
load_plugins()  # the repository's plugin folders (pyproject.toml), before tests are collected


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
