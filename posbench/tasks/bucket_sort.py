"""Bucket sort (DeepMind's suite, context-sensitive)."""

from __future__ import annotations

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import UniformString


@register_task("bucket_sort")
class BucketSort(UniformString):
    """``s_1 .. s_n SEP sorted(s)``: sort a string over 5 symbols in increasing order.

    Solving it needs counting how many smaller symbols there are, not a fixed offset.
    Vocabulary: 0..4, SEP, PAD. The length is n; the answer is n tokens. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/cs/bucket_sort.py (5 symbols).
    """

    family = "context-sensitive"

    n_symbols = 5
    length_unit = "symbols"

    def answer_length(self, length: int) -> int:
        return length

    def answer(self, question: list[int]) -> list[int]:
        return sorted(question)
