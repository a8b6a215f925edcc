"""Multi-query associative recall (Zoology's MQAR)."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.tasks.registry import register_task
from posbench.tasks.base import Task
from posbench.validation import Range


@register_task("mqar")
class MQAR(Task):
    """Key-value pairs, then queries of the keys: ``k1 v1 .. kn vn  kq vq ..``.

    The length is n, the number of pairs; all n keys are then queried in a random order, so a
    longer sequence means more pairs and longer gaps between a pair and its query. Keys are
    distinct within a sequence. Vocabulary: keys 0..n_keys-1, then n_values values. Loss and
    accuracy only on the value after each queried key.
    """

    default_train_lengths = (2, 8)
    default_eval_lengths = (4, 8, 16, 32)
    length_unit = "key-value pairs"

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        n_keys: Annotated[int | None, Range(ge=1)] = None,
        n_values: Annotated[int, Range(ge=2)] = 16,
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        longest = max(self.train_lengths[1], max(self.eval_lengths))
        self.n_keys = n_keys if n_keys is not None else max(32, longest)
        if self.n_keys < longest:
            from posbench.errors import OptionError

            raise OptionError(
                f"task 'mqar': n_keys={self.n_keys} is fewer than the {longest} pairs asked for."
            )
        self.n_values = n_values

    @property
    def vocab_size(self) -> int:
        return self.n_keys + self.n_values

    def sequence_length(self, length: int) -> int:
        return 4 * length - 1

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        B, n = batch_size, length
        keys = torch.rand(B, self.n_keys, generator=generator).argsort(dim=1)[:, :n]  # distinct
        values = self.n_keys + torch.randint(0, self.n_values, (B, n), generator=generator)
        order = torch.rand(B, n, generator=generator).argsort(dim=1)
        pairs = torch.stack((keys, values), dim=2).flatten(1)  # (B, 2n)
        queries = torch.stack((keys.gather(1, order), values.gather(1, order)), dim=2).flatten(1)
        seq = torch.cat((pairs, queries), dim=1)  # (B, 4n)
        answer = torch.zeros_like(seq, dtype=torch.bool)
        answer[:, 2 * n + 1 :: 2] = True
        return seq, answer
