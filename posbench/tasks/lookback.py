"""Lookback: name the token exactly `lag` positions back, a retrieval only position can solve."""

from __future__ import annotations

from typing import Annotated

import torch

from posbench.tasks.base import IGNORE, Batch, Task, random_symbols
from posbench.tasks.registry import register_task
from posbench.validation import Range


@register_task("lookback")
class Lookback(Task):
    """At every position t >= ``lag``, predict the token read at t - ``lag``.

    The input is a stream of ``lag + length`` symbols drawn uniformly and independently from
    ``n_symbols``; the target at position t is the input at t - ``lag`` (not the next token),
    so the length counts the scored positions. Because the stream is random, nothing in the
    content says where the answer is: only its distance does. Fed in segments shorter than
    ``lag`` through a cache, the answer always lies in the memory, so this is the task on
    which "the cache does not break" and "the model uses the cache" come apart: an encoding
    whose cached keys carry consistent relative positions answers wherever the memory
    reaches back ``lag`` tokens, and one that restarts absolute positions in every segment
    cannot tell a cached token from a current one. Chance is 1 / ``n_symbols``.

    The default lag, 12, lies inside the exact range of every built-in bucketed encoding (T5
    resolves single distances below 16 by default), so what the cache axis shows is cache use.
    An encoding whose bias is monotone in distance (ALiBi) or absent (NoPE) has no way to
    single out one distance when the content gives no hint, and is not expected to learn it.
    """

    default_train_lengths = (1, 12)
    default_eval_lengths = (6, 12, 24, 48)
    length_unit = "positions answered"
    answers_fed_back = False  # the answer at t is the token at t - lag, not the next input

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        lag: Annotated[int, Range(ge=1)] = 12,
        n_symbols: Annotated[int, Range(ge=2)] = 16,
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        self.lag = lag
        self.n_symbols = n_symbols

    @property
    def vocab_size(self) -> int:
        return self.n_symbols

    def sequence_length(self, length: int) -> int:
        return self.lag + length

    def batch(self, length: int, batch_size: int, generator: torch.Generator) -> Batch:
        tokens = random_symbols(
            batch_size, self.sequence_length(length), self.n_symbols, generator
        )  # (B, T)
        targets = torch.full_like(tokens, IGNORE)
        targets[:, self.lag :] = tokens[:, :length]  # position t answers the token at t - lag
        return Batch(tokens, targets)
