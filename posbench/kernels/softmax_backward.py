"""Operands that let one matrix product of a block of rows give what softmax's backward pass
needs, shared by the blocked backward passes (posbench.kernels.biased_attention,
posbench.kernels.rel_shift_attention)."""

from __future__ import annotations

import torch
from torch import Tensor


def with_ones(t: Tensor) -> Tensor:
    """t (..., n, m) with a column of ones appended, (..., n, m + 1)."""
    return torch.cat([t, t.new_ones(*t.shape[:-1], 1)], -1)


def softmax_backward_operands(grad_out: Tensor, out: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """[dO, -delta] (..., Lq, dv + 1) and [v, 1] (..., Lk, dv + 1), delta = rowsum(dO * O):
    one GEMM of a block of their rows gives dP - delta, the factor softmax's backward pass
    multiplies P by (dS = P * (dP - delta)), with no pass over the block to subtract delta."""
    delta = (grad_out * out).sum(-1, keepdim=True)  # (..., Lq, 1)
    return torch.cat([grad_out, -delta], -1), with_ones(v)
