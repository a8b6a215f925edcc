"""Cycle navigation (DeepMind's suite, regular): where on a cycle of 5 do the moves end?"""
from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, bits


@register_task("cycle_navigation")
class CycleNavigation(Transduction):
    """``a_1 .. a_n SEP s``: each action token a moves a - 1 steps on a cycle of 5 states
    starting at 0 (0 steps left, 1 stays, 2 steps right); s = sum(a_t - 1) mod 5 is the final
    state, as DeepMind's code computes it.

    Vocabulary: 0..4 (actions use 0..2, states 0..4), SEP, PAD. The length is n, the number of
    actions; one answer token. As google-deepmind/neural_networks_chomsky_hierarchy
    tasks/regular/cycle_navigation.py.
    """

    n_symbols = 5
    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 24, 32, 48, 64)
    length_unit = "actions"

    def answer_length(self, length: int) -> int:
        return 1

    def sample(self, length: int, batch_size: int, rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
        questions = [bits(rng, length, 3) for _ in range(batch_size)]
        return questions, [[sum(a - 1 for a in q) % 5] for q in questions]
