"""Attention with a RowBlockBias (CoPE): softmax(scale * q k^T + bias) v one block of query rows
at a time. Each block's bias, logits and weights exist only while the block runs, and the
backward pass forms them again (activation checkpointing per block), so memory grows with
L x block rows instead of L x L, and the block's tensors stay in cache. With causal square
scores a block reads only the keys its rows can see. An encoding may bring its own attention
(RowBlockBias.attend), which walks the same blocks (``row_blocks``)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from posbench.bias_kinds import RowBlockBias

#: Elements of one block's (B, H, rows, keys) tensors (4 MiB in float32): the rows per block
#: follow from it. Larger blocks spend less on dispatch and more on memory; CoPE at L = 2048
#: (B = 8, 4 heads, d_head 32) peaks at 130 MiB with 2^20 elements, 158 MiB with 2^21, NoPE
#: at 70 MiB (measured 2026-12-03).
BLOCK_ELEMENTS = 1 << 20


def row_blocks(
    q: Tensor, k_len: int, causal_mask: Tensor | None, block_elements: int | None = None
) -> Iterator[tuple[int, int, int, Tensor | None]]:
    """The blocks of query rows of q (B, H, Lq, d) against k_len keys: (r0, r1, keys, mask),
    mask (rows, keys) the block's part of causal_mask (None: every key). Each block holds at
    most block_elements (default BLOCK_ELEMENTS) (B, H, rows, keys) elements. With causal
    scores (the queries the last Lq of the keys) a block reads only the keys its rows can see,
    so early blocks take more rows: with square scores half as many blocks as equal rows would
    need, at the same peak."""
    B, H, q_len, _ = q.shape
    causal = causal_mask is not None and q_len <= k_len
    before = k_len - q_len  # keys before the first query's own
    pairs = (block_elements or BLOCK_ELEMENTS) // (B * H)  # (rows, keys) pairs per block
    r0 = 0
    while r0 < q_len:
        if causal:  # the most rows with rows * (before + r0 + rows) <= pairs
            seen = before + r0
            rows = (math.isqrt(seen * seen + 4 * pairs) - seen) // 2
        else:
            rows = pairs // k_len
        r1 = min(r0 + max(1, rows), q_len)
        keys = before + r1 if causal else k_len  # later keys are all masked for these rows
        yield r0, r1, keys, None if causal_mask is None else causal_mask[r0:r1, :keys]
        r0 = r1


def row_block_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: RowBlockBias, scale: float, causal_mask: Tensor | None
) -> Tensor:
    """q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, dv) -> (B, H, Lq, dv); causal_mask (Lq, Lk)
    is True where attention is allowed (None: every key)."""
    if bias.attend is not None:  # the encoding's own attention, forward and backward
        return bias.attend(q, k, v, causal_mask, scale)
    recompute = torch.is_grad_enabled()
    blocks = []
    for r0, r1, keys, mask in row_blocks(q, k.shape[2], causal_mask):
        args = (q[:, :, r0:r1], k[:, :, :keys], v[:, :, :keys], mask)
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
