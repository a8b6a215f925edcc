"""Rotate a string as a local task plugin, written as a user would write one: a file in a
plugin folder, no edit to posbench."""
from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench import Task, register_task
from posbench.validation import Range


@register_task("rotate")
class Rotate(Task):
    """Rotate a random string left by ``shift``: ``s_1 .. s_n SEP s_(k+1) .. s_n s_1 .. s_k``.

    Vocabulary: ``n_symbols`` symbols, then SEP. The length is n; the model sees 2n tokens and
    only the rotated copy carries loss. The offset it must copy from changes at the wrap-around,
    so a fixed relative offset alone does not solve it.
    """

    default_train_lengths = (1, 8)
    default_eval_lengths = (4, 8, 16, 32)

    def __init__(self, *, train_lengths=None, eval_lengths=None, n_symbols: Annotated[int, Range(ge=2)] = 10,
                 shift: Annotated[int, Range(ge=0)] = 1) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        self.n_symbols, self.shift = n_symbols, shift

    @property
    def vocab_size(self) -> int:
        return self.n_symbols + 1

    def sequence_length(self, length: int) -> int:
        return 2 * length

    def generate(self, length: int, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        string = torch.randint(0, self.n_symbols, (batch_size, length), generator=generator)
        sep = torch.full((batch_size, 1), self.n_symbols, dtype=torch.long)
        seq = torch.cat((string, sep, string.roll(-self.shift, dims=1)), dim=1)  # (B, 2n + 1)
        answer = torch.zeros_like(seq, dtype=torch.bool)
        answer[:, length + 1 :] = True
        return seq, answer

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "n_symbols": self.n_symbols, "shift": self.shift}
