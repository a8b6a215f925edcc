"""Causal attention with a band bias through posbench's C++ kernel (posbench.kernels.native):
softmax(scale * q k^T + bias) v with bias[b, h, i, j] = band[b, h, i, j - i + W - 1] for
i - W < j <= i and 0 further back, the layout of a BandBias (T5, DeBERTa). A per-distance
bias (a ToeplitzBias: KERPLE) is the band with W = L and one row.

The kernel forms each block of query rows' scores with the band added, its exact softmax and
its product with v; the backward pass forms P and dS again for the same blocks and reads dq,
dk, dv and the band's gradient off them. Only q, k, v, the output, the log-sum-exp and the
band are kept: nothing of size L x L."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels import native


class _FusedBandAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, q: Tensor, k: Tensor, v: Tensor, band: Tensor, scale: float
    ) -> Tensor:
        kernel = native.band_flash()
        out, lse = kernel.forward(q, k, v, band, scale)
        ctx.save_for_backward(q, k, v, band, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, band, out, lse = ctx.saved_tensors
        dq, dk, dv, dband = native.band_flash().backward(
            grad_out.contiguous(), q, k, v, out, lse, band, ctx.scale, ctx.needs_input_grad[3]
        )
        return dq, dk, dv, dband if ctx.needs_input_grad[3] else None, None


def fused_band_attention(q: Tensor, k: Tensor, v: Tensor, band: Tensor, scale: float) -> Tensor:
    """Causal attention for q, k, v (B, H, L, d) on the CPU with the bias
    band[b, h, i, j - i + W - 1] for i - W < j <= i and 0 beyond; band (B|1, H|1, L|1, W).
    Columns of a band wider than L that no key reaches are dropped. Needs
    ``native.band_flash()``."""
    B, H, L, _ = q.shape
    band = band[..., -L:]  # columns W - L .. W - 1: distances L - 1 .. 0
    rows = band.shape[2]
    band = band.expand(band.shape[0] if band.shape[0] == B else 1, H, rows, band.shape[-1])
    return _FusedBandAttention.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), band.contiguous(), scale
    )


def causal_band(values: Tensor, q_len: int, k_len: int) -> Tensor:
    """A ToeplitzBias's values (H|1, Lq + Lk - 1), ordered by i - j ascending, for square
    causal scores (Lq = Lk = L) as a band (1, H|1, 1, L): column L - 1 - δ holds distance δ."""
    assert q_len == k_len, "a causal band needs square scores"
    return values[:, k_len - 1 :].flip(-1)[None, :, None, :]
