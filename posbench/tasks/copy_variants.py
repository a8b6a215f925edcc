"""Kazemnejad et al.'s copy variants (McGill-NLP/length-generalization,
scripts/dataset_builders/make_copy_dataset.py): one token repeated, one token replaced by
another that the prompt names, and the forms that write the answer twice. Random-token copy
(their cmc) is the `copy` task.

Their decoder writes the answer and then end-of-sequence, and exact match reads the whole
generation, so every variant here ends its answer with END by default (``end_token``). Without
it, a repeated-token answer is solved at every length by repeating the last token: what these
tasks test is where the answer stops."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.tasks.copy import Copy
from posbench.tasks.registry import register_task
from posbench.validation import Range


class _EndsAnswer(Copy):
    """A copy variant whose answer ends with END unless ``end_token = false``."""

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        n_symbols: Annotated[int, Range(ge=2)] = 10,
        end_token: bool = True,
    ) -> None:
        super().__init__(
            train_lengths=train_lengths,
            eval_lengths=eval_lengths,
            n_symbols=n_symbols,
            end_token=end_token,
        )


class _RepeatedToken(_EndsAnswer):
    """A string of one symbol repeated n times (their rsc and rdc questions)."""

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        symbol = torch.randint(0, self.n_symbols, (batch_size, 1), generator=generator)
        string = symbol.expand(batch_size, length)
        return self.pose(string, self.answer_of(string))


@register_task("copy_single")
class CopySingle(_RepeatedToken):
    """Their rsc: ``t t .. t SEP t t .. t END``, one random symbol repeated n times, written again.

    Vocabulary: ``n_symbols`` symbols, SEP, END. The length is n; the answer is n tokens and
    END. Their decoder-only results (train <= 20, test 21..40, exact match, 3 seeds): NoPE
    0.986, T5 0.771, ALiBi 0.289, rotary 0.000, sinusoidal 0.000.
    """


@register_task("copy_replace")
class CopyReplace(_EndsAnswer):
    """Their rdc: ``s t s .. s SEP t .. t END``, one symbol s repeated n times after a prompt
    that names it and its replacement t (any other symbol), written again as t.

    Their prompt is ``Replace s with t in s .. s``; its words are the same in every example and
    are left out, so the question is s, t and the string. The answer must be read from the
    prompt's second token, which moves away as n grows. Vocabulary: ``n_symbols`` symbols, SEP,
    END. The length is n; the question is n + 2 tokens, the answer n tokens and END.
    Their results: NoPE 0.967, T5 0.939, ALiBi 0.170, rotary 0.016, sinusoidal 0.000.
    """

    def question_length(self, length: int) -> int:
        return length + 2

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        source = torch.randint(0, self.n_symbols, (batch_size, 1), generator=generator)
        shift = torch.randint(1, self.n_symbols, (batch_size, 1), generator=generator)
        target = (source + shift) % self.n_symbols  # uniform over the other symbols
        question = torch.cat((source, target, source.expand(batch_size, length)), dim=1)
        return self.pose(question, target.expand(batch_size, length))


@register_task("copy_single_twice")
class CopySingleTwice(_RepeatedToken):
    """Their rsc2x: ``t .. t SEP t .. t t .. t END``, one symbol repeated n times, written 2n
    times.

    Vocabulary: ``n_symbols`` symbols, SEP, END. The length is n; the answer is 2n tokens and END.
    Their results: NoPE 0.974, T5 0.558, ALiBi 0.194, rotary 0.000, sinusoidal 0.000.
    """

    def answer_length(self, length: int) -> int:
        return 2 * length

    def answer_of(self, string: Tensor) -> Tensor:
        return torch.cat((string, string), dim=1)


@register_task("copy_twice")
class CopyTwice(_EndsAnswer):
    """Their cmc2x: ``s SEP s NEXT s END``, a random string written twice with NEXT between.

    Vocabulary: ``n_symbols`` symbols, SEP, NEXT, END. The length is n; the answer is 2n + 1
    tokens and END.
    Their results: ALiBi 0.569, T5 0.524, NoPE 0.431, rotary 0.043, sinusoidal 0.040.
    """

    @property
    def symbol_vocab_size(self) -> int:
        return self.n_symbols + 2

    def answer_length(self, length: int) -> int:
        return 2 * length + 1

    def answer_of(self, string: Tensor) -> Tensor:
        following = torch.full((string.shape[0], 1), self.n_symbols + 1, dtype=torch.long)
        return torch.cat((string, following, string), dim=1)
