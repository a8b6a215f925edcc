"""Find the missing bit of a duplicated string (DeepMind's suite, context-sensitive)."""

from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, bits

MISSING, EMPTY = 2, 3


@register_task("missing_duplicate_string")
class MissingDuplicateString(Transduction):
    """``w w' [EMPTY] SEP b``: a binary string w of n // 2 bits written twice, one of the 2|w|
    bits replaced by MISSING (2), padded with EMPTY (3) when n is odd; the answer b is the
    replaced bit. Length 1 is DeepMind's placeholder: the question ``1``, the answer 1.

    Vocabulary: 0, 1, MISSING, EMPTY, SEP, PAD. The length is n, the question's tokens; one
    answer token. As google-deepmind/neural_networks_chomsky_hierarchy
    tasks/cs/missing_duplicate_string.py.
    """

    family = "context-sensitive"

    n_symbols = 4
    length_unit = "tokens"

    def answer_length(self, length: int) -> int:
        return 1

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        if length == 1:
            return [[1] for _ in range(batch_size)], [[1] for _ in range(batch_size)]
        questions, answers = [], []
        for _ in range(batch_size):
            half = bits(rng, length // 2)
            doubled = half + half
            at = rng.randrange(len(doubled))
            answers.append([doubled[at]])
            doubled[at] = MISSING
            questions.append(doubled + [EMPTY] * (length % 2))
        return questions, answers
