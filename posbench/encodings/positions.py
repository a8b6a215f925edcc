"""Positions as spans of absolute integers: a continuation through a cache is just a later span.

A span names tokens ``start .. stop - 1`` of a stream. Their positions are those same integers
unless the stream was placed elsewhere (randomized positions draw a sorted sample from a wider
range): then the span carries them explicitly, strictly increasing, one per token, so causal
order and the cache stay in token order while encodings read the drawn positions.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Iterator

import torch
from torch import Tensor

from posbench.errors import OptionError, PositionOutOfRangeError
from posbench.validation import OneOf, Range


@dataclass(frozen=True)
class Span:
    """Tokens ``start .. stop - 1`` of a stream; their positions are the same integers, or
    ``positions`` (a strictly increasing int64 CPU tensor, one per token) when given."""

    start: int
    stop: int
    positions: Tensor | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.positions is not None and self.positions.shape != (self.stop - self.start,):
            raise ValueError(
                f"a span of {self.stop - self.start} tokens got {tuple(self.positions.shape)} "
                "positions"
            )

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def contiguous(self) -> bool:
        """True when the positions are ``start .. stop - 1`` (what the fast paths rely on)."""
        return self.positions is None

    @property
    def first(self) -> int:
        """Position of the first token."""
        return self.start if self.positions is None else int(self.positions[0])

    @property
    def last(self) -> int:
        """Position of the last token."""
        return self.stop - 1 if self.positions is None else int(self.positions[-1])

    def arange(self, device: torch.device | str | None = None) -> Tensor:
        """The positions, (L,) int64."""
        if self.positions is not None:
            return self.positions.to(device)
        return torch.arange(self.start, self.stop, device=device)

    def same_positions(self, other: Span) -> bool:
        """Whether `other` holds the same tokens at the same positions (``==`` compares the
        tokens only): square self-attention scores, at plain or drawn positions."""
        if self != other:
            return False
        return self.positions is other.positions or torch.equal(self.arange(), other.arange())

    def band(self, width: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """For square causal scores kept in a band of `width` keys (a BandBias): the key of
        each (row i, column c), i - width + 1 + c clamped at 0 (the band kernel masks keys
        before the first), and its distance p_i - p_key, each (L, width)."""
        rows = torch.arange(len(self), device=device)[:, None]
        keys = (rows - (width - 1) + torch.arange(width, device=device)).clamp(min=0)
        positions = self.arange(device)
        return keys, positions[:, None] - positions[keys]


@dataclass(frozen=True)
class RandomPositions:
    """Randomized positions (Ruoss et al. 2023): a stream of n tokens gets n distinct positions
    drawn uniformly from 0..max_position - 1, sorted, so a model trained on short streams has
    met every position and distance up to max_position and longer streams at test time read
    nothing new. Causal order is the tokens' order, which the sorted draw keeps.

    Draws come from torch's global generator: training seeds it per run and evaluation forks it
    per length, so every draw is reproducible from the run's seed."""

    max_position: int
    #: Draw at evaluation too (their code draws on every call); False evaluates at 0..n-1.
    at_evaluation: bool = True

    def draw(self, n: int) -> Tensor:
        """Sorted distinct positions for n tokens, (n,) int64 on the CPU."""
        if n > self.max_position:
            raise PositionOutOfRangeError(
                f"randomized positions place at most {self.max_position} tokens (distinct "
                "positions "
                f"0..{self.max_position - 1}), got {n}; raise randomize_positions or use shorter "
                "sequences."
            )
        return torch.randperm(self.max_position)[:n].sort().values


#: The largest randomize_positions: each draw permutes 0..M-1 (8 MiB at this bound), and
#: Ruoss et al. draw from a few thousand positions.
MAX_RANDOM_POSITIONS = 2**20


def random_positions_from(
    *,
    randomize_positions: Annotated[int | None, Range(ge=2, le=MAX_RANDOM_POSITIONS)] = None,
    eval_positions: Annotated[str, OneOf(("random", "plain"))] = "random",
) -> RandomPositions | None:
    """The options every encoding accepts for randomized positions: ``randomize_positions = M``
    draws each stream's positions from 0..M-1; ``eval_positions`` says whether evaluation
    draws them too ("random", as Ruoss et al.'s code does) or reads 0..n-1 ("plain")."""
    if randomize_positions is None:
        if eval_positions != "random":
            raise OptionError(
                "eval_positions chooses how randomized positions evaluate and needs "
                "randomize_positions = M as well; add it or drop eval_positions."
            )
        return None
    return RandomPositions(randomize_positions, at_evaluation=eval_positions == "random")


@contextmanager
def seeded_draws(seed: int) -> Iterator[None]:
    """Draws of randomized positions from a generator state of their own: inside, a function
    of `seed` alone; outside, the caller's state (training's) untouched. Evaluation and probes
    read under it, so they are reproducible and never change what training draws next."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
