"""Every registered task's generator: shapes, vocabulary, loss mask, seeds; and each built-in
task's answers checked by construction."""

from __future__ import annotations

import pytest
import torch

import posbench
from posbench.errors import OptionError
from posbench.tasks.base import IGNORE, Task
from posbench.tasks.copy import Copy
from posbench.testing import check_answers_fed_back, check_loss_floors, run_task_conformance

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
def test_every_task_passes_the_task_conformance_kit(name: str) -> None:
    run_task_conformance(name)


def test_only_lookback_of_the_built_in_causal_tasks_does_not_feed_its_answers_back() -> None:
    """Every other built-in task's answer at t is the input at t + 1 (the kit checks each
    declaration against its batches); lookback's is the token `lag` back."""
    builtin = [n for n in TASKS if type(posbench.create_task(n)).__module__.startswith("posbench")]
    assert [n for n in builtin if not posbench.create_task(n).answers_fed_back] == ["lookback"]


def test_the_kit_catches_a_wrong_answers_fed_back_declaration(monkeypatch) -> None:
    from posbench.tasks.lookback import Lookback

    monkeypatch.setattr(Lookback, "answers_fed_back", True)
    with pytest.raises(AssertionError, match="set answers_fed_back = False"):
        check_answers_fed_back("lookback")
    monkeypatch.setattr(Copy, "answers_fed_back", False)
    with pytest.raises(AssertionError, match="set answers_fed_back = True"):
        check_answers_fed_back("copy")


def test_the_kit_catches_floors_that_differ_between_the_two_calls(monkeypatch) -> None:
    """A task that overrides loss_floors to compute its floors together must give loss_floor's."""
    from posbench.tasks.lm import LanguageModel

    def shifted(self: LanguageModel, lengths: list[int]) -> dict[int, float | None]:
        return {n: self.loss_floor(n) + 0.01 for n in lengths}

    monkeypatch.setattr(LanguageModel, "loss_floors", shifted)
    with pytest.raises(AssertionError, match="must give the same floors from both"):
        check_loss_floors("lm", eval_lengths=[8, 16], train_lengths=[8, 8])

    def dropped(self: LanguageModel, lengths: list[int]) -> dict[int, float | None]:
        return {n: self.loss_floor(n) for n in lengths[1:]}

    monkeypatch.setattr(LanguageModel, "loss_floors", dropped)
    with pytest.raises(AssertionError, match="return one floor per length asked"):
        check_loss_floors("lm", eval_lengths=[8, 16], train_lengths=[8, 8])


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
    low = posbench.tasks.REGISTRY.get(name).min_length + 1
    task = posbench.create_task(
        name, train_lengths=[low, low + 1], eval_lengths=[low + 10, low + 4]
    )
    assert task.train_lengths == (low, low + 1) and task.eval_lengths == (low + 4, low + 10)
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


def test_rotate_plugin_answers() -> None:
    task = posbench.create_task("rotate", shift=2)
    seq, _ = task.generate(7, 3, gen(6))
    assert torch.equal(seq[:, 8:], torch.cat((seq[:, 2:7], seq[:, :2]), dim=1))


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


