"""Even pairs (DeepMind's suite, regular): is the number of unequal neighbours even?"""

from __future__ import annotations

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import UniformString


@register_task("even_pairs")
class EvenPairs(UniformString):
    """``b_1 .. b_n SEP c``: c = 1 when the binary string has an odd number of unequal
    adjacent pairs (01 or 10), else 0 (equivalently, whether its first and last bits differ).

    Vocabulary: 0, 1, SEP, PAD. The length is n, the string length; one answer token.
    As google-deepmind/neural_networks_chomsky_hierarchy tasks/regular/even_pairs.py.
    """

    family = "regular"

    length_unit = "bits"

    def answer(self, question: list[int]) -> list[int]:
        return [sum(a != b for a, b in zip(question, question[1:])) % 2]
