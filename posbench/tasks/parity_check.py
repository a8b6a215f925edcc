"""Parity check (DeepMind's suite, regular): is the number of ones even?"""

from __future__ import annotations

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import UniformString


@register_task("parity_check")
class ParityCheck(UniformString):
    """``b_1 .. b_n SEP c``: c = (number of ones) mod 2.

    Vocabulary: 0, 1, SEP, PAD. The length is n, the string length; one answer token.
    As google-deepmind/neural_networks_chomsky_hierarchy tasks/regular/parity_check.py.
    """

    family = "regular"

    length_unit = "bits"

    def answer(self, question: list[int]) -> list[int]:
        return [sum(question) % 2]
