"""The memory of a decoder: detached keys and values of the positions seen so far."""
from __future__ import annotations

import torch
from torch import Tensor

from posbench.encodings.base import Span


class Cache:
    """Per-layer key/value memory, Transformer-XL style.

    ``seen`` counts every position ever fed, also those no longer held, so a continuation
    always gets its true absolute positions. With ``mem_len`` set only the newest ``mem_len``
    positions are kept (``mem_len=0`` keeps none yet positions keep counting); ``None`` keeps
    all. Stored tensors are detached: gradients stop at the memory.
    """

    def __init__(self, n_layers: int, mem_len: int | None = None) -> None:
        if mem_len is not None and mem_len < 0:
            raise ValueError(f"mem_len must be >= 0 or None, got {mem_len}")
        self.mem_len = mem_len
        self.seen = 0
        self.keys: list[Tensor | None] = [None] * n_layers
        self.values: list[Tensor | None] = [None] * n_layers

    def span_for(self, new_tokens: int) -> Span:
        """Absolute positions of the next `new_tokens` tokens."""
        return Span(self.seen, self.seen + new_tokens)

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Span]:
        """Keys and values to attend to (memory then new), (B, H, M + L, d), with their
        positions; stores the newest. ``seen`` advances only after all layers have run, so
        every layer of one forward pass sees the same positions."""
        mem_k, mem_v = self.keys[layer], self.values[layer]
        if mem_k is not None:
            k_all, v_all = torch.cat((mem_k, k), dim=2), torch.cat((mem_v, v), dim=2)
        else:
            k_all, v_all = k, v
        span = Span(self.seen + k.shape[2] - k_all.shape[2], self.seen + k.shape[2])
        keep = k_all.shape[2] if self.mem_len is None else min(self.mem_len, k_all.shape[2])
        self.keys[layer] = k_all[:, :, k_all.shape[2] - keep :].detach()
        self.values[layer] = v_all[:, :, v_all.shape[2] - keep :].detach()
        return k_all, v_all, span

    def advance(self, new_tokens: int) -> None:
        """Count `new_tokens` more positions as seen (after all layers have run)."""
        self.seen += new_tokens
