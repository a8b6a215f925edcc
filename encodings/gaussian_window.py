"""A Gaussian distance window as a local plugin, written exactly as a user would write one.

Drop a file like this into a plugin folder (this repository's `encodings/`, a folder named in
`[tool.posbench] plugin-dirs`, or `--plugins DIR`) and posbench picks it up: no edit to
posbench itself.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.functional import softplus

from posbench import AttentionShape, LayerContext, PositionalEncoding, Span, register_encoding


@register_encoding("gaussian_window")
class GaussianWindow(PositionalEncoding):
    """A learned Gaussian window over distance: bias = -((i - j) / w_h)^2, one width per head.

    Widths start spread from 1 to 64 tokens (log-spaced, kept positive through softplus), so
    heads begin with different reaches, like ALiBi's slopes but learned and quadratic.
    """

    relative = True

    def __init__(self, shape: AttentionShape) -> None:
        super().__init__(shape)
        widths = torch.logspace(0, 6, shape.n_heads, base=2.0)  # (H,) from 1 to 64
        self.raw_width = nn.Parameter(torch.log(torch.expm1(widths)))

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor:
        distance = self.relative_positions(q_span, k_span, device).float()  # (Lq, Lk)
        width = softplus(self.raw_width)[:, None, None]  # (H, 1, 1)
        return -((distance / width) ** 2)  # (H, Lq, Lk)
