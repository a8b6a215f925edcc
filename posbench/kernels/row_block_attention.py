"""Attention with a RowBlockBias (CoPE): softmax(scale * q k^T + bias) v one block of query rows
at a time. Each block's bias, logits and weights exist only while the block runs, and the
backward pass forms them again (activation checkpointing per block), so memory grows with
L x block rows instead of L x L, and the block's tensors stay in cache. With causal square
scores a block reads only the keys its rows can see."""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from posbench.kernels.bias_types import RowBlockBias

#: Elements of one block's (B, H, rows, Lk) tensors (8 MiB in float32): the rows per block
#: follow from it. Larger blocks spend less on dispatch and more on memory (measured: 2^20
#: elements 4.9x NoPE at L = 1024 and 7.2x at 2048, 2^21 4.2x and 5.0x, 2^22 5.3x and 4.5x).
BLOCK_ELEMENTS = 1 << 21


def row_block_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: RowBlockBias, scale: float, causal_mask: Tensor | None
) -> Tensor:
    """q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv) -> (B, H, Lq, dv); causal_mask (Lq, Lk)
    is True where attention is allowed (None: every key)."""
    B, H, q_len, _ = q.shape
    k_len = k.shape[2]
    square_causal = causal_mask is not None and q_len == k_len
    rows = max(1, BLOCK_ELEMENTS // (B * H * k_len))
    recompute = torch.is_grad_enabled()
    blocks = []
    for r0 in range(0, q_len, rows):
        r1 = min(r0 + rows, q_len)
        keys = r1 if square_causal else k_len  # later keys are all masked for these rows
        mask = None if causal_mask is None else causal_mask[r0:r1, :keys]
        args = (q[:, :, r0:r1], k[:, :, :keys], v[:, :, :keys], mask)
        if bias.attend is not None:  # the encoding's own block attention
            blocks.append(bias.attend(r0, r1, *args, scale))
            continue
        block = functools.partial(_block, bias, scale, r0, r1, keys)
        blocks.append(checkpoint(block, *args, use_reentrant=False) if recompute else block(*args))
    return torch.cat(blocks, dim=2)


def _block(
    bias: RowBlockBias,
    scale: float,
    r0: int,
    r1: int,
    keys: int,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
) -> Tensor:
    """One block of query rows: (B, H, r1 - r0, dv)."""
    content = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)  # (B, H, rows, keys)
    logits = content + bias.rows(r0, r1, keys, content)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(logits, dim=-1), v)
