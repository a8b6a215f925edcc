"""Reverse a binary string (DeepMind's suite, deterministic context-free)."""
from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, bits


@register_task("reverse_string")
class ReverseString(Transduction):
    """``b_1 .. b_n SEP b_n .. b_1``.

    Vocabulary: 0, 1, SEP, PAD. The length is n; the answer is n tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/dcf/reverse_string.py (binary, as
    in their paper); the `reverse` task is the same over 10 symbols (Kazemnejad et al.'s form).
    """

    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 24, 32, 48, 64)
    length_unit = "bits"

    def answer_length(self, length: int) -> int:
        return length

    def sample(self, length: int, batch_size: int, rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
        questions = [bits(rng, length) for _ in range(batch_size)]
        return questions, [q[::-1] for q in questions]
