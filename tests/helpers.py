"""Tiny sweeps that train in a second, for tests."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pytest
import torch

from typer.testing import CliRunner, Result

import posbench
from posbench.cli import app

from posbench.experiment.profiling import BenchConfig
from posbench.experiment.config import (
    EncodingSpec,
    EvalConfig,
    ModelSize,
    SweepConfig,
    TaskSpec,
    TrainConfig,
)


def tiny_sweep(*encodings: str, steps: int = 3, seeds: tuple[int, ...] = (0,)) -> SweepConfig:
    return SweepConfig(
        tasks=(TaskSpec("copy", {"train_lengths": [1, 3], "eval_lengths": [2, 3, 6]}),),
        encodings=tuple(EncodingSpec(e) for e in (encodings or ("nope", "rope"))),
        seeds=seeds,
        model=ModelSize(d_model=16, n_layers=1, n_heads=2),
        train=TrainConfig(steps=steps, batch_size=4, warmup_steps=1),
        eval=EvalConfig(n_samples=8, batch_size=8),
        profile=False,
    )


TINY_TOML = """
tasks = [{ name = "copy", train_lengths = [1, 3], eval_lengths = [2, 3, 6] }]
encodings = ["nope", { name = "t5", num_buckets = 8, max_distance = 16 }]
seeds = [0]
profile = false

[model]
d_model = 16
n_layers = 1
n_heads = 2

[train]
steps = 3
batch_size = 4
warmup_steps = 1

[eval]
n_samples = 8
batch_size = 8
"""


def tidy(rows: list[dict]) -> pd.DataFrame:
    """Result rows as the report receives them: every column of results.csv, NaN where a row
    gives none."""
    from posbench.store import COLUMNS

    return pd.DataFrame(rows).reindex(columns=COLUMNS)


#: A latency and memory profile that takes a second.
TINY_BENCH = BenchConfig(
    seq_lens=(16, 32),
    mem_lens=(0, 8),
    window_lens=(16,),
    window=4,
    batch_size=2,
    n_heads=2,
    d_head=8,
    threads=1,
    min_run_time=0.001,
)


def small_model(encoding: str = "rope", vocab: int = 11) -> "posbench.Decoder":
    """A 2-layer decoder with fixed initial weights."""
    torch.manual_seed(0)
    return posbench.build_model(encoding, vocab_size=vocab, d_model=32, n_layers=2, n_heads=4)


def logits_and_gradients(
    encoding: str, **options: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A tiny model's logits at L = 160 (long enough for the flash and C++ kernels) and its
    parameters' gradients, to compare attention paths."""
    from posbench.testing import tiny_model

    options = {"max_positions": 256, **options} if encoding == "learned" else options
    tokens = torch.randint(0, 8, (2, 160), generator=torch.Generator().manual_seed(0))
    model = tiny_model(encoding, **options)
    logits = model(tokens)
    logits.logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


def invoke(*args: str) -> Result:
    """Run the command line in this process, exceptions propagating."""
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def one_sentence_error(result: Result, *fragments: str) -> str:
    """Assert exit 2 with one error line containing every fragment; return that line."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    text = " ".join(line.strip() for line in result.output.strip().splitlines())
    assert text.count("error: ") == 1, text
    text = text[
        text.index("error: ") :
    ]  # progress lines may come first; the error closes the output
    for fragment in fragments:
        assert fragment in text, text
    return text


def write_config(tmp_path: Path, toml: str = TINY_TOML) -> Path:
    """A sweep TOML file in tmp_path."""
    config = tmp_path / "sweep.toml"
    config.write_text(toml)
    return config


def fail_fsync_for(monkeypatch: pytest.MonkeyPatch, name: str, code: int) -> None:
    """Make writing any file called `name` fail with `code` (ENOSPC: a full disk)."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(f".{name}."):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


#: An encoding name that is markup: reports must show it, never run it.
EVIL = "<script>alert(1)</script>"


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


#: A browser test runs where Debian's chromium is installed, and always in CI (which installs it).
needs_chromium = pytest.mark.skipif(
    _chromium() is None and not os.environ.get("CI"), reason="Debian's chromium is not installed"
)


@contextmanager
def headless_chromium(width: int = 1280, height: int = 2400) -> Iterator[Any]:
    """A Selenium driver of headless chromium that reaches no network, closed afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _chromium() or "chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--proxy-server=http://127.0.0.1:9",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--window-size={width},{height}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "chromedriver"), options=options
    )
    try:
        yield driver
    finally:
        driver.quit()


def open_page(driver: Any, page: Path, seconds: float = 60.0) -> None:
    """Open a local page and wait until it has loaded: on a slow, busy machine chromium can hand
    back control while a large report is still parsing."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page.resolve().as_uri())
    WebDriverWait(driver, seconds).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def assert_close_to_scale(
    actual: torch.Tensor, expected: torch.Tensor, atol: float, name: str = ""
) -> None:
    """`actual` equals `expected` within `atol` times the largest magnitude compared (at least
    1): rounding error grows with the values, and x86 CPUs (AVX2 or AVX-512, Intel or AMD) sum
    float32 in different orders, so a bound fit for values near 1 fails on gradients near 14.
    A failure names the magnitude and the tolerance it scaled to."""
    magnitude = float(expected.detach().abs().max()) if expected.numel() else 0.0
    tolerance = atol * max(1.0, magnitude)

    def message(detail: str) -> str:
        return f"{name}: values up to {magnitude:.3g}, tolerance {tolerance:.3g}. {detail}"

    torch.testing.assert_close(actual, expected, atol=tolerance, rtol=0, msg=message)


def segments_dense(bias: "posbench.SegmentBias") -> torch.Tensor:
    """A SegmentBias read as its layout says, (H, L, L), at keys j <= i (0 after the query):
    bias[h, i, j] = f[p_i - p_j] * a[h, i, s] + b[h, i, s] for the segment s whose keys
    start[i, s] .. start[i, s + 1] - 1 hold j. What the C++ kernel forms row by row."""
    L = bias.start.shape[0]
    keys = torch.arange(L)
    segment = torch.searchsorted(bias.start, keys.expand(L, L).contiguous(), right=True) - 1
    H = bias.a.shape[0]
    index = segment.expand(H, L, L)
    p = keys if bias.positions is None else bias.positions
    distance = (p[:, None] - p[None, :]).clamp(min=0)  # (L, L)
    values = bias.f[distance] * bias.a.gather(2, index) + bias.b.gather(2, index)
    return values * torch.ones(L, L, dtype=values.dtype).tril()
