"""ALiBi (Press et al. 2022): a per-head linear penalty on distance, no parameters."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from posbench.encodings import register_encoding
from posbench.encodings.base import LayerContext, PositionalEncoding, Span


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

    The causal form is folded into q and k (see ``rotate``); the symmetric form is a static
    bias read from a per-distance table."""

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

    def rotate(self, q: Tensor, k: Tensor, span: Span, layer: LayerContext) -> tuple[Tensor, Tensor]:
        """Causal ALiBi folded into the dot product: -m(i - j) and +m j differ by a constant per
        query row, which softmax ignores (the paper's code adds m j too). Appending sqrt(d) to
        q and m_h j to k adds m_h j to the scaled logits, so attention keeps the fused causal
        path and cached keys carry their own term: nothing is rebuilt per decoding step."""
        if self.symmetric:
            return q, k
        B, H, L, _ = q.shape
        q_extra = q.new_full((B, H, L, 1), math.sqrt(self.d_head))
        positions = span.arange(k.device).to(torch.float64)
        k_extra = (self.slopes.to(k.device, torch.float64)[:, None] * positions[None, :]).to(k.dtype)  # (H, L)
        return torch.cat((q, q_extra), dim=-1), torch.cat((k, k_extra[None, :, :, None].expand(B, H, L, 1)), dim=-1)

    def position_bias(self, q_span: Span, k_span: Span, layer: int, device: torch.device) -> Tensor | None:
        if not self.symmetric:
            return None  # folded into q and k by rotate
        slopes = self.slopes.to(device)
        bias = self.distance_lookup("bias", q_span, k_span, device, lambda d: -slopes * d.abs().float()[:, None])
        return bias.permute(2, 0, 1)  # (H, Lq, Lk)
