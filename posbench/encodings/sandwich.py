"""Sandwich (Chi et al. 2023): a parameter-free bias from the inner product of sinusoidal
position embeddings; NVIDIA NeMo's sandwich_relative_position_embedding.py."""

from __future__ import annotations

from typing import Annotated, Optional

import torch
from torch import Tensor

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.validation import Range


@register_encoding("sandwich")
class Sandwich(PositionalEncoding):
    """Sandwich (Chi et al. 2023; NeMo): bias = (sum_k cos(|i - j| w_k) - d'/2) / (8h / H), w_k =
    10000^(-2k/d').

    k runs 1..d'/2 (NeMo's inv_freq starts at k = 1), h = 1..H scales each head's bias like
    ALiBi's slopes; d' (``dim``, default the head size, as NeMo passes it) sets how many
    frequencies the sum has. The sum is d'/2 at distance 0 and falls with distance, so the bias
    is 0 on the diagonal and negative further back. No parameters: read from a per-distance table.
    """

    relative = True

    def __init__(
        self, shape: AttentionShape, *, dim: Annotated[Optional[int], Range(ge=2)] = None
    ) -> None:
        super().__init__(shape)
        self.dim = dim or shape.d_head

    def bias_of(self, distance: Tensor) -> Tensor:
        """The bias of each distance i - j (n,) for every head, (n, H); computed in float64
        only when the kept table is built."""
        H, device = self.n_heads, distance.device
        k = torch.arange(1, self.dim // 2 + 1, device=device, dtype=torch.float64)
        inv_freq = 1.0 / 10000 ** (2 * k / self.dim)  # (d'/2,)
        head_scale = torch.arange(1, H + 1, device=device, dtype=torch.float64) * 8 / H  # (H,)
        total = torch.cos(distance.abs().double()[:, None] * inv_freq).sum(-1)  # (n,)
        return ((total - self.dim / 2)[:, None] / head_scale).float()

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor:
        return self.parameter_free_relative_bias(
            "sandwich", q_span, k_span, device, self.bias_of
        )  # (H, Lq, Lk)

    def distance_bias(self, lo: int, hi: int, layer: LayerContext, device: torch.device) -> Tensor:
        return self.distance_values("sandwich", lo, hi, device, self.bias_of).T  # (H, n)
