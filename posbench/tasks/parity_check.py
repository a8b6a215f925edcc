"""Parity check (DeepMind's suite, regular): is the number of ones even?"""
from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, bits


@register_task("parity_check")
class ParityCheck(Transduction):
    """``b_1 .. b_n SEP c``: c = (number of ones) mod 2.

    Vocabulary: 0, 1, SEP, PAD. The length is n, the string length; one answer token.
    As google-deepmind/neural_networks_chomsky_hierarchy tasks/regular/parity_check.py.
    """

    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 24, 32, 48, 64)
    length_unit = "bits"

    def answer_length(self, length: int) -> int:
        return 1

    def sample(self, length: int, batch_size: int, rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
        questions = [bits(rng, length) for _ in range(batch_size)]
        return questions, [[sum(q) % 2] for q in questions]
