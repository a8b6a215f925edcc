"""Selective copy (Gu and Dao 2023), one of CoPE's tasks (Golovneva et al. 2024)."""

from __future__ import annotations

import random
from typing import Annotated

from posbench.tasks.registry import register_task
from posbench.tasks.transduction import Transduction
from posbench.validation import Range

#: The blank (noise) token among the data symbols.
N_DATA_SYMBOLS = 8


@register_task("selective_copy")
class SelectiveCopy(Transduction):
    """``x . . y . z . SEP x y z``: data symbols scattered among blanks; copy the data symbols in
    order, skipping the blanks.

    One in ``spread`` question tokens is a data symbol (at least one), at random places, so the
    k-th answer token is the k-th *data* token, not the token at a fixed offset. Vocabulary: 8
    data symbols, the blank, SEP, PAD. The length is the question's tokens; the answer has
    max(1, length // spread) tokens.
    """

    n_symbols = N_DATA_SYMBOLS + 1
    default_train_lengths = (4, 32)
    default_eval_lengths = (16, 32, 64, 128)
    length_unit = "question tokens"

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        spread: Annotated[int, Range(ge=1)] = 4,
        form: str = "decoder",
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths, form=form)
        self.spread = spread

    def answer_length(self, length: int) -> int:
        return max(1, length // self.spread)

    def sample(
        self, length: int, batch_size: int, rng: random.Random
    ) -> tuple[list[list[int]], list[list[int]]]:
        questions, answers = [], []
        for _ in range(batch_size):
            places = sorted(rng.sample(range(length), self.answer_length(length)))
            data = [rng.randrange(N_DATA_SYMBOLS) for _ in places]
            question = [N_DATA_SYMBOLS] * length
            for place, symbol in zip(places, data):
                question[place] = symbol
            questions.append(question)
            answers.append(data)
        return questions, answers
