"""KERPLE (Chi et al. 2022): learned conditionally positive definite kernels of the distance,
as additive biases; chijames/KERPLE megatron/mpu/layers.py (ParallelKerpleLog,
ParallelKerplePower)."""

from __future__ import annotations

from typing import Annotated, Callable

import torch
from torch import Tensor, nn

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.bias_kinds import ToeplitzBias
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
        "the learned bias is one value per head and distance, which posbench's C++ kernel adds "
        "block by block and whose gradient it sums per distance; without that kernel it never "
        "saturates, so the flash kernel reads it dense (H, L, L) and the backward pass forms dS "
        "at every pair"
    )
    #: The bias of each distance (...,) for every head, (H, ...): each kernel's own formula.
    kernel: Callable[[Tensor], Tensor]
    #: Largest p (power kernel only): the reference clamps p to (0, 2].
    max_power: float | None = None

    def __init__(self, shape: AttentionShape, *, eps: Annotated[float, Range(gt=0)] = EPS) -> None:
        super().__init__(shape)
        self.eps = eps
        self.a = nn.Parameter(torch.rand(shape.n_heads) * 1.0)  # (H,)
        self.p = nn.Parameter(torch.rand(shape.n_heads) * 2.0)  # (H,)

    def distances(self, relative: Tensor) -> Tensor:
        """|i - j| from i - j (causal: i - j, 0 for future keys), float."""
        return (relative.clamp(min=0) if self.causal else relative.abs()).float()

    def parameters_clamped(self) -> tuple[Tensor, Tensor]:
        """a and p per head, (H,), as the kernel reads them."""
        a = self.a.clamp(min=self.eps)
        p = self.p.clamp(min=self.eps, max=self.max_power)
        return a, p

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor | ToeplitzBias:
        if not (q_span.contiguous and k_span.contiguous):  # drawn positions: not Toeplitz
            return self.kernel(self.distances(self.relative_positions(q_span, k_span, device)))
        # a function of i - j alone: once per distance, nearest (most negative) to farthest
        lo, hi = q_span.first - k_span.last, q_span.last - k_span.first
        per_distance = self.distance_bias(lo, hi, layer, device)
        return ToeplitzBias(per_distance, len(q_span), len(k_span))  # (H, Lq, Lk)

    def distance_bias(self, lo: int, hi: int, layer: LayerContext, device: torch.device) -> Tensor:
        return self.kernel(self.distances(torch.arange(lo, hi + 1, device=device)))  # (H, n)


@register_encoding("kerple_log")
class KerpleLog(_Kerple):
    """KERPLE-log (Chi et al. 2022): bias = -p * log(1 + a |i - j|), a and p learned per head."""

    def kernel(self, distance: Tensor) -> Tensor:
        a, p = (v.view(-1, *[1] * distance.dim()) for v in self.parameters_clamped())
        return -p * torch.log1p(a * distance)  # (H, ...)


@register_encoding("kerple_power")
class KerplePower(_Kerple):
    """KERPLE-power (Chi et al. 2022): bias = -a |i - j|^p, a and p learned per head, p <= 2."""

    max_power = 2.0

    def kernel(self, distance: Tensor) -> Tensor:
        a, p = (v.view(-1, *[1] * distance.dim()) for v in self.parameters_clamped())
        return -a * distance.pow(p)  # (H, ...)
