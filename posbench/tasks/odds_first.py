"""Odds first (DeepMind's suite, context-sensitive)."""
from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, bits


@register_task("odds_first")
class OddsFirst(Transduction):
    """``s_1 .. s_n SEP s_2 s_4 .. s_1 s_3 ..``: the binary string's tokens at odd 0-based
    indices first, then those at even ones.

    This follows DeepMind's code (``concatenate([s[1::2], s[::2]])``); their docstring's
    example shows the other order, and their results were measured with the code's.
    Vocabulary: 0, 1, SEP, PAD. The length is n; the answer is n tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/cs/odds_first.py.
    """

    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 24, 32, 48, 64)
    length_unit = "bits"

    def answer_length(self, length: int) -> int:
        return length

    def sample(self, length: int, batch_size: int, rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
        questions = [bits(rng, length) for _ in range(batch_size)]
        return questions, [q[1::2] + q[::2] for q in questions]
