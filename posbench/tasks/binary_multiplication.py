"""Binary multiplication (DeepMind's suite, context-sensitive)."""

from __future__ import annotations

from posbench.tasks.binary_addition import BinaryAddition
from posbench.tasks.registry import register_task


@register_task("binary_multiplication")
class BinaryMultiplication(BinaryAddition):
    """``n * m SEP (n * m) END``: as binary_addition with the product (the operator token is
    the same symbol); the answer takes up to n tokens with END, since a product of widths
    a + b = n - 1 has at most n - 1 digits. For n <= 2 DeepMind's placeholder answer is
    n - 1 zeros.

    Vocabulary: 0, 1, the operator, SEP, PAD, END. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/cs/binary_multiplication.py.
    """

    family = "context-sensitive"

    def answer_length(self, length: int) -> int:
        return length

    def combine(self, a: int, b: int) -> int:
        return a * b

    def small_answer(self, number: int, length: int) -> list[int]:
        return [0] * (length - 1)
