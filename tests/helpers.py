"""Tiny sweeps that train in a second, for tests."""

from __future__ import annotations

import pandas as pd

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
