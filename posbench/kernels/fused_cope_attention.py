"""CoPE's causal attention through posbench's C++ kernel (posbench.kernels.native,
csrc/cope_flash.cpp): each block of query rows' content logits, gates, positions, interpolated
position logits and exact softmax in one pass, formed again in the backward pass, which reads
dq, dk, dv and the position table's gradient off them. Only q, k, v, the table, the output and
the log-sum-exp are kept: nothing of size L x L."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels import native, served


@torch.library.custom_op("posbench::cope_attention", mutates_args=())
def cope_attention_op(
    q: Tensor, k: Tensor, v: Tensor, table: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """(out, lse): the C++ CoPE kernel's forward pass as a torch operator."""
    out, lse = native.cope_flash().forward(q, k, v, table, scale)
    return out, lse


@cope_attention_op.register_fake
def _cope_attention_shapes(q, k, v, table, scale):  # type: ignore[no-untyped-def]
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1])


@torch.library.custom_op("posbench::cope_attention_backward", mutates_args=())
def cope_attention_backward_op(
    grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, table: Tensor, out: Tensor, lse: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv, dtable): the C++ CoPE kernel's backward pass as a torch operator."""
    dq, dk, dv, dtable = native.cope_flash().backward(grad_out, q, k, v, table, out, lse, scale)
    return dq, dk, dv, dtable


@cope_attention_backward_op.register_fake
def _cope_attention_backward_shapes(grad_out, q, k, v, table, out, lse, scale):  # type: ignore
    return tuple(torch.empty_like(t) for t in (q, k, v, table))


def _save_for_backward(ctx, inputs: tuple, output: tuple) -> None:  # type: ignore[no-untyped-def]
    q, k, v, table, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, table, out, lse)
    ctx.scale = scale


def _backward(ctx, grad_out: Tensor, _grad_lse: Tensor):  # type: ignore[no-untyped-def]
    """The inputs' gradients from the output's (lse takes none)."""
    q, k, v, table, out, lse = ctx.saved_tensors
    dq, dk, dv, dtable = cope_attention_backward_op(
        grad_out.contiguous(), q, k, v, table, out, lse, ctx.scale
    )
    return dq, dk, dv, dtable, None


cope_attention_op.register_autograd(_backward, setup_context=_save_for_backward)


def fused_cope_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, scale: float) -> Tensor:
    """CoPE's causal attention for q, k, v (B, H, L, d), each query at the last of its keys,
    with the position table (d, npos) shared by the heads, on the CPU. Needs
    ``native.cope_flash()``."""
    served.note(served.CPP_COPE)
    out, _ = cope_attention_op(
        q.contiguous(), k.contiguous(), v.contiguous(), table.contiguous(), scale
    )
    return out


def cope_fused_applies(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> bool:
    """Whether CoPE's attention of q (B, H, Lq, d) against k and v runs through the C++ kernel:
    causal square scores on the CPU in float32 or float64, v as wide as q, and the kernel built
    here."""
    return (
        causal
        and native.serves(q)
        and q.shape == k.shape == v.shape
        and native.built("cope_flash")
    )