# ---- DeepMind's length-generalisation suite: each answer checked against an independent oracle
def _question_and_answer(
    task: posbench.Task, length: int, batch_size: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    """(question, scored answer) pairs, the answer read back from the scored positions."""
    seq, answer = task.generate(length, batch_size, gen(seed))
    q_len = task.question_length(length)
    assert (seq[:, q_len] == task.sep).all()
    return [(seq[r, :q_len].tolist(), seq[r][answer[r]].tolist()) for r in range(batch_size)]


def _little_endian(digits: list[int]) -> int:
    return sum(d << i for i, d in enumerate(digits))


def test_regular_tasks_answer_their_definitions() -> None:
    for length in (1, 2, 5, 12):
        for q, a in _question_and_answer(posbench.create_task("even_pairs"), length, 8, length):
            assert a == [
                int(q[0] != q[-1])
            ]  # odd number of unequal pairs <=> first and last differ
        for q, a in _question_and_answer(posbench.create_task("parity_check"), length, 8, length):
            assert a == [q.count(1) % 2]
        for q, a in _question_and_answer(
            posbench.create_task("cycle_navigation"), length, 8, length
        ):
            state = 0
            for action in q:
                state = (state + {0: -1, 1: 0, 2: 1}[action]) % 5
            assert a == [state]


def test_modular_arithmetic_agrees_with_python() -> None:
    task = posbench.create_task("modular_arithmetic")
    for length in (1, 4, 9, 15):
        for q, a in _question_and_answer(task, length, 16, length):
            assert len(q) == (length if length % 2 else length - 1)
            text = "".join(str(t) if t < 5 else "+-*"[t - 5] for t in q)
            assert a == [eval(text) % 5], text  # noqa: S307 (digits and + - * only)


def test_bracketed_expressions_and_equations() -> None:
    task = posbench.create_task("modular_arithmetic_brackets")
    alphabet = "01234+-*()x="
    for length in (1, 2, 3, 4, 7, 20):
        for q, a in _question_and_answer(task, length, 16, length):
            text = "".join(alphabet[t] for t in q)
            assert len(text) == length and a == [eval(text) % 5], text  # noqa: S307
    solve = posbench.create_task("solve_equation")
    for length in (3, 6, 14):
        for q, a in _question_and_answer(solve, length, 16, length):
            left, right = "".join(alphabet[t] for t in q).split("=")
            assert len(left) + 1 + len(right) == length and left.count("x") == 1
            value = lambda x: eval(left.replace("x", str(x)))  # noqa: E731,S307
            solutions = [x for x in range(5) if value(x) % 5 == int(right)]
            assert solutions == a


def test_stack_manipulation_replays_the_actions() -> None:
    task = posbench.create_task("stack_manipulation")
    for length in (1, 2, 6, 13):
        for q, a in _question_and_answer(task, length, 16, length):
            assert a[-1] == task.end and len(a) <= length + 1
            if length == 1:
                assert a[:-1] == q
                continue
            split = next(i for i, t in enumerate(q) if t >= 2) if any(t >= 2 for t in q) else len(q)
            stack = list(q[:split])
            assert 1 <= len(stack) <= length - 1
            for action in q[split:]:
                if action == 2:
                    stack = stack[:-1]
                else:
                    stack.append(action - 3)
            assert a[:-1] == stack[::-1]


def test_string_tasks_answer_their_definitions() -> None:
    cases = {
        "reverse_string": lambda q: q[::-1],
        "duplicate_string": lambda q: q + q,
        "odds_first": lambda q: q[1::2] + q[::2],  # DeepMind's code order
        "bucket_sort": sorted,
    }
    for name, expect in cases.items():
        for length in (1, 6, 11):
            for q, a in _question_and_answer(posbench.create_task(name), length, 8, length):
                assert a == expect(q), name
    for length in (2, 7, 10):
        for q, a in _question_and_answer(
            posbench.create_task("missing_duplicate_string"), length, 16, length
        ):
            body = q[: length - length % 2]
            half = len(body) // 2
            at = body.index(2)
            other = at + half if at < half else at - half
            assert (
                body.count(2) == 1 and a == [body[other]] and q[len(body) :] == [3] * (length % 2)
            )


def test_binary_arithmetic_tasks() -> None:
    for name, combine in (("binary_addition", int.__add__), ("binary_multiplication", int.__mul__)):
        task = posbench.create_task(name)
        for length in (3, 8, 17):
            for q, a in _question_and_answer(task, length, 16, length):
                cut = q.index(2)
                result = combine(_little_endian(q[:cut]), _little_endian(q[cut + 1 :]))
                assert a[-1] == task.end and _little_endian(a[:-1]) == result
                assert a[:-1] == [int(d) for d in f"{result:b}"[::-1]]  # no trailing zeros
    sqrt = posbench.create_task("compute_sqrt")
    for length in (1, 5, 16):
        for q, a in _question_and_answer(sqrt, length, 16, length):
            x = int("".join(map(str, q)), 2)
            assert (
                len(a) == (length + 1) // 2
                and int("".join(map(str, a)), 2) ** 2 <= x < (int("".join(map(str, a)), 2) + 1) ** 2
            )


def test_kazemnejad_copy_variants() -> None:
    single = posbench.create_task("copy_single")
    seq, answer = single.generate(5, 4, gen(8))
    assert (
        (seq[:, :5] == seq[:, :1]).all()
        and torch.equal(seq[:, 6:11], seq[:, :5])
        and (seq[:, 11] == single.end).all()
        and answer[:, 6:].all()
    )
    replace = posbench.create_task("copy_replace")
    seq, answer = replace.generate(5, 64, gen(9))
    source, target = seq[:, :1], seq[:, 1:2]
    assert seq.shape[1] == replace.sequence_length(5) + 1 == 2 + 5 + 1 + 5 + 1  # s t, SEP, END
    assert (seq[:, 2:7] == source).all() and (seq[:, 7] == replace.sep).all()
    assert (seq[:, 8:13] == target).all() and (seq[:, 13] == replace.end).all()
    assert answer[:, 8:].all() and not answer[:, :8].any()
    assert (source != target).all() and int(seq[:, 8:13].max()) < replace.n_symbols
    pairs = set(zip(source.flatten().tolist(), target.flatten().tolist()))
    assert len(pairs) > 30  # every source with many targets, not one fixed map
    twice = posbench.create_task("copy_single_twice")
    seq, answer = twice.generate(4, 3, gen(10))
    assert (
        seq.shape[1] == twice.sequence_length(4) + 1
        and (seq[:, 5:13] == seq[:, :1]).all()
        and answer[:, 5:].all()
    )
    copy_twice = posbench.create_task("copy_twice")
    seq, answer = copy_twice.generate(4, 3, gen(11))
    assert torch.equal(seq[:, 5:9], seq[:, :4]) and (seq[:, 9] == copy_twice.n_symbols + 1).all()
    assert torch.equal(seq[:, 10:14], seq[:, :4]) and answer[:, 5:].all()
    assert not answer[:, :5].any()


COPY_FAMILY = sorted(  # the built-in ones: a plugin's subclass may not take end_token
    name
    for name in posbench.list_tasks()
    if isinstance(task := posbench.create_task(name), Copy)
    and type(task).__module__.startswith("posbench.")
)


@pytest.mark.parametrize("name", COPY_FAMILY)
@pytest.mark.parametrize("end_token", [False, True])
def test_copy_family_end_token_closes_every_answer(name: str, end_token: bool) -> None:
    """With END, every answer ends with the one END of its row, END is scored and is the last id
    in the vocabulary; without it, the vocabulary and the sequence are one token shorter."""
    task = posbench.create_task(name, end_token=end_token)
    for length in (1, 3, 7):
        seq, answer = task.generate(length, 5, gen(length))
        assert seq.shape[1] == task.sequence_length(length) + 1
        assert int(answer.sum(dim=1).min()) == task.answer_length(length) + int(end_token)
        assert int(seq.max()) < task.vocab_size
        ends = seq == task.end
        if end_token:
            assert task.vocab_size == task.end + 1
            assert ends[:, -1].all() and (ends.sum(dim=1) == 1).all() and answer[:, -1].all()
        else:
            assert task.vocab_size == task.end and not ends.any()


@pytest.mark.parametrize("name", ["copy_single", "copy_replace", "copy_single_twice"])
def test_repeated_token_answers_need_the_end_to_be_exact(name: str) -> None:
    """Repeating the answer's first token forever is exact at every length without END and at
    none with it: END is what makes these tasks test length."""
    for end_token, exact in ((False, True), (True, False)):
        task = posbench.create_task(name, end_token=end_token)
        seq, answer = task.generate(6, 8, gen(3))
        first = seq[answer].view(8, -1)[:, :1]
        repeated = first.expand(8, int(answer[0].sum()))
        assert torch.equal(seq[answer].view(8, -1), repeated) is exact


def test_flip_flop_reads_the_last_write() -> None:
    task = posbench.create_task("flip_flop", p_ignore=0.5)
    seq, answer = task.generate(20, 16, gen(12))
    for row in range(16):
        last = None
        for op, bit, scored in zip(
            seq[row, 0::2].tolist(), seq[row, 1::2].tolist(), answer[row, 1::2].tolist()
        ):
            assert scored == (op == 3)
            if op == 2:
                last = bit
            elif op == 3:
                assert bit == last
        assert seq[row, 0] == 2 and seq[row, -2] == 3  # starts with a write, ends with a read


def test_selective_copy_and_counting() -> None:
    for q, a in _question_and_answer(posbench.create_task("selective_copy", spread=3), 13, 16, 13):
        assert a == [t for t in q if t != 8] and len(a) == 4
    counting = posbench.create_task("counting")
    for length in (1, 9, 64):
        for q, a in _question_and_answer(counting, length, 8, length):
            assert a == [4 + q.count(0)]


def test_deepmind_hand_checked_examples() -> None:
    from posbench.tasks.transduction import binary, evaluate_mod

    assert binary(6, 0) == [0, 1, 1] and binary(6, 5, little_endian=False) == [0, 0, 1, 1, 0]
    assert evaluate_mod(list("4+3"), 5) == 2  # modular wrap
    assert (
        evaluate_mod(list("1-1-1"), 5) == 4 and evaluate_mod(list("0*1+4*3-2"), 5) == 0
    )  # DeepMind's examples
    assert evaluate_mod(list("((-(2+4))-(3))"), 5) == 1  # nested brackets, unary minus: -6 - 3 = -9
    # binary addition with a carry through every digit: 1111 + 1 = 10000 (little-endian)
    add = posbench.create_task("binary_addition")
    seq, answer = add.generate(6, 1, gen(0))
    question, reply = seq[0, :6].tolist(), seq[0][answer[0]].tolist()
    cut = question.index(2)
    total = _little_endian(question[:cut]) + _little_endian(question[cut + 1 :])
    assert reply == binary(total, 0) + [add.end]
    assert [binary(15, 0)[i] for i in range(4)] == [1, 1, 1, 1] and binary(15 + 1, 0) == [
        0,
        0,
        0,
        0,
        1,
    ]
    # the shortest questions: DeepMind's placeholders
    for q, a in _question_and_answer(posbench.create_task("missing_duplicate_string"), 1, 2, 0):
        assert q == [1] and a == [1]
    for q, a in _question_and_answer(posbench.create_task("binary_multiplication"), 1, 2, 0):
        assert a == [posbench.create_task("binary_multiplication").end]  # zero digits, then END
