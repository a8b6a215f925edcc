"""ALiBi (Press et al. 2022): a per-head linear penalty on distance, no parameters."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posbench.encodings.registry import register_encoding
from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span


def alibi_slopes(n_heads: int) -> list[float]:
    """The paper's slopes: 2^(-8(h+1)/H) for a power-of-two H; otherwise the slopes of the
    nearest lower power of two c, then every other slope of 2c, the first H - c of them."""

    def power_of_two(n: int) -> list[float]:
        return [2 ** (-8 * (h + 1) / n) for h in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + power_of_two(2 * closest)[0::2][: n_heads - closest]


@register_encoding("alibi")
class ALiBi(PositionalEncoding):
    """ALiBi: bias[h, i, j] = -m_h (i - j), or -m_h |i - j| with ``symmetric`` (non-causal).

    The bias is read from a per-distance table (Lq + Lk - 1 values per head) that grows by
    doubling. posbench's C++ kernel reads that table itself (``distance_bias``); elsewhere it
    is expanded to the (Lq, Lk) Toeplitz matrix, and since it needs no gradient, causal
    attention keeps the flash kernel's causal block skipping (see biased_attention)."""

    relative = True

    def __init__(
        self,
        shape: AttentionShape,
        *,
        symmetric: bool | None = None,
    ) -> None:
        super().__init__(shape)
        self.symmetric = (not shape.causal) if symmetric is None else symmetric
        self.register_buffer("slopes", torch.tensor(alibi_slopes(shape.n_heads)), persistent=False)

    def penalty(self, distance: Tensor) -> Tensor:
        """-m_h (i - j), or -m_h |i - j| when symmetric, for distances (n,) -> (n, H)."""
        distance = distance.abs() if self.symmetric else distance
        return -self.slopes.to(distance.device) * distance.float()[:, None]

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor:
        return self.parameter_free_relative_bias(
            "penalty", q_span, k_span, device, self.penalty
        )  # (H, Lq, Lk)

    def distance_bias(self, lo: int, hi: int, layer: LayerContext, device: torch.device) -> Tensor:
        return self.distance_values("penalty", lo, hi, device, self.penalty).T  # (H, n)
