"""Duplicate a binary string (DeepMind's suite, context-sensitive)."""
from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, bits


@register_task("duplicate_string")
class DuplicateString(Transduction):
    """``w SEP w w``: write the binary string twice, without a separator.

    Vocabulary: 0, 1, SEP, PAD. The length is n = |w|; the answer is 2n tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/cs/duplicate_string.py.
    """

    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 24, 32, 48, 64)
    length_unit = "bits"

    def answer_length(self, length: int) -> int:
        return 2 * length

    def sample(self, length: int, batch_size: int, rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
        questions = [bits(rng, length) for _ in range(batch_size)]
        return questions, [q + q for q in questions]
