"""Rotate a string as a local task plugin, written as a user would write one: a file in a
plugin folder, no edit to posbench."""

from __future__ import annotations

from typing import Annotated

from torch import Tensor

from posbench import register_task
from posbench.tasks.copy import Copy
from posbench.validation import Range


@register_task("rotate")
class Rotate(Copy):
    """Rotate a random string left by ``shift``: ``s_1 .. s_n SEP s_(k+1) .. s_n s_1 .. s_k``.

    Copy with another answer: only ``answer_of`` differs. The offset the model must copy from
    changes at the wrap-around, so a fixed relative offset alone does not solve it.
    """

    default_eval_lengths = (4, 8, 16, 32)

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        n_symbols: Annotated[int, Range(ge=2)] = 10,
        shift: Annotated[int, Range(ge=0)] = 1,
    ) -> None:
        super().__init__(
            train_lengths=train_lengths, eval_lengths=eval_lengths, n_symbols=n_symbols
        )
        self.shift = shift

    def answer_of(self, string: Tensor) -> Tensor:
        """The string rotated left by `shift` (B, n)."""
        return string.roll(-self.shift, dims=1)
