"""Modular arithmetic with brackets (DeepMind's suite, deterministic context-free)."""

from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction, evaluate_mod

MODULUS = 5
#: Question characters after the digits 0..4, in token order.
CHARACTERS = ("+", "-", "*", "(", ")", "x", "=")


def bracketed_expression(
    rng: random.Random, length: int, modulus: int = MODULUS, mult: bool = False
) -> list[str]:
    """A random bracketed expression of exactly `length` characters, built as DeepMind builds
    it: a digit (1), a negated digit (2), a bracketed digit (3) or negated one (4), else
    ``(left op right)`` with the lengths split at random."""
    digit = str(rng.randrange(modulus))
    if length == 1:
        return [digit]
    if length == 2:
        return ["-", digit]
    if length == 3:
        return ["(", digit, ")"]
    if length == 4:
        return ["(", "-", digit, ")"]
    left = rng.randint(1, length - 4)
    op = rng.choice(("+", "-", "*") if mult else ("+", "-"))
    return [
        "(",
        *bracketed_expression(rng, left, modulus, mult),
        op,
        *bracketed_expression(rng, length - left - 3, modulus, mult),
        ")",
    ]


def encode(characters: list[str]) -> list[int]:
    """Digits are their value, then the CHARACTERS in order."""
    return [int(c) if c.isdigit() else MODULUS + CHARACTERS.index(c) for c in characters]


@register_task("modular_arithmetic_brackets")
class ModularArithmeticBrackets(Transduction):
    """``expression SEP v``: a bracketed expression of digits 0..4 with + and - (and unary
    minus); v is its value mod 5.

    Vocabulary: digits 0..4, + - * ( ) x = (as in DeepMind's alphabet; * only with
    ``mult = true``, x and = only in solve_equation), SEP, PAD. The length is the expression's
    character count; one answer token. As google-deepmind/neural_networks_chomsky_hierarchy
    tasks/dcf/modular_arithmetic_brackets.py (modulus 5, no multiplication by default).
    """

    family = "context-free"

    n_symbols = MODULUS + len(CHARACTERS)
    length_unit = "expression characters"

    def __init__(
        self, *, train_lengths=None, eval_lengths=None, mult: bool = False, form: str = "decoder"
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths, form=form)
        self.mult = mult

    def answer_length(self, length: int) -> int:
        return 1

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        expressions = [bracketed_expression(rng, length, mult=self.mult) for _ in range(batch_size)]
        return [encode(e) for e in expressions], [[evaluate_mod(e, MODULUS)] for e in expressions]
