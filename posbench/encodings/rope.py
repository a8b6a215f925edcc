"""Rotary position embedding (Su et al. 2021), half-split pairing as in HF Llama."""
from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.encodings.registry import register_encoding
from posbench.errors import OptionError
from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.tables import sinusoid
from posbench.validation import Range


def rotate_half(x: Tensor) -> Tensor:
    """cat(-x2, x1) for x = cat(x1, x2) along the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@register_encoding("rope")
class RoPE(PositionalEncoding):
    """Rotary: q and k rotated by angle p * base^(-2k/d), pairs (k, k + d/2) (half-split).

    GPT-J/NeoX pair (2k, 2k+1) instead: a fixed permutation of the same rotation.
    ``interpolation`` divides positions by a factor (linear position interpolation).
    Keys are rotated by their absolute positions before they are cached.
    """

    relative = True

    def __init__(
        self,
        shape: AttentionShape,
        *,
        base: Annotated[float, Range(gt=1)] = 10000.0,
        interpolation: Annotated[float, Range(gt=0)] = 1.0,
    ) -> None:
        super().__init__(shape)
        if shape.d_head % 2:
            raise OptionError(
                f"encoding 'rope' rotates pairs of dimensions and needs an even head size, got "
                f"d_head={shape.d_head}; choose d_model and n_heads with an even d_model / n_heads."
            )
        self.base = base
        self.interpolation = interpolation

    def cos_sin(self, span: Span, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos and sin for `span`, each (L, d_head), repeated over both halves."""

        def build(n: int) -> Tensor:
            positions = torch.arange(n, device=device, dtype=torch.float64) / self.interpolation
            sin, cos = sinusoid(positions, self.d_head, self.base)
            return torch.stack((cos.repeat(1, 2), sin.repeat(1, 2)), dim=1)  # (n, 2, d_head)

        table = self.position_table("cos_sin", span.stop, device, build)[span.start :]
        return table[:, 0], table[:, 1]

    def rotate(self, q: Tensor, k: Tensor, span: Span, layer: LayerContext) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(span, q.device)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
