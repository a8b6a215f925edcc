"""Duplicate a binary string (DeepMind's suite, context-sensitive)."""

from __future__ import annotations

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import UniformString


@register_task("duplicate_string")
class DuplicateString(UniformString):
    """``w SEP w w``: write the binary string twice, without a separator.

    Vocabulary: 0, 1, SEP, PAD. The length is n = |w|; the answer is 2n tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/cs/duplicate_string.py.
    """

    family = "context-sensitive"

    length_unit = "bits"

    def answer_length(self, length: int) -> int:
        return 2 * length

    def answer(self, question: list[int]) -> list[int]:
        return question + question
