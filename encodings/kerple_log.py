"""KERPLE-log (Chi et al. 2022) as a local plugin, written exactly as a user would write one.

Drop a file like this into a plugin folder (this repository's `encodings/`, a folder named in
`[tool.posbench] plugin-dirs`, or `--plugins DIR`) and posbench picks it up: no edit to
posbench itself.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.functional import softplus

from posbench import AttentionShape, PositionalEncoding, Span, register_encoding


@register_encoding("kerple_log")
class KerpleLog(PositionalEncoding):
    """KERPLE-log: a learned logarithmic distance penalty, bias = -r1 * log(1 + r2 |i - j|).

    r1, r2 > 0 per head (kept positive through softplus), initialised so that heads start
    with different reaches, like ALiBi's slopes but learned and logarithmic.
    """

    relative = True

    def __init__(self, shape: AttentionShape) -> None:
        super().__init__(shape)
        reach = torch.logspace(0, -2, shape.n_heads)  # (H,) from 1 down to 0.01
        self.raw_r1 = nn.Parameter(torch.log(torch.expm1(torch.ones(shape.n_heads))))
        self.raw_r2 = nn.Parameter(torch.log(torch.expm1(reach)))

    def position_bias(self, q_span: Span, k_span: Span, layer: int, device: torch.device) -> Tensor:
        distance = self.relative_positions(q_span, k_span, device).abs().float()  # (Lq, Lk)
        r1 = softplus(self.raw_r1)[:, None, None]  # (H, 1, 1)
        r2 = softplus(self.raw_r2)[:, None, None]
        return -r1 * torch.log1p(r2 * distance)  # (H, Lq, Lk)
