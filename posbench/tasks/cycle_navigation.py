"""Cycle navigation (DeepMind's suite, regular): where on a cycle of 5 do the moves end?"""

from __future__ import annotations

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import UniformString


@register_task("cycle_navigation")
class CycleNavigation(UniformString):
    """``a_1 .. a_n SEP s``: each action token a moves a - 1 steps on a cycle of 5 states
    starting at 0 (0 steps left, 1 stays, 2 steps right); s = sum(a_t - 1) mod 5 is the final
    state, as DeepMind's code computes it.

    Vocabulary: 0..4 (actions use 0..2, states 0..4), SEP, PAD. The length is n, the number of
    actions; one answer token. As google-deepmind/neural_networks_chomsky_hierarchy
    tasks/regular/cycle_navigation.py.
    """

    family = "regular"

    n_symbols = 5
    question_symbols = 3
    length_unit = "actions"

    def answer(self, question: list[int]) -> list[int]:
        return [sum(a - 1 for a in question) % 5]
