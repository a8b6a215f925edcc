"""The training loop and evaluation on a few steps."""
from __future__ import annotations

import math

import pytest
import torch

import posbench
from posbench.config import EvalConfig, TrainConfig
from posbench.evaluation import evaluate, mem_lens
from posbench.training import Diverged, learning_rate, train


def small_model(encoding: str = "rope", vocab: int = 11):
    torch.manual_seed(0)
    return posbench.build_model(encoding, vocab_size=vocab, d_model=32, n_layers=2, n_heads=4)


def test_schedule_warms_up_then_decays_to_zero() -> None:
    config = TrainConfig(steps=100, lr=1.0, warmup_steps=10)
    assert learning_rate(0, config) == pytest.approx(0.1)
    assert learning_rate(9, config) == pytest.approx(1.0)
    assert learning_rate(55, config) == pytest.approx(0.5, abs=0.02)
    assert learning_rate(99, config) < 0.01


def test_training_reduces_loss_and_is_reproducible() -> None:
    task = posbench.create_task("copy", train_lengths=[1, 4])
    config = TrainConfig(steps=60, batch_size=16, lr=3e-3, warmup_steps=5)
    first = train(small_model(vocab=task.vocab_size), task, config, seed=0)
    again = train(small_model(vocab=task.vocab_size), task, config, seed=0)
    assert first.losses == again.losses
    assert first.losses[-1][1] < first.losses[0][1]


@pytest.mark.parametrize("encoding", ["txl", "rope", "sinusoidal"])
def test_recurrent_training_through_the_cache(encoding: str) -> None:
    task = posbench.create_task("copy", train_lengths=[3, 6])
    config = TrainConfig(steps=4, batch_size=4, warmup_steps=1, train_mem_len=4)
    result = train(small_model(encoding, task.vocab_size), task, config, seed=0)
    assert math.isfinite(result.final_loss)


def test_divergence_is_detected() -> None:
    task = posbench.create_task("copy")
    model = small_model(vocab=task.vocab_size)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    with pytest.raises(Diverged, match="step 0"):
        train(model, task, TrainConfig(steps=3, batch_size=2, warmup_steps=1), seed=0)


def test_evaluation_rows_and_not_applicable_lengths() -> None:
    task = posbench.create_task("copy", train_lengths=[1, 4], eval_lengths=[2, 4, 8])
    torch.manual_seed(0)
    model = posbench.build_model("learned", vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                 encoding_options={"max_positions": 8})
    config = EvalConfig(n_samples=8, batch_size=4, segment_len=4)
    rows = evaluate(model, task, config)
    full = {(r.eval_len, r.metric): r for r in rows if r.mem_len is None}
    assert 0.0 <= full[(4, "exact_match")].value <= 1.0
    assert full[(4, "token_accuracy")].value >= full[(4, "exact_match")].value
    na = full[(8, "exact_match")]  # 16 tokens > 8 positions
    assert math.isnan(na.value) and "0..7" in na.note
    assert mem_lens(task, config) == [0, 2, 4, 8, None]
    cached = {(r.eval_len, r.mem_len) for r in rows if r.mem_len is not None and r.metric == "exact_match"}
    assert cached == {(e, m) for e in (2, 4, 8) for m in (0, 2, 4, 8, math.inf)}


def test_unbounded_cache_equals_full_context() -> None:
    task = posbench.create_task("copy", train_lengths=[1, 4], eval_lengths=[5])
    model = small_model("t5", task.vocab_size)
    rows = evaluate(model, task, EvalConfig(n_samples=16, batch_size=16, segment_len=3))
    value = {(r.mem_len, r.metric): r.value for r in rows}
    assert value[(math.inf, "loss")] == pytest.approx(value[(None, "loss")], rel=1e-5)
