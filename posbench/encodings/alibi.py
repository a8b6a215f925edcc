"""ALiBi (Press et al. 2022): a per-head linear penalty on distance, no parameters."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from posbench.encodings import register_encoding
from posbench.encodings.base import PositionalEncoding, Span


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
    """ALiBi: bias[h, i, j] = -m_h (i - j), or -m_h |i - j| with ``symmetric`` (non-causal)."""

    relative = True

    def __init__(
        self,
        n_heads: int,
        d_head: int,
        causal: bool = True,
        n_layers: int = 1,
        *,
        symmetric: bool | None = None,
    ) -> None:
        super().__init__(n_heads, d_head, causal, n_layers)
        self.symmetric = (not causal) if symmetric is None else symmetric
        self.register_buffer("slopes", torch.tensor(alibi_slopes(n_heads)), persistent=False)

    def position_bias(self, q_span: Span, k_span: Span, layer: int, device: torch.device) -> Tensor:
        def build() -> Tensor:
            distance = self.relative_positions(q_span, k_span, device).float()  # (Lq, Lk)
            if self.symmetric:
                distance = distance.abs()
            return -self.slopes.to(device)[:, None, None] * distance  # (H, Lq, Lk)

        return self.cached(("alibi", q_span, k_span, str(device)), build)
