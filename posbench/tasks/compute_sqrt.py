"""Integer square root in binary (DeepMind's suite, context-sensitive)."""

from __future__ import annotations

import math
import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, binary


@register_task("compute_sqrt")
class ComputeSqrt(Transduction):
    """``x SEP floor(sqrt(x))``: x in 1..2^n - 1 as n big-endian binary digits; the answer is
    its integer square root in ceil(n / 2) big-endian digits.

    Vocabulary: 0, 1, SEP, PAD. The length is n; the answer is ceil(n / 2) tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/cs/compute_sqrt.py.
    """

    family = "context-sensitive"

    length_unit = "bits"

    def answer_length(self, length: int) -> int:
        return math.ceil(length / 2)

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        numbers = [rng.randint(1, 2**length - 1) for _ in range(batch_size)]
        return (
            [binary(x, length, little_endian=False) for x in numbers],
            [
                binary(math.isqrt(x), self.answer_length(length), little_endian=False)
                for x in numbers
            ],
        )
