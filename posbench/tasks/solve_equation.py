"""Solve a modular equation for x (DeepMind's suite, deterministic context-free)."""

from __future__ import annotations

import random

from posbench.tasks.modular_arithmetic_brackets import (
    CHARACTERS,
    MODULUS,
    bracketed_expression,
    encode,
)
from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, evaluate_mod


@register_task("solve_equation")
class SolveEquation(Transduction):
    """``expression_with_x = v SEP x``: a bracketed expression of length n - 2 with + and -
    whose one digit is replaced by x, then ``= v`` with v its value mod 5; the answer is the
    replaced digit (unique, since there is no multiplication).

    Vocabulary: as modular_arithmetic_brackets (digits 0..4, + - * ( ) x =), SEP, PAD. The
    length n counts the equation's characters (at least 3); one answer token. As
    google-deepmind/neural_networks_chomsky_hierarchy tasks/dcf/solve_equation.py, whose
    lengths 1 and 2 are all-zero placeholders; here the shortest equation is 3 (``x=v``).
    """

    family = "context-free"

    n_symbols = MODULUS + len(CHARACTERS)
    default_train_lengths = (3, 16)
    length_unit = "equation characters"
    min_length = 3

    def answer_length(self, length: int) -> int:
        return 1

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        questions, answers = [], []
        for _ in range(batch_size):
            expression = bracketed_expression(rng, length - 2)
            value = evaluate_mod(expression, MODULUS)
            at = rng.randrange(len(expression))  # DeepMind's choice: the first digit at or after
            while not expression[at].isdigit():  # a uniform character, wrapping round
                at = (at + 1) % len(expression)
            solution = int(expression[at])
            equation = expression[:at] + ["x"] + expression[at + 1 :] + ["=", str(value)]
            questions.append(encode(equation))
            answers.append([solution])
        return questions, answers
