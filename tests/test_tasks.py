"""Every registered task's generator: shapes, vocabulary, loss mask, seeds; and each built-in
task's answers checked by construction."""
from __future__ import annotations

import pytest
import torch

import posbench
from posbench.errors import OptionError
from posbench.tasks.base import IGNORE, Task

TASKS = posbench.list_tasks()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("length", [1, 3, 9])
def test_batch_shapes_vocab_and_mask(name: str, length: int) -> None:
    task = posbench.create_task(name)
    if length < task.min_length:
        pytest.skip("below the task's minimum length")
    batch = task.batch(length, 5, gen(0))
    assert batch.tokens.shape == (5, task.sequence_length(length))
    assert batch.targets.shape == batch.tokens.shape
    assert 0 <= int(batch.tokens.min()) and int(batch.tokens.max()) < task.vocab_size
    scored = batch.targets[batch.targets != IGNORE]
    assert 0 <= int(scored.min()) and int(scored.max()) < task.vocab_size
    assert (batch.targets != IGNORE).sum(dim=1).min() >= 1
    if type(task).generate is not Task.generate:  # a next-token task: batch is generate shifted
        seq, answer = task.generate(length, 5, gen(0))
        assert torch.equal(batch.tokens, seq[:, :-1])
        # the loss mask is exactly the answer mask shifted by one, and targets are next tokens
        assert torch.equal(batch.targets != IGNORE, answer[:, 1:])
        assert torch.equal(batch.targets[answer[:, 1:]], seq[:, 1:][answer[:, 1:]])


@pytest.mark.parametrize("name", TASKS)
def test_seeds_reproducible_and_distinct(name: str) -> None:
    task = posbench.create_task(name)
    a, b, c = task.batch(6, 8, gen(1)), task.batch(6, 8, gen(1)), task.batch(6, 8, gen(2))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.tokens, c.tokens)


@pytest.mark.parametrize("name", TASKS)
def test_default_eval_lengths_reach_four_times_training(name: str) -> None:
    task = posbench.create_task(name)
    assert max(task.eval_lengths) >= 4 * task.train_lengths[1]
    assert any(e <= task.train_lengths[1] for e in task.eval_lengths)


@pytest.mark.parametrize("name", TASKS)
def test_lengths_can_be_overridden_and_are_checked(name: str) -> None:
    task = posbench.create_task(name, train_lengths=[2, 3], eval_lengths=[12, 6])
    assert task.train_lengths == (2, 3) and task.eval_lengths == (6, 12)
    with pytest.raises(OptionError, match="train_lengths"):
        posbench.create_task(name, train_lengths=[0, 3])
    with pytest.raises(OptionError, match="train_lengths"):
        posbench.create_task(name, train_lengths=[5, 3])
    with pytest.raises(OptionError, match="eval_lengths"):
        posbench.create_task(name, eval_lengths=[])


def test_copy_and_reverse_answers() -> None:
    for name, expect in (("copy", lambda s: s), ("reverse", lambda s: s.flip(1))):
        task = posbench.create_task(name)
        seq, answer = task.generate(5, 4, gen(3))
        assert (seq[:, 5] == task.sep).all()
        assert torch.equal(seq[:, 6:], expect(seq[:, :5]))
        assert answer[:, 6:].all() and not answer[:, :6].any()


def test_mqar_answers_are_the_paired_values() -> None:
    task = posbench.create_task("mqar")
    n = 6
    seq, answer = task.generate(n, 4, gen(4))
    for row in range(4):
        pairs = {int(seq[row, 2 * i]): int(seq[row, 2 * i + 1]) for i in range(n)}
        assert len(pairs) == n  # keys distinct
        assert all(k < task.n_keys <= v for k, v in pairs.items())
        for q in range(n):
            key, value = int(seq[row, 2 * n + 2 * q]), int(seq[row, 2 * n + 2 * q + 1])
            assert pairs[key] == value and bool(answer[row, 2 * n + 2 * q + 1])
        assert answer[row].sum() == n


def test_passkey_distance_and_answer() -> None:
    task = posbench.create_task("passkey", digits=3)
    length = 20
    seq, answer = task.generate(length, 4, gen(5))
    key_at = (seq == task.key_token).int().argmax(dim=1)
    ask_at = (seq == task.ask_token).int().argmax(dim=1)
    assert ((ask_at - key_at - 1 - 3) == length).all()  # `length` fillers between key and question
    for row in range(4):
        k, a = int(key_at[row]), int(ask_at[row])
        assert torch.equal(seq[row, k + 1 : k + 4], seq[row, a + 1 : a + 4])
        assert answer[row, a + 1 :].all() and answer[row].sum() == 3


def test_sort_plugin_answers() -> None:
    task = posbench.create_task("sort")
    seq, _ = task.generate(7, 3, gen(6))
    assert torch.equal(seq[:, 8:], seq[:, :7].sort(dim=1).values)


def test_lookback_targets_are_the_tokens_lag_back() -> None:
    task = posbench.create_task("lookback", lag=5, n_symbols=7)
    batch = task.batch(9, 4, gen(7))
    assert batch.tokens.shape == (4, 14)
    assert (batch.targets[:, :5] == IGNORE).all()
    assert torch.equal(batch.targets[:, 5:], batch.tokens[:, :9])
    assert task.vocab_size == 7 and int(batch.tokens.max()) < 7


def test_a_task_without_generate_or_batch_says_so() -> None:
    class Empty(Task):
        name = "empty"
        vocab_size = 2

        def sequence_length(self, length: int) -> int:
            return length

    with pytest.raises(NotImplementedError, match="neither generate"):
        Empty().batch(3, 2, gen(0))
