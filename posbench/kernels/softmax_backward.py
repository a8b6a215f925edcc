"""Softmax attention's backward pass for one block of query rows, and the operands that let one
matrix product of the block give what it needs; shared by the blocked backward passes
(posbench.kernels.biased_attention, posbench.kernels.rel_shift_attention)."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels.probabilities import probabilities_


def with_ones(t: Tensor) -> Tensor:
    """t (..., n, m) with a column of ones appended, (..., n, m + 1)."""
    return torch.cat([t, t.new_ones(*t.shape[:-1], 1)], -1)


def softmax_backward_operands(grad_out: Tensor, out: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """[dO, -delta] (..., Lq, dv + 1) and [v, 1] (..., Lk, dv + 1), delta = rowsum(dO * O):
    one GEMM of a block of their rows gives dP - delta, the factor softmax's backward pass
    multiplies P by (dS = P * (dP - delta)), with no pass over the block to subtract delta."""
    delta = (grad_out * out).sum(-1, keepdim=True)  # (..., Lq, 1)
    return torch.cat([grad_out, -delta], -1), with_ones(v)


def block_gradients(
    scores: Tensor,
    grad_delta: Tensor,
    v_one: Tensor,
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    scale: float,
    dk: Tensor,
    dv: Tensor,
    ds_out: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One block of query rows against the keys they see. scores (..., rows, keys) holds the
    block's scale q . k + bias - logsumexp, masked pairs -inf, and is consumed; grad_delta
    (..., rows, dv + 1), grad_out (..., rows, dv) and q (..., rows, d) are the rows', v_one
    (..., keys, dv + 1) and k (..., keys, d) the keys'. Adds the block's share of the keys'
    gradients to dk and dv (..., keys, d) in place and returns dS = P * (dP - rowsum(dO * O))
    (written into ds_out when given, else into scores) and the rows' dq."""
    probs = probabilities_(scores)  # masked: 0
    dv += torch.matmul(probs.transpose(-1, -2), grad_out)
    dprobs = torch.matmul(grad_delta, v_one.transpose(-1, -2))  # dP - rowsum(dO * O)
    ds = probs.mul_(dprobs) if ds_out is None else torch.mul(probs, dprobs, out=ds_out)
    dk += torch.matmul(ds.transpose(-1, -2), q).mul_(scale)
    return ds, torch.matmul(ds, k).mul_(scale)
