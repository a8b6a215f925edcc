"""Binary addition (DeepMind's suite, context-sensitive)."""

from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, binary

PLUS = 2


@register_task("binary_addition")
class BinaryAddition(Transduction):
    """``n + m SEP (n + m) END``: two positive numbers in little-endian binary joined by +
    (their widths split the n - 1 digits at random, each zero-padded to its width); the answer
    is the sum in little-endian binary without trailing zeros, then END. For n <= 2 the
    question is one number of n digits and the answer that number (DeepMind's placeholder).

    Vocabulary: 0, 1, +, SEP, PAD, END. The length is n, the question's tokens; the answer
    takes up to n + 1 tokens with END. As google-deepmind/neural_networks_chomsky_hierarchy
    tasks/cs/binary_addition.py.
    """

    family = "context-sensitive"

    n_symbols = 3
    ends = True
    length_unit = "question tokens"

    def answer_length(self, length: int) -> int:
        return length + 1

    def combine(self, a: int, b: int) -> int:
        return a + b

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        questions, answers = [], []
        for _ in range(batch_size):
            if length <= 2:
                number = rng.randrange(2**length - 1)
                questions.append(binary(number, length))
                answers.append(self.small_answer(number, length))
                continue
            width_a = rng.randint(1, length - 2)
            width_b = length - 1 - width_a
            a, b = rng.randint(1, 2**width_a - 1), rng.randint(1, 2**width_b - 1)
            questions.append(binary(a, width_a) + [PLUS] + binary(b, width_b))
            answers.append(binary(self.combine(a, b), 0))
        return questions, answers

    def small_answer(self, number: int, length: int) -> list[int]:
        """DeepMind's answer for lengths 1 and 2, where the question is a single number."""
        return binary(number, 0)
