"""Question, separator, answer: the decoder-only form of a sequence-to-sequence task."""

from __future__ import annotations

import random
from abc import abstractmethod
from typing import Annotated, ClassVar, Sequence

import torch
from torch import Tensor

from posbench.tasks.base import IGNORE, Batch, Task
from posbench.validation import OneOf, check_value


#: How a transduction task is posed: "decoder", next-token prediction of ``question SEP
#: answer`` by a causal model; "encoder", DeepMind's form, a bidirectional model reading the
#: question followed by one blank token per answer token and emitting the answer at the blanks
#: all at once (Deletang et al. 2023).
FORMS = ("decoder", "encoder")


class Transduction(Task):
    """A task posed as ``question SEP answer [END] [PAD ..]``; only the answer (and END) is scored.

    With ``form = "encoder"`` the model reads ``question BLANK ..`` (one blank per answer
    token, the SEP id) with bidirectional attention, and each blank's output is scored against
    the answer token at its place: nothing is generated token by token, so free-running and
    teacher-forced accuracy are the same number.

    Subclasses set ``n_symbols`` (token ids 0..n_symbols-1, shared by questions and answers)
    and implement :meth:`answer_length` (the longest answer for a question of that length,
    END included) and :meth:`sample`, which draws questions and their answers with a seeded
    ``random.Random``. SEP, PAD and, for tasks whose answers vary in length (``ends``), END
    follow the symbols. A shorter answer is followed by PAD, which is never scored: the causal
    model cannot see it from the answer positions, so it changes nothing.
    """

    n_symbols: ClassVar[int] = 2
    #: Answers vary in length and close with END (DeepMind's termination token), which is scored.
    ends: ClassVar[bool] = False
    #: DeepMind's suite trains on 1..40 and tests 41..500; on 2 CPU cores: 1..16, tested to 4x.
    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 24, 32, 48, 64)

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        form: Annotated[str, OneOf(FORMS)] = "decoder",
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        check_value("form", form, Annotated[str, OneOf(FORMS)], f"task {self.name!r}")
        self.form = form

    @property
    def causal(self) -> bool:
        return self.form == "decoder"

    @property
    def sep(self) -> int:
        return self.n_symbols

    @property
    def pad(self) -> int:
        return self.n_symbols + 1

    @property
    def end(self) -> int:
        return self.n_symbols + 2

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + 2 + int(self.ends)

    def question_length(self, length: int) -> int:
        """Tokens in the question for a task of size `length` (the length itself by default)."""
        return length

    @abstractmethod
    def answer_length(self, length: int) -> int:
        """The most answer tokens (END included) for a question of size `length`."""

    @abstractmethod
    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Questions (each question_length(length) symbols) and their answers (without END)."""

    def sequence_length(self, length: int) -> int:
        return self.question_length(length) + self.answer_length(length)

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        rng = random.Random(int(torch.randint(0, 2**62, (1,), generator=generator)))
        questions, answers = self.sample(length, batch_size, rng)
        q_len, a_len = self.question_length(length), self.answer_length(length)
        seq = torch.full((batch_size, q_len + 1 + a_len), self.pad, dtype=torch.long)
        answer = torch.zeros_like(seq, dtype=torch.bool)
        for row, (question, reply) in enumerate(zip(questions, answers)):
            reply = list(reply) + ([self.end] if self.ends else [])
            assert len(question) == q_len and len(reply) <= a_len, (
                self.name,
                length,
                question,
                reply,
            )
            seq[row, :q_len] = torch.tensor(question, dtype=torch.long)
            seq[row, q_len] = self.sep
            seq[row, q_len + 1 : q_len + 1 + len(reply)] = torch.tensor(reply, dtype=torch.long)
            answer[row, q_len + 1 : q_len + 1 + len(reply)] = True
        return seq, answer

    def batch(self, length: int, batch_size: int, generator: torch.Generator) -> Batch:
        """Decoder form: next-token targets (Task.batch). Encoder form: the question and one
        blank per answer token, each blank's target the answer token at its place."""
        if self.causal:
            return super().batch(length, batch_size, generator)
        seq, answer = self.generate(length, batch_size, generator)  # (B, q + 1 + a)
        q_len = self.question_length(length)
        tokens = seq[:, :-1].clone()  # (B, q + a): the question, then a blanks
        tokens[:, q_len:] = self.sep
        targets = torch.full_like(tokens, IGNORE)
        targets[:, q_len:] = seq[:, q_len + 1 :].masked_fill(~answer[:, q_len + 1 :], IGNORE)
        return Batch(tokens, targets)


class UniformString(Transduction):
    """A question of `length` symbols drawn uniformly from the first ``question_symbols``
    (all symbols by default), answered by :meth:`answer`; one answer token unless
    :meth:`answer_length` says otherwise."""

    question_symbols: ClassVar[int | None] = None

    def answer_length(self, length: int) -> int:
        return 1

    @abstractmethod
    def answer(self, question: list[int]) -> list[int]:
        """The answer tokens (without END) for one question."""

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        questions = [
            bits(rng, length, self.question_symbols or self.n_symbols) for _ in range(batch_size)
        ]
        return questions, [self.answer(q) for q in questions]


def bits(rng: random.Random, n: int, symbols: int = 2) -> list[int]:
    """n uniform symbols from 0..symbols-1."""
    return [rng.randrange(symbols) for _ in range(n)]


def binary(number: int, width: int, little_endian: bool = True) -> list[int]:
    """`number` in binary, zero-padded to `width` digits (never cut), least significant first
    unless big-endian."""
    digits = [int(d) for d in f"{number:b}".zfill(width)]
    return digits[::-1] if little_endian else digits


def evaluate_mod(tokens: Sequence[str], modulus: int) -> int:
    """The value mod `modulus` of an expression of digits, + - * and brackets (usual precedence,
    unary minus allowed), parsed by recursive descent."""
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        position += 1
        return tokens[position - 1]

    def atom() -> int:
        token = take()
        if token == "(":
            value = expression()
            take()  # ")"
            return value
        if token == "-":
            return -atom() % modulus
        return int(token)

    def term() -> int:
        value = atom()
        while peek() == "*":
            take()
            value = value * atom() % modulus
        return value

    def expression() -> int:
        value = term()
        while peek() in ("+", "-"):
            op = take()
            value = (value + term() if op == "+" else value - term()) % modulus
        return value

    return expression() % modulus
