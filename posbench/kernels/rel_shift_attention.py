"""Causal attention whose bias is a query's dot product with a per-distance table (Transformer-XL's
position terms): logits = scale * q k^T + bias, bias[b, h, i, j] = a[b, h, i] . r[h, i - j] for
j <= i, computed one block of query rows at a time and never whole. The queries are the last Lq
of the Lk keys (Lq = Lk, or a segment after its memory).

For a block of rows whose last query is key n - 1 the keys are 0..n - 1, at distances up to
n - 1, so one product y = a_rows r_rev^T over those distances (r_rev: the table in reverse
order) holds every bias of the block, each row shifted by one: the bias is a skewed strided view
of y (Transformer-XL's "relative shift", without its padded copy). The forward pass runs the CPU
flash kernel on each block with that bias as its mask; the backward pass forms each block's
probabilities again from the saved log-sum-exp, as posbench.kernels.biased_attention does, and
writes the block's dS where the skewed view reads it, so the gradients of a and r are two more
products per block. Memory grows with L x block rows, not L^2."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels import flash_ops
from posbench.kernels.masks import causal_mask
from posbench.kernels.row_block_attention import row_blocks
from posbench.kernels.softmax_backward import BlockedSoftmaxBackward


def _skewed(y: Tensor, rows: int, keys: int, row_stride: int) -> Tensor:
    """The bias (H, B, rows, keys) of a block from y (H, B, rows, ...) whose row a holds
    distance keys - 1 - m at column m, a row stride apart: bias[a, j] = y[a, rows - 1 - a + j]."""
    H, B = y.shape[:2]
    return y.as_strided(
        (H, B, rows, keys),
        (y.stride(0), y.stride(1), row_stride - 1, 1),
        y.storage_offset() + rows - 1,
    )


def _block_bias(a_rows: Tensor, r_rev: Tensor, keys: int) -> Tensor:
    """y (H, B, rows, keys) = a_rows (H, B, rows, d) against the table's first `keys` distances
    in reverse order, r_rev[:, -keys:] (H, keys, d)."""
    H, B, rows, d = a_rows.shape
    y = torch.bmm(a_rows.reshape(H, B * rows, d), r_rev[:, -keys:].transpose(1, 2))
    return y.view(H, B, rows, keys)


class _RelShiftAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, q: Tensor, k: Tensor, v: Tensor, a: Tensor, r_rev: Tensor, scale: float
    ) -> Tensor:
        """q, a (H, B, Lq, d) and k, v (H, B, Lk, d) (heads first); r_rev (H, Lk, d), distance
        Lk - 1 first."""
        H, B, q_len, _ = q.shape
        k_len = k.shape[2]
        out = torch.empty_like(q)
        lse = q.new_empty(H, B, q_len)
        for r0, r1, keys, allowed in row_blocks(q, k_len, causal_mask(q_len, k_len, q.device)):
            rows = r1 - r0
            y = _block_bias(a[:, :, r0:r1], r_rev, keys)
            mask = _skewed(y, rows, keys, keys).contiguous()  # (H, B, rows, keys)
            # the future keys of the block's rows all lie in its last `rows` columns
            mask[..., keys - rows :].masked_fill_(~allowed[:, keys - rows :], float("-inf"))
            block_out, block_lse = flash_ops.forward(
                q[:, :, r0:r1], k[:, :, :keys], v[:, :, :keys], False, mask, scale
            )
            out[:, :, r0:r1], lse[:, :, r0:r1] = block_out, block_lse
        ctx.save_for_backward(q, k, v, a, r_rev, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, a, r_rev, out, lse = ctx.saved_tensors
        scale, (H, B, q_len, d), k_len = ctx.scale, q.shape, k.shape[2]
        grad_out = grad_out.contiguous()
        blocks = BlockedSoftmaxBackward(q, k, v, out, lse, grad_out, scale)
        da = torch.empty_like(a)  # every row block written
        dr_rev = torch.zeros_like(r_rev)  # accumulated over row blocks
        for r0, r1, keys, allowed in row_blocks(q, k_len, causal_mask(q_len, k_len, q.device)):
            rows = r1 - r0
            scores = blocks.scores(r0, r1, keys)  # (H, B, rows, keys): scale q . k - lse
            scores += _skewed(_block_bias(a[:, :, r0:r1], r_rev, keys), rows, keys, keys)
            scores[..., keys - rows :].masked_fill_(~allowed[:, keys - rows :], float("-inf"))
            # dS lands in a buffer whose skewed view is dy, the gradient of the block's y:
            # row a at column rows - 1 + j, zeros before, and rows + 1 spare elements per (h, b)
            # so that (b, a) merge into one dimension of dy
            width = keys + rows - 1
            buffer = q.new_empty(H, B, rows * (width + 1))
            padded = buffer[..., : rows * width].view(H, B, rows, width)
            padded[..., : rows - 1] = 0.0
            blocks.gradients(scores, r0, r1, ds_out=padded[..., rows - 1 :])  # dS, future 0
            # dy[a, m] = dS[a, m + a - (rows - 1)] = padded[a, m + a]: a row stride of width + 1
            dy = padded.as_strided(
                (H, B, rows, keys), (*padded.stride()[:2], width + 1, 1), padded.storage_offset()
            ).view(H, B * rows, keys)
            da[:, :, r0:r1] = torch.bmm(dy, r_rev[:, -keys:]).view(H, B, rows, d)
            a_rows = a[:, :, r0:r1].reshape(H, B * rows, d)
            dr_rev[:, k_len - keys :] += torch.bmm(dy.transpose(1, 2), a_rows)
        return blocks.dq, blocks.dk, blocks.dv, da, dr_rev, None


def rel_shift_attention(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, table: Tensor, scale: float
) -> Tensor:
    """Causal softmax(scale * q k^T + bias) v on the CPU for q, a (B, H, Lq, d), k, v (B, H, Lk,
    d), the queries the last Lq keys, and a per-distance table (H, Lk, d) of distances
    0..Lk - 1: bias[b, h, i, j] = a_i . table[h, i - j] for j <= i (a carries its own scale)."""
    heads_first = [t.transpose(0, 1).contiguous() for t in (q, k, v, a)]  # (H, B, L, d)
    out = _RelShiftAttention.apply(*heads_first, table.flip(1).contiguous(), scale)
    return out.transpose(0, 1)
