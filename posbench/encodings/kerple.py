"""KERPLE (Chi et al. 2022): learned conditionally positive definite kernels of the distance,
as additive biases; chijames/KERPLE megatron/mpu/layers.py (ParallelKerpleLog,
ParallelKerplePower)."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.validation import Range

#: The reference clamps both parameters of each head to at least this.
EPS = 1e-2


class _Kerple(PositionalEncoding):
    """Two learned numbers per head, a (reach) ~ U(0, 1) and p (shape) ~ U(0, 2) as the
    reference initialises them, read clamped to >= 0.01 (the reference clamps the stored
    values in place on every call; here the clamp is part of the computation, which gives the
    same bias and leaves the parameters untouched). Future keys (j > i) read distance 0 and
    are masked anyway; bidirectional attention uses |i - j|."""

    relative = True
    cost_note = (
        "the learned bias is recomputed densely every call (a log or a power "
        "per pair) and gets a gradient"
    )
    #: Largest p (power kernel only): the reference clamps p to (0, 2].
    max_power: float | None = None

    def __init__(self, shape: AttentionShape, *, eps: Annotated[float, Range(gt=0)] = EPS) -> None:
        super().__init__(shape)
        self.eps = eps
        self.a = nn.Parameter(torch.rand(shape.n_heads) * 1.0)  # (H,)
        self.p = nn.Parameter(torch.rand(shape.n_heads) * 2.0)  # (H,)

    def distances(self, q_span: Span, k_span: Span, device: torch.device) -> Tensor:
        """|i - j| (causal: i - j, 0 for future keys), (Lq, Lk) float."""
        rel = self.relative_positions(q_span, k_span, device)
        return (rel.clamp(min=0) if self.causal else rel.abs()).float()

    def parameters_clamped(self) -> tuple[Tensor, Tensor]:
        """a and p per head, (H, 1, 1), as the kernel reads them."""
        a = self.a.clamp(min=self.eps)
        p = (
            self.p.clamp(min=self.eps, max=self.max_power)
            if self.max_power
            else self.p.clamp(min=self.eps)
        )
        return a[:, None, None], p[:, None, None]


@register_encoding("kerple_log")
class KerpleLog(_Kerple):
    """KERPLE-log (Chi et al. 2022): bias = -p * log(1 + a |i - j|), a and p learned per head."""

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor:
        a, p = self.parameters_clamped()
        return -p * torch.log1p(a * self.distances(q_span, k_span, device))  # (H, Lq, Lk)


@register_encoding("kerple_power")
class KerplePower(_Kerple):
    """KERPLE-power (Chi et al. 2022): bias = -a |i - j|^p, a and p learned per head, p <= 2."""

    max_power = 2.0

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor:
        a, p = self.parameters_clamped()
        return -a * self.distances(q_span, k_span, device).pow(p)  # (H, Lq, Lk)
