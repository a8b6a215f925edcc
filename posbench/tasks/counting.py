"""Counting: how many times does a symbol occur? A task where position must be counted in units
other than tokens, the motivation of CoPE (Golovneva et al. 2024)."""

from __future__ import annotations

import random

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction

#: Symbols in the question; the counted one is 0.
N_QUESTION_SYMBOLS = 4


@register_task("counting")
class Counting(Transduction):
    """``s_1 .. s_n SEP c``: c is the number of 0s among the n symbols (each of 4 symbols
    uniform), written as one count token.

    Vocabulary: 4 symbols, one count token per count 0..max(eval and training lengths), SEP,
    PAD, so the vocabulary depends on the longest length. The length is n; one answer token.
    Counts never seen in training (past the longest training length's range) are new tokens
    the model cannot have learned: read accuracy past it as the share of counts it could name.
    """

    default_train_lengths = (1, 16)
    default_eval_lengths = (8, 16, 32, 64)
    length_unit = "symbols"

    def __init__(self, *, train_lengths=None, eval_lengths=None, form: str = "decoder") -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths, form=form)
        self.n_symbols = N_QUESTION_SYMBOLS + max(self.eval_lengths + (self.train_lengths[1],)) + 1

    def answer_length(self, length: int) -> int:
        return 1

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        questions = [
            [rng.randrange(N_QUESTION_SYMBOLS) for _ in range(length)] for _ in range(batch_size)
        ]
        return questions, [[N_QUESTION_SYMBOLS + q.count(0)] for q in questions]
