"""Softmax attention's backward pass one block of query rows at a time, for the kernels that add
their own bias to each block's scores and need dS (posbench.kernels.biased_attention,
posbench.kernels.rel_shift_attention)."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels.probabilities import probabilities_


def _with_ones(t: Tensor) -> Tensor:
    """t (..., n, m) with a column of ones appended, (..., n, m + 1)."""
    return torch.cat([t, t.new_ones(*t.shape[:-1], 1)], -1)


class BlockedSoftmaxBackward:
    """The operands and gradients of a blocked backward pass over q, k, v (..., L, d) with the
    forward pass's out and logsumexp. Each block's scores and dP - rowsum(dO * O) are one GEMM
    each: [scale q, -lse] . [k, 1] and [dO, -delta] . [v, 1], with no pass over the block to
    subtract lse or delta. A kernel asks ``scores`` for a block, adds its bias and masks, and
    hands the result to ``gradients``, which fills dq, dk and dv and returns dS."""

    def __init__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        grad_out: Tensor,
        scale: float,
    ) -> None:
        self.q, self.k, self.grad_out, self.scale = q, k, grad_out, scale
        self.q_lse = torch.cat([q * scale, -lse[..., None]], -1)  # (..., Lq, d + 1)
        self.k_one = _with_ones(k)  # (..., Lk, d + 1)
        delta = (grad_out * out).sum(-1, keepdim=True)  # (..., Lq, 1)
        self.grad_delta = torch.cat([grad_out, -delta], -1)  # (..., Lq, dv + 1)
        self.v_one = _with_ones(v)  # (..., Lk, dv + 1)
        self.dq = torch.empty_like(q)  # every row block written
        self.dk, self.dv = torch.zeros_like(k), torch.zeros_like(v)  # accumulated over blocks

    def scores(self, r0: int, r1: int, keys: int) -> Tensor:
        """scale q . k - logsumexp of query rows r0..r1-1 against keys 0..keys-1,
        (..., rows, keys)."""
        return torch.matmul(self.q_lse[..., r0:r1, :], self.k_one[..., :keys, :].transpose(-1, -2))

    def gradients(self, scores: Tensor, r0: int, r1: int, ds_out: Tensor | None = None) -> Tensor:
        """Takes the block's scores plus its bias, masked pairs -inf (consumed), adds the
        block's share to dk and dv and writes its rows of dq; returns dS = P * (dP -
        rowsum(dO * O)) (..., rows, keys), written into ds_out when given, else into scores."""
        keys = scores.shape[-1]
        q, k = self.q[..., r0:r1, :], self.k[..., :keys, :]
        probs = probabilities_(scores)  # masked: 0
        self.dv[..., :keys, :] += torch.matmul(
            probs.transpose(-1, -2), self.grad_out[..., r0:r1, :]
        )
        dprobs = torch.matmul(
            self.grad_delta[..., r0:r1, :], self.v_one[..., :keys, :].transpose(-1, -2)
        )  # dP - rowsum(dO * O)
        ds = probs.mul_(dprobs) if ds_out is None else torch.mul(probs, dprobs, out=ds_out)
        self.dq[..., r0:r1, :] = torch.matmul(ds, k).mul_(self.scale)
        self.dk[..., :keys, :] += torch.matmul(ds.transpose(-1, -2), q).mul_(self.scale)
        return ds
