"""Bucket sort (DeepMind's suite, context-sensitive)."""
from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, bits


@register_task("bucket_sort")
class BucketSort(Transduction):
    """``s_1 .. s_n SEP sorted(s)``: sort a string over 5 symbols in increasing order.

    Solving it needs counting how many smaller symbols there are, not a fixed offset.
    Vocabulary: 0..4, SEP, PAD. The length is n; the answer is n tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/cs/bucket_sort.py (5 symbols).
    """

    n_symbols = 5
    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 24, 32, 48, 64)
    length_unit = "symbols"

    def answer_length(self, length: int) -> int:
        return length

    def sample(self, length: int, batch_size: int, rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
        questions = [bits(rng, length, self.n_symbols) for _ in range(batch_size)]
        return questions, [sorted(q) for q in questions]
