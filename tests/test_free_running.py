"""Free-running (greedy) metrics: the model reads its own answers, so a first mistake counts
for what follows; they sit beside the teacher-forced ones and each length's chance level."""

from __future__ import annotations

import pytest
import torch

from posbench.experiment.config import EvalConfig, TrainConfig
from posbench.experiment.evaluation import (
    chance_hits,
    correct_prefix,
    evaluate,
    greedy_predictions,
    held_out,
    NOT_FED_BACK,
)
from posbench.experiment.training import train
from posbench.model import build_model
from posbench.tasks import create_task
from posbench.tasks.base import IGNORE

TASK = create_task("copy", train_lengths=[1, 4], eval_lengths=[2, 4, 8])


def _trained(encoding: str):
    torch.manual_seed(0)
    model = build_model(encoding, TASK.vocab_size, 32, 2, 4)
    train(model, TASK, TrainConfig(steps=120, batch_size=32, warmup_steps=10), 0)
    return model.eval()


def test_correct_prefix_counts_answer_tokens_before_the_first_mistake() -> None:
    answer = torch.tensor([[False, True, True, True, True]] * 3)
    hit = torch.tensor(
        [
            [False, True, True, True, True],
            [True, True, False, True, True],
            [False, False, True, True, True],
        ]
    )
    assert correct_prefix(hit, answer).tolist() == [4, 1, 0]


@pytest.mark.parametrize("encoding", ["rope", "t5", "learned"])
def test_greedy_decoding_through_the_cache_equals_recomputing_the_prefix(encoding: str) -> None:
    model = _trained(encoding)
    batch = next(held_out(TASK, 8, EvalConfig(n_samples=32, batch_size=32)))
    answer = batch.targets != IGNORE
    cached = greedy_predictions(model, batch.tokens, answer)
    model.encoding.cache_consistent = False  # the instance only: take the recomputing path
    assert torch.equal(cached, greedy_predictions(model, batch.tokens, answer))


def test_greedy_exact_match_equals_teacher_forced_exact_match_and_its_tokens_never_exceed() -> None:
    model = _trained("rope")
    batch = next(held_out(TASK, 8, EvalConfig(n_samples=64, batch_size=64)))
    answer = batch.targets != IGNORE
    with torch.no_grad():
        forced = (model(batch.tokens).argmax(-1) == batch.targets) & answer
    free = (greedy_predictions(model, batch.tokens, answer) == batch.targets) & answer
    assert torch.equal((forced | ~answer).all(1), (free | ~answer).all(1))
    assert torch.equal(
        correct_prefix(forced, answer), correct_prefix(free, answer)
    )  # same up to the first mistake


def test_evaluation_stores_greedy_accuracy_prefix_and_chance() -> None:
    rows = {
        (m.eval_len, m.metric): m.value
        for m in evaluate(_trained("nope"), TASK, EvalConfig(n_samples=64, batch_size=64))
        if m.mem_len is None
    }
    for length in TASK.eval_lengths:
        assert 0 <= rows[(length, "greedy_token_accuracy")] <= 1
        assert 0 <= rows[(length, "correct_prefix")] <= length
        assert (
            0.03 <= rows[(length, "chance_token_accuracy")] <= 0.17
        )  # 10 uniform symbols: 0.1, 64 samples per position
    lm = create_task("lm", train_lengths=[16, 16], eval_lengths=[16])
    model = build_model("nope", lm.vocab_size, 16, 1, 2)
    metrics = {m.metric for m in evaluate(model, lm, EvalConfig(n_samples=8, batch_size=8))}
    assert "greedy_token_accuracy" not in metrics and {"loss_floor", "excess_loss"} <= metrics


def test_free_running_lookback_reads_the_true_stream_so_it_equals_teacher_forcing() -> None:
    """Lookback's answer at t is the token 12 back, not the input at t + 1: writing the model's
    answers into the stream would corrupt it (a perfect model then scored 0.57 / 0.32 / 0.19
    free running at 24 / 48 / 96). Free running equals teacher forcing there, and says so."""
    task = create_task("lookback", lag=3, n_symbols=6, train_lengths=[1, 4], eval_lengths=[4, 8])
    torch.manual_seed(0)
    model = build_model("rope", task.vocab_size, 32, 2, 4)
    train(model, task, TrainConfig(steps=60, batch_size=32, warmup_steps=5), 0)
    rows = {
        (m.eval_len, m.metric): m
        for m in evaluate(model.eval(), task, EvalConfig(n_samples=64, batch_size=64))
        if m.mem_len is None
    }
    for length in task.eval_lengths:
        greedy = rows[(length, "greedy_token_accuracy")]
        assert greedy.value == rows[(length, "token_accuracy")].value, length
        assert greedy.note == NOT_FED_BACK and rows[(length, "correct_prefix")].note == NOT_FED_BACK
        assert rows[(length, "token_accuracy")].note == ""


def test_accuracy_by_answer_position_is_stored_per_run(tmp_path) -> None:
    import pandas as pd

    from posbench.store import ANSWER_POSITIONS_FILE
    from posbench.experiment.runner import run_sweep

    from helpers import tiny_sweep

    run_sweep(tiny_sweep("rope"), tmp_path / "sweep")
    folder = next(p for p in (tmp_path / "sweep").iterdir() if (p / ANSWER_POSITIONS_FILE).exists())
    table = pd.read_csv(folder / ANSWER_POSITIONS_FILE)
    assert sorted(table["eval_len"].unique()) == [2, 3, 6]
    at_6 = table[table["eval_len"] == 6]
    assert at_6["answer_position"].tolist() == list(range(6)) and (at_6["answers"] == 8).all()
    assert (
        at_6["greedy_token_accuracy"].between(0, 1).all()
        and at_6["token_accuracy"].between(0, 1).all()
    )
    assert (
        at_6["greedy_token_accuracy"].iloc[0] == at_6["token_accuracy"].iloc[0]
    )  # the first answer token reads no answer


def test_chance_is_an_independent_samples_majority_scored_on_the_evaluation_sample() -> None:
    """Copy's answers are uniform over 10 symbols: a constant answer is right 10% of the time;
    scoring a sample's own majority on itself would say about 0.15 at 128 samples."""
    config = EvalConfig(n_samples=128, batch_size=128)
    task = create_task("copy", train_lengths=[1, 4], eval_lengths=[16])
    rates = []
    for length in (8, 16, 24, 32):
        batch = next(held_out(task, length, config))
        answer = batch.targets != IGNORE
        columns = answer.any(dim=0).nonzero().flatten().tolist()
        answers = {c: batch.targets[answer[:, c], c] for c in columns}
        rates.append(chance_hits(task, length, config, answers) / int(answer.sum()))
        own = sum(int(torch.bincount(t).max()) for t in answers.values()) / int(answer.sum())
        assert own > 0.13
    assert sum(rates) / len(rates) == pytest.approx(0.1, abs=0.015)
    assert chance_hits(task, 8, config, {}) == 0
