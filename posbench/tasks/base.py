"""The task interface: a seeded generator of token sequences whose answers carry the loss."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Annotated, ClassVar, Optional, Sequence

import torch
from torch import Tensor

from posbench.errors import OptionError
from posbench.validation import Length, check_value

IGNORE = -100  # target value with no loss (cross_entropy's ignore_index)


@dataclass
class Batch:
    """Model inputs and next-token targets; targets are IGNORE outside the answers."""

    tokens: Tensor  # (B, T)
    targets: Tensor  # (B, T)

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.tokens.to(device), self.targets.to(device))

    def split(self, size: int) -> list["Batch"]:
        """The batch in consecutive pieces of at most `size` sequences."""
        return [
            Batch(tokens, targets)
            for tokens, targets in zip(self.tokens.split(size), self.targets.split(size))
        ]


class Task(ABC):
    """Base class for synthetic tasks.

    A task's *length* is its own size parameter (symbols to copy, key-value pairs, distance to
    the needle); :meth:`sequence_length` says how many tokens the model sees for it.
    Subclasses set the class defaults below and implement :meth:`generate` (the answers are
    next tokens of the sequence, as in language modelling) or, for a task whose targets are
    not the next tokens, :meth:`batch` itself.
    """

    name: ClassVar[str] = ""
    default_train_lengths: ClassVar[tuple[int, int]] = (1, 8)
    default_eval_lengths: ClassVar[tuple[int, ...]] = (4, 8, 16, 32)
    #: What a length counts, for axis labels.
    length_unit: ClassVar[str] = "symbols"
    #: Whether whole-answer exact match means something (not for language modelling).
    exact_match_meaningful: ClassVar[bool] = True
    #: Whether each answer token is also the model's next input (the answer at t is the token read
    #: at t + 1, as in copy or reverse), so free-running decoding feeds the model's own answers
    #: back. False where an answer names another token (lookback answers the token 12 back):
    #: writing it into the stream would corrupt the input, so free running reads the stream as
    #: given and equals teacher forcing. The conformance kit checks the declaration.
    answers_fed_back: ClassVar[bool] = True
    #: Whether evaluation also measures loss by position (full context and sliding window).
    per_position: ClassVar[bool] = False
    #: Real text has no known loss floor: a run counts as having learned such a task when its
    #: in-distribution loss over the whole held-out text is below this (None: no such bar).
    learned_loss_below: ClassVar[float | None] = None
    min_length: ClassVar[int] = 1
    #: The task's language class as Deletang et al. 2023 group their tasks ("regular",
    #: "context-free", "context-sensitive"); empty for a task outside that suite.
    family: ClassVar[str] = ""

    def __init__(
        self,
        *,
        train_lengths: Sequence[int] | None = None,
        eval_lengths: Sequence[int] | None = None,
    ) -> None:
        what = f"task {self.name!r}"
        check_value(
            "train_lengths", train_lengths, Annotated[Optional[Sequence[int]], Length(2)], what
        )
        check_value("eval_lengths", eval_lengths, Optional[Sequence[int]], what)
        lo, hi = tuple(train_lengths) if train_lengths is not None else self.default_train_lengths
        evals = tuple(eval_lengths) if eval_lengths is not None else self.default_eval_lengths
        if lo < self.min_length or hi < lo:
            raise OptionError(
                f"task {self.name!r}: train_lengths must be a range lo..hi with "
                f"{self.min_length} <= lo <= hi, got {lo}..{hi}."
            )
        if not evals or min(evals) < self.min_length:
            raise OptionError(
                f"task {self.name!r}: eval_lengths must be non-empty and each >= "
                f"{self.min_length}, "
                f"got {list(evals)}."
            )
        self.train_lengths = (int(lo), int(hi))
        self.eval_lengths = tuple(sorted(int(e) for e in evals))

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of distinct tokens."""

    @property
    def causal(self) -> bool:
        """Whether the task trains a causal model (next-token targets); False for a task posed
        to a bidirectional encoder (a transduction task's encoder form)."""
        return True

    @abstractmethod
    def sequence_length(self, length: int) -> int:
        """Number of input tokens the model sees for a task of size `length`."""

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """Full sequences (B, T + 1) and a bool mask (B, T + 1) of the answer tokens."""
        raise NotImplementedError(f"task {self.name!r} implements neither generate() nor batch()")

    def batch(self, length: int, batch_size: int, generator: torch.Generator) -> Batch:
        """A batch of inputs and targets: targets are the next tokens, IGNORE off-answer."""
        seq, answer = self.generate(length, batch_size, generator)
        targets = seq[:, 1:].masked_fill(~answer[:, 1:], IGNORE)
        return Batch(seq[:, :-1].contiguous(), targets.contiguous())

    def loss_floor(self, length: int) -> float | None:
        """The best mean next-token loss (nats) achievable on sequences of `length`, when the
        task can say (a synthetic language whose generator is known); None otherwise."""
        return None

    def loss_floors(self, lengths: Sequence[int]) -> dict[int, float | None]:
        """loss_floor at each of `lengths`: one call, so that a task whose floors are costly
        may compute them side by side."""
        return {n: self.loss_floor(n) for n in lengths}

    def evaluation_text(self) -> Tensor | None:
        """The held-out text as one token stream (T,), for a task evaluated over every token of
        it (a corpus); None for a task that samples its sequences."""
        return None

    def for_evaluation(self) -> "Task":
        """The task as evaluation samples it; a task with a train/held-out split (a text
        corpus) returns a view of its held-out part. Synthetic tasks are their own."""
        return self


def random_symbols(
    batch_size: int, length: int, n_symbols: int, generator: torch.Generator
) -> Tensor:
    """Uniform symbols 0..n_symbols-1, (B, length)."""
    return torch.randint(0, n_symbols, (batch_size, length), generator=generator)
