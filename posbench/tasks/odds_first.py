"""Odds first (DeepMind's suite, context-sensitive)."""

from __future__ import annotations

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import UniformString


@register_task("odds_first")
class OddsFirst(UniformString):
    """``s_1 .. s_n SEP s_2 s_4 .. s_1 s_3 ..``: the binary string's tokens at odd 0-based
    indices first, then those at even ones.

    This follows DeepMind's code (``concatenate([s[1::2], s[::2]])``); their docstring's
    example shows the other order, and their results were measured with the code's.
    Vocabulary: 0, 1, SEP, PAD. The length is n; the answer is n tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/cs/odds_first.py.
    """

    family = "context-sensitive"

    length_unit = "bits"

    def answer_length(self, length: int) -> int:
        return length

    def answer(self, question: list[int]) -> list[int]:
        return question[1::2] + question[::2]
