"""Flip-flop language modelling (Liu et al. 2023), one of CoPE's tasks (Golovneva et al. 2024)."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.tasks.base import Task
from posbench.tasks.registry import register_task
from posbench.validation import Range

WRITE, READ, IGNORE_OP = 2, 3, 4


@register_task("flip_flop")
class FlipFlop(Task):
    """``op b op b .. R b``: instruction-bit pairs; W (write) and I (ignore) carry a random bit,
    R (read) is followed by the bit of the most recent W. Every bit after an R is scored.

    The first instruction is a W and the last an R; the others are I with probability
    ``p_ignore`` and W or R with equal probability otherwise (Liu et al.'s FFL(p)). The answer
    sits a data-dependent number of tokens back: position must be counted in writes, not tokens.
    Vocabulary: 0, 1, W, R, I. The length is the number of pairs; the model sees 2n - 1 tokens.
    """

    default_train_lengths = (2, 16)
    default_eval_lengths = (8, 16, 32, 64)
    length_unit = "instructions"
    min_length = 2

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        p_ignore: Annotated[float, Range(ge=0, le=0.99)] = 0.8,
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        self.p_ignore = p_ignore

    @property
    def vocab_size(self) -> int:
        return 5

    def sequence_length(self, length: int) -> int:
        return 2 * length - 1

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        draw = torch.rand(batch_size, length, generator=generator)
        other = torch.where(torch.rand(batch_size, length, generator=generator) < 0.5, WRITE, READ)
        ops = torch.where(draw < self.p_ignore, IGNORE_OP, other)  # (B, n)
        ops[:, 0], ops[:, -1] = WRITE, READ
        data = torch.randint(0, 2, (batch_size, length), generator=generator)  # (B, n)
        written = torch.where(ops == WRITE, data, torch.full_like(data, -1))
        index = torch.arange(length).expand(batch_size, length)
        last_write = torch.where(written >= 0, index, torch.zeros_like(index)).cummax(dim=1).values
        data = torch.where(ops == READ, written.gather(1, last_write), data)
        seq = torch.stack((ops, data), dim=2).flatten(1)  # (B, 2n): op, bit, op, bit, ..
        answer = torch.zeros_like(seq, dtype=torch.bool)
        answer[:, 1::2] = ops == READ
        return seq, answer
