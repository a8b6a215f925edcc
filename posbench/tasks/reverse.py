"""Reverse: write a random string backwards after a separator."""

from __future__ import annotations

from torch import Tensor

from posbench.tasks.registry import register_task
from posbench.tasks.copy import Copy


@register_task("reverse")
class Reverse(Copy):
    """Reverse a random string: ``s_1 .. s_n SEP s_n .. s_1``; loss on the reversed copy only.

    Vocabulary, lengths and loss mask as in ``copy``; only the answer's order differs.
    """

    def answer_of(self, string: Tensor) -> Tensor:
        return string.flip(1)
