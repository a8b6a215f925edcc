"""Evaluation: its rows, lengths an encoding cannot represent, caches against full context, and
the early-stopping signal."""

from __future__ import annotations

import math

import pytest
import torch

import posbench
from posbench.experiment.config import EvalConfig, TrainConfig
from posbench.experiment.evaluation import evaluate, mem_lens
from posbench.experiment.training import train

from helpers import small_model


def test_evaluation_rows_and_not_applicable_lengths() -> None:
    task = posbench.create_task("copy", train_lengths=[1, 4], eval_lengths=[2, 4, 8])
    torch.manual_seed(0)
    model = posbench.build_model(
        "learned",
        vocab_size=task.vocab_size,
        d_model=16,
        n_layers=1,
        n_heads=2,
        encoding_options={"max_positions": 8},
    )
    config = EvalConfig(n_samples=8, batch_size=4, segment_len=4)
    rows = evaluate(model, task, config)
    full = {(r.eval_len, r.metric): r for r in rows if r.mem_len is None}
    assert 0.0 <= full[(4, "exact_match")].value <= 1.0
    assert full[(4, "token_accuracy")].value >= full[(4, "exact_match")].value
    na = full[(8, "exact_match")]  # 16 tokens > 8 positions
    assert math.isnan(na.value) and "0..7" in na.note
    assert mem_lens(task, config) == [0, 2, 4, 8, math.inf]
    cached = {
        (r.eval_len, r.mem_len) for r in rows if r.mem_len is not None and r.metric == "exact_match"
    }
    assert cached == {(e, m) for e in (2, 4, 8) for m in (0, 2, 4, 8, math.inf)}
    only = EvalConfig(n_samples=8, batch_size=4, segment_len=4, cache_eval_lengths=(4,))
    assert {r.eval_len for r in evaluate(model, task, only) if r.mem_len is not None} == {4}
    none = EvalConfig(n_samples=8, batch_size=4, segment_len=4, cache_eval_lengths=())
    assert not [r for r in evaluate(model, task, none) if r.mem_len is not None]  # none, not all


def test_unbounded_cache_equals_full_context() -> None:
    task = posbench.create_task("copy", train_lengths=[1, 4], eval_lengths=[5])
    model = small_model("t5", task.vocab_size)
    rows = evaluate(model, task, EvalConfig(n_samples=16, batch_size=16, segment_len=3))
    value = {(r.mem_len, r.metric): r.value for r in rows}
    assert value[(math.inf, "loss")] == pytest.approx(value[(None, "loss")], rel=1e-5)


def test_early_stopping_reads_the_reported_lengths_and_needs_a_margin() -> None:
    """The stop signal covers the lengths reports call in distribution and stops on its 95%
    lower bound, so a run that stopped meets the threshold on the evaluation sample too."""
    from posbench.experiment.config import EvalConfig
    from posbench.experiment.evaluation import in_distribution_lengths, validation_exact_match
    from posbench.model import build_model
    from posbench.tasks import create_task

    task = create_task("copy", train_lengths=[1, 8], eval_lengths=[2, 4, 6, 8, 12, 16])
    assert in_distribution_lengths(task) == [2, 4, 6, 8]
    assert in_distribution_lengths(
        create_task("copy", train_lengths=[1, 8], eval_lengths=[16])
    ) == [1, 4, 8]
    model = build_model("nope", task.vocab_size, 16, 1, 2)
    train(model, task, TrainConfig(steps=150, batch_size=16, warmup_steps=10), 0)
    mean, lower = validation_exact_match(model, task, EvalConfig(n_samples=64, batch_size=64))
    assert lower <= mean <= 1
    if 0 < mean < 1:
        assert mean - lower == pytest.approx(1.645 * math.sqrt(mean * (1 - mean) / (64 * 4)))
