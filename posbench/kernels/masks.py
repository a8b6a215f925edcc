"""Attention masks, cached per shape and device."""

from __future__ import annotations

import torch
from torch import Tensor

_MASKS: dict[tuple[int, int, str], Tensor] = {}


def causal_mask(q_len: int, k_len: int, device: torch.device) -> Tensor:
    """Boolean (Lq, Lk) mask, True where query i (the last Lq of the keys) may attend key j."""
    key = (q_len, k_len, str(device))
    if key not in _MASKS:
        if len(_MASKS) > 64:
            _MASKS.clear()
        _MASKS[key] = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
    return _MASKS[key]
