"""Passkey retrieval: a needle in a haystack of filler tokens."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.tasks.registry import register_task
from posbench.tasks.base import Task, random_symbols
from posbench.validation import Range


@register_task("passkey")
class Passkey(Task):
    """Find a passkey planted in filler: ``f.. KEY d1..dk f.. (length of them) ASK d1..dk``.

    The length is the number of filler tokens between the passkey and the question, the
    distance the model must reach back; ``length // 4`` filler tokens also precede the key.
    Vocabulary: 10 digits, ``n_filler`` filler tokens, KEY and ASK. Loss and accuracy on the
    digits after ASK only.
    """

    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 32, 64)
    length_unit = "filler tokens between key and question"

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        digits: Annotated[int, Range(ge=1)] = 2,
        n_filler: Annotated[int, Range(ge=1)] = 4,
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        self.digits = digits
        self.n_filler = n_filler
        self.key_token = 10 + n_filler
        self.ask_token = self.key_token + 1

    @property
    def vocab_size(self) -> int:
        return 10 + self.n_filler + 2

    def sequence_length(self, length: int) -> int:
        return length // 4 + 2 * self.digits + 1 + length

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        B, k, lead = batch_size, self.digits, length // 4
        seq = 10 + random_symbols(B, self.sequence_length(length) + 1, self.n_filler, generator)
        key = random_symbols(B, k, 10, generator)  # (B, k) digits
        ask = lead + 1 + k + length  # the question sits `length` fillers after the key
        seq[:, lead] = self.key_token
        seq[:, lead + 1 : lead + 1 + k] = key
        seq[:, ask] = self.ask_token
        seq[:, ask + 1 :] = key
        answer = torch.zeros_like(seq, dtype=torch.bool)
        answer[:, ask + 1 :] = True
        return seq, answer
