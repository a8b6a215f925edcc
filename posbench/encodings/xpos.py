"""xPos (Sun et al. 2023): rotary with a per-dimension exponential decay; microsoft/torchscale,
torchscale/component/xpos_relative_position.py."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.errors import OptionError
from posbench.validation import Range


def rotate_every_two(x: Tensor) -> Tensor:
    """(-x_1, x_0, -x_3, x_2, ..): the rotation of interleaved pairs (2k, 2k+1)."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


@register_encoding("xpos")
class XPos(PositionalEncoding):
    """xPos (Sun et al. 2023; torchscale): q at position n is rotated like RoPE and scaled by
    zeta_k^(n/gamma), k at m by
    zeta_k^(-m/gamma), so q . k carries zeta_k^((n - m)/gamma): a decay with distance.

    zeta_k = (2k + 0.4 d) / (1.4 d) for the k-th pair, gamma = ``scale_base`` (512), pairs
    interleaved (2k, 2k+1) and theta_k = 10000^(-2k/d) as torchscale. torchscale centres the
    exponents on the middle of the sequence to keep half precision in range; centring cancels
    in q . k, so posbench uses absolute positions, which keeps cached keys exact.
    """

    relative = True

    def __init__(
        self, shape: AttentionShape, *, scale_base: Annotated[float, Range(gt=0)] = 512.0
    ) -> None:
        super().__init__(shape)
        if shape.d_head % 2:
            raise OptionError(
                f"encoding 'xpos' rotates pairs of dimensions and needs an even head size, got "
                f"d_head={shape.d_head}; choose d_model and n_heads with an even d_model / n_heads."
            )
        self.scale_base = scale_base

    def tables(self, span: Span, device: torch.device) -> Tensor:
        """(L, 3, d_head): cos, sin and the decay zeta^(p/gamma), each repeated over a pair."""
        d = self.d_head

        def build(n: int) -> Tensor:
            positions = torch.arange(n, dtype=torch.float64)[:, None]
            pair = torch.arange(0, d, 2, dtype=torch.float64)
            angles = positions * 10000.0 ** (-pair / d)  # (n, d/2)
            decay = ((pair + 0.4 * d) / (1.4 * d)) ** (positions / self.scale_base)  # (n, d/2)
            table = torch.stack((angles.cos(), angles.sin(), decay), dim=1)  # (n, 3, d/2)
            return table.repeat_interleave(2, dim=-1).float().to(device)

        return self.position_rows("xpos", span, device, build)

    def rotate(
        self, q: Tensor, k: Tensor, span: Span, layer: LayerContext
    ) -> tuple[Tensor, Tensor]:
        table = self.tables(span, q.device).to(q.dtype)
        cos, sin, decay = table[:, 0], table[:, 1], table[:, 2]  # (L, d) each
        return (q * cos + rotate_every_two(q) * sin) * decay, (
            k * cos + rotate_every_two(k) * sin
        ) / decay
