"""Positions as spans of absolute integers: a continuation through a cache is just a later span."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Span:
    """Contiguous absolute positions ``start, start+1, ..., stop-1``."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def arange(self, device: torch.device | str | None = None) -> Tensor:
        return torch.arange(self.start, self.stop, device=device)
