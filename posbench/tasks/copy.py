"""Copy: repeat a random string after a separator."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.tasks.registry import register_task
from posbench.tasks.base import Task, random_symbols
from posbench.validation import Range


@register_task("copy")
class Copy(Task):
    """Copy a random string: ``s_1 .. s_n SEP s_1 .. s_n``; loss on the second copy only.

    Vocabulary: ``n_symbols`` symbols (0..n_symbols-1), then SEP. The length is n, the string
    length; the model sees 2n tokens. Only the answer tokens after SEP carry loss and
    accuracy, so the string itself is never a target.
    """

    default_train_lengths = (1, 8)
    default_eval_lengths = (2, 4, 6, 8, 12, 16, 24, 32)

    def __init__(
        self, *, train_lengths=None, eval_lengths=None, n_symbols: Annotated[int, Range(ge=2)] = 10
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        self.n_symbols = n_symbols
        self.sep = n_symbols

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + 1

    def sequence_length(self, length: int) -> int:
        return 2 * length

    def answer_of(self, string: Tensor) -> Tensor:
        """What the model must write after SEP for `string` (B, n)."""
        return string

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        return self.pose(random_symbols(batch_size, length, self.n_symbols, generator), length)

    def pose(self, string: Tensor, length: int) -> tuple[Tensor, Tensor]:
        """``string SEP answer_of(string)`` (B, n + 1 + answer) and the mask of the answer."""
        sep = torch.full((string.shape[0], 1), self.sep, dtype=torch.long)
        seq = torch.cat((string, sep, self.answer_of(string)), dim=1)
        answer = torch.zeros_like(seq, dtype=torch.bool)
        answer[:, length + 1 :] = True
        return seq, answer
