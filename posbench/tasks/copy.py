"""Copy: repeat a random string after a separator."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.tasks.registry import register_task
from posbench.tasks.base import Task, random_symbols
from posbench.validation import Range


@register_task("copy")
class Copy(Task):
    """Copy a random string: ``s_1 .. s_n SEP s_1 .. s_n``; loss on the second copy only.

    Vocabulary: ``n_symbols`` symbols (0..n_symbols-1), then SEP. The length is n, the string
    length; the model sees 2n tokens. Only the answer tokens after SEP carry loss and
    accuracy, so the string itself is never a target. With ``end_token`` the answer ends with
    END (the last id in the vocabulary), which is scored like any answer token: the model must
    also say where its answer stops, as a decoder that generates until end-of-sequence must
    (Kazemnejad et al.'s protocol). Exact match then fails on stopping early or late.
    """

    default_train_lengths = (1, 8)
    default_eval_lengths = (2, 4, 6, 8, 12, 16, 24, 32)

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        n_symbols: Annotated[int, Range(ge=2)] = 10,
        end_token: bool = False,
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        self.n_symbols = n_symbols
        self.sep = n_symbols
        self.end_token = end_token

    @property
    def symbol_vocab_size(self) -> int:
        """Ids the question and the answer use (symbols and markers), END left out."""
        return self.n_symbols + 1

    @property
    def vocab_size(self) -> int:
        return self.symbol_vocab_size + int(self.end_token)

    @property
    def end(self) -> int:
        """END's id, the last in the vocabulary; written only with `end_token`."""
        return self.symbol_vocab_size

    def question_length(self, length: int) -> int:
        """Question tokens (SEP left out) for a string of `length`."""
        return length

    def answer_length(self, length: int) -> int:
        """Answer tokens (END left out) for a string of `length`."""
        return length

    def sequence_length(self, length: int) -> int:
        return self.question_length(length) + self.answer_length(length) + int(self.end_token)

    def answer_of(self, string: Tensor) -> Tensor:
        """What the model must write after SEP for `string` (B, n)."""
        return string

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        string = random_symbols(batch_size, length, self.n_symbols, generator)
        return self.pose(string, self.answer_of(string))

    def pose(self, question: Tensor, answer: Tensor) -> tuple[Tensor, Tensor]:
        """``question SEP answer [END]`` (B, question + 1 + answer [+ 1]) and the mask of the
        answer (END included)."""
        sep = torch.full((question.shape[0], 1), self.sep, dtype=torch.long)
        parts = [question, sep, answer]
        if self.end_token:
            parts.append(torch.full_like(sep, self.end))
        seq = torch.cat(parts, dim=1)
        scored = torch.zeros_like(seq, dtype=torch.bool)
        scored[:, question.shape[1] + 1 :] = True
        return seq, scored
