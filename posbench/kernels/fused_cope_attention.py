"""CoPE's causal attention through posbench's C++ kernel (posbench.kernels.native,
csrc/cope_flash.cpp): each block of query rows' content logits, gates, positions, interpolated
position logits and exact softmax in one pass, formed again in the backward pass, which reads
dq, dk, dv and the position table's gradient off them. Only q, k, v, the table, the output and
the log-sum-exp are kept: nothing of size L x L."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels import native, served


class _FusedCopeAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, q: Tensor, k: Tensor, v: Tensor, table: Tensor, scale: float
    ) -> Tensor:
        out, lse = native.cope_flash().forward(q, k, v, table, scale)
        ctx.save_for_backward(q, k, v, table, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, table, out, lse = ctx.saved_tensors
        dq, dk, dv, dtable = native.cope_flash().backward(
            grad_out.contiguous(), q, k, v, table, out, lse, ctx.scale
        )
        return dq, dk, dv, dtable, None


def fused_cope_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, scale: float) -> Tensor:
    """CoPE's causal attention for q, k, v (B, H, L, d), each query at the last of its keys,
    with the position table (d, npos) shared by the heads, on the CPU. Needs
    ``native.cope_flash()``."""
    served.note(served.CPP_COPE)
    return _FusedCopeAttention.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), table.contiguous(), scale
    )


def cope_fused_applies(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> bool:
    """Whether CoPE's attention of q (B, H, Lq, d) against k and v runs through the C++ kernel:
    causal square scores on the CPU in float32 or float64, v as wide as q, and the kernel built
    here."""
    return (
        causal
        and native.serves(q)
        and q.shape == k.shape == v.shape
        and native.cope_flash() is not None
    )
