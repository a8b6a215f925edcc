"""Modular arithmetic without brackets (DeepMind's suite, regular)."""

from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, evaluate_mod

MODULUS = 5
OPERATORS = ("+", "-", "*")


@register_task("modular_arithmetic")
class ModularArithmetic(Transduction):
    """``x_1 op x_2 op .. x_k SEP v``: digits 0..4 and operators + - * alternate; v is the
    expression's value mod 5 with the usual precedence (* before + and -).

    Vocabulary: digits 0..4, + - * as 5, 6, 7, then SEP, PAD. The length counts the
    expression's tokens and is made odd as DeepMind does (an even length uses one token
    fewer); one answer token. As google-deepmind/neural_networks_chomsky_hierarchy
    tasks/regular/modular_arithmetic.py (modulus 5, all three operators).
    """

    family = "regular"

    n_symbols = MODULUS + len(OPERATORS)
    length_unit = "expression tokens"

    def question_length(self, length: int) -> int:
        return length if length % 2 else length - 1

    def answer_length(self, length: int) -> int:
        return 1

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        n = self.question_length(length)
        questions, answers = [], []
        for _ in range(batch_size):
            text = [
                str(rng.randrange(MODULUS)) if i % 2 == 0 else rng.choice(OPERATORS)
                for i in range(n)
            ]
            questions.append(
                [int(t) if t.isdigit() else MODULUS + OPERATORS.index(t) for t in text]
            )
            answers.append([evaluate_mod(text, MODULUS)])
        return questions, answers
