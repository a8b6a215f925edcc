"""Reverse a binary string (DeepMind's suite, deterministic context-free)."""

from __future__ import annotations

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import UniformString


@register_task("reverse_string")
class ReverseString(UniformString):
    """``b_1 .. b_n SEP b_n .. b_1``.

    Vocabulary: 0, 1, SEP, PAD. The length is n; the answer is n tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/dcf/reverse_string.py (binary, as
    in their paper); the `reverse` task is the same over 10 symbols (Kazemnejad et al.'s form).
    """

    family = "context-free"

    length_unit = "bits"

    def answer_length(self, length: int) -> int:
        return length

    def answer(self, question: list[int]) -> list[int]:
        return question[::-1]
