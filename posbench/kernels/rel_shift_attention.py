"""Causal attention whose bias is each query's dot product with a table, computed one block of
query rows at a time and never whole: logits = scale * q k^T + bias with bias[b, h, i, j] =
a[b, h, i] . r[h, i - j] for j <= i (a per-distance table: Transformer-XL's position terms) or
a[b, h, i] . f[h, j] (a per-key table: the same terms at drawn positions, where sin and cos of
p_i - p_j split into functions of p_i and of p_j), or a[b, h, i] . r[h, p_i - p_j] (a
per-distance table at drawn positions p). The queries are the last Lq of the Lk keys (Lq = Lk,
or a segment after its memory).

For a block of rows whose last query is key n - 1 the keys are 0..n - 1. With a per-key table
the block's bias is one product, a_rows f^T. With a per-distance table the keys are at
distances up to n - 1, so one product y = a_rows r_rev^T over those distances (r_rev: the table
in reverse order) holds every bias of the block, each row shifted by one: the bias is a skewed
strided view of y (Transformer-XL's "relative shift", without its padded copy). At drawn
positions the block's rows reach distances 0 .. p_last_row - p_0: y over those distances is
read at p_i - p_j by one gather, and its gradient placed back by one scatter. The forward pass
runs the CPU flash kernel on each block with that bias as its mask, q, k and v keeping their
width; the backward pass forms each block's probabilities again from the saved log-sum-exp, as
posbench.kernels.biased_attention does, and takes the gradients of a and of the table from
each block's dS (written where the skewed view reads it, for a per-distance table) by two more
products. Memory grows with L x block rows, not L^2."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from posbench.kernels import flash_ops
from posbench.kernels.masks import causal_mask
from posbench.kernels.row_block_attention import row_blocks
from posbench.kernels.softmax_backward import BlockedSoftmaxBackward

#: Elements of one block's (H, B, rows, keys) tensors (8 MiB in float32), twice row_blocks'
#: default, which CoPE's memory goal sets: Transformer-XL at L = 2048 (B = 8, 4 heads of 32,
#: fwd+bwd over NoPE's, 2 threads, one layer) took 2.67x-2.76x NoPE's time with 2^20,
#: 2.33x-2.34x with 2^21 and 2.35x-2.36x with 2^22 (two alternating rounds, 2026-12-04), at
#: the same peak memory. At 2048 the last blocks hold 16 rows with 2^20, 32 with 2^21; at
#: L = 1024 32 and 62, and nothing moved.
BLOCK_ELEMENTS = 1 << 21


def _skewed(y: Tensor, rows: int, keys: int, row_stride: int) -> Tensor:
    """The bias (H, B, rows, keys) of a block from y (H, B, rows, ...) whose row a holds
    distance keys - 1 - m at column m, a row stride apart: bias[a, j] = y[a, rows - 1 - a + j]."""
    H, B = y.shape[:2]
    return y.as_strided(
        (H, B, rows, keys),
        (y.stride(0), y.stride(1), row_stride - 1, 1),
        y.storage_offset() + rows - 1,
    )


def _blocks(q: Tensor, k_len: int) -> Iterator[tuple[int, int, int, Tensor]]:
    """The causal blocks of query rows (r0, r1, keys, allowed) of q (H, B, Lq, d)."""
    return row_blocks(q, k_len, causal_mask(q.shape[2], k_len, q.device), BLOCK_ELEMENTS)


def _block_table(table: Tensor, keys: int, skewed: bool) -> Tensor:
    """The table rows a block with `keys` keys (or distances) reads, (H, keys, r): the first
    `keys` distances in reverse order (the last rows of r_rev) or the first `keys` rows."""
    return table[:, -keys:] if skewed else table[:, :keys]


def _block_product(a_rows: Tensor, table: Tensor, keys: int, skewed: bool) -> Tensor:
    """y (H, B, rows, keys) = a_rows (H, B, rows, r) against the block's table rows."""
    H, B, rows, r = a_rows.shape
    y = torch.bmm(a_rows.reshape(H, B * rows, r), _block_table(table, keys, skewed).transpose(1, 2))
    return y.view(H, B, rows, keys)


def causal_table_bias(a: Tensor, table: Tensor, k_len: int) -> Tensor:
    """The whole (B, H, Lq, Lk) bias of a per-distance table at plain positions, a (B, H, Lq, d)
    against table (H, >= Lk, d), with -inf at future keys, so it is also the causal mask: for
    scores too short for the blocked kernels, read by SDPA. One product per head against the
    reversed table followed by Lq rows of -inf (a coordinate of 1 on the queries meets 0 on the
    table's rows and -inf on the padding's), read through the skewed view; a query that is the
    last key reads no future key and needs no skew."""
    B, H, q_len, d = a.shape
    a_rows = a.transpose(0, 1)  # (H, B, Lq, d)
    reversed_table = table[:, :k_len].flip(1)  # (H, Lk, d): distances Lk-1..0
    if q_len == 1:
        return _block_product(a_rows, reversed_table, k_len, skewed=True).transpose(0, 1)
    ones = a.new_ones(H, B, q_len, 1)
    padded_table = table.new_zeros(H, k_len + q_len, d + 1)
    padded_table[:, :k_len, :d] = reversed_table
    padded_table[:, k_len:, d] = -math.inf
    y = _block_product(torch.cat((a_rows, ones), dim=-1), padded_table, k_len + q_len, False)
    return _skewed(y, q_len, k_len, k_len + q_len).transpose(0, 1)  # (B, H, Lq, Lk)


@dataclass(frozen=True)
class _Gather:
    """Where a block's bias (rows, keys) lies in its product y (rows, columns) at drawn
    positions: row a, key j at column p_i - p_j (future keys at distance 0, masked)."""

    columns: int  # the distances the block's rows reach: 0 .. columns - 1
    index: Tensor  # (rows, keys) into y's columns

    @staticmethod
    def of(positions: Tensor, q_len: int, r0: int, r1: int, keys: int) -> _Gather:
        """The block of query rows r0 .. r1 - 1, the queries the last q_len of the keys."""
        query_positions = positions[len(positions) - q_len + r0 : len(positions) - q_len + r1]
        columns = int(query_positions[-1] - positions[0]) + 1
        distance = (query_positions[:, None] - positions[None, :keys]).clamp(min=0)
        return _Gather(columns, distance)

    def bias(self, y: Tensor) -> Tensor:
        """The block's bias (H, B, rows, keys) from y (H, B, rows, columns)."""
        return y.gather(3, self.index.expand(*y.shape[:2], *self.index.shape))

    def gradient(self, ds: Tensor) -> Tensor:
        """dy (H, B * rows, columns) from dS (H, B, rows, keys), 0 past each row's own key
        (the future keys' zeros land on distance 0; distinct positions put no two of a row's
        own keys at one distance)."""
        H, B, rows, _ = ds.shape
        dy = ds.new_zeros(H, B, rows, self.columns)
        dy.scatter_add_(3, self.index.expand(*ds.shape), ds)
        return dy.view(H, B * rows, self.columns)


class _TableBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        a: Tensor,
        table: Tensor,
        scale: float,
        skewed: bool,
        positions: Tensor | None,
    ) -> Tensor:
        """q (H, B, Lq, d), a (H, B, Lq, r) and k, v (H, B, Lk, d) (heads first); table
        (H, T, r): r_rev (distance Lk - 1 first) when skewed, f (key 0 first) by key, or r
        (distance 0 first) at drawn positions (Lk,)."""
        H, B, q_len, _ = q.shape
        k_len = k.shape[2]
        out = torch.empty_like(q)
        lse = q.new_empty(H, B, q_len)
        for r0, r1, keys, allowed in _blocks(q, k_len):
            rows = r1 - r0
            mask = _block_bias(a, table, skewed, positions, q_len, r0, r1, keys)
            # the future keys of the block's rows all lie in its last `rows` columns
            mask[..., keys - rows :].masked_fill_(~allowed[:, keys - rows :], float("-inf"))
            block_out, block_lse = flash_ops.forward(
                q[:, :, r0:r1], k[:, :, :keys], v[:, :, :keys], False, mask, scale
            )
            out[:, :, r0:r1], lse[:, :, r0:r1] = block_out, block_lse
        ctx.save_for_backward(q, k, v, a, table, out, lse)
        ctx.scale, ctx.skewed, ctx.positions = scale, skewed, positions
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, a, table, out, lse = ctx.saved_tensors
        scale, skewed, positions = ctx.scale, ctx.skewed, ctx.positions
        (H, B, q_len, _), k_len = q.shape, k.shape[2]
        grad_out = grad_out.contiguous()
        blocks = BlockedSoftmaxBackward(q, k, v, out, lse, grad_out, scale)
        da = torch.empty_like(a)  # every row block written
        dtable = torch.zeros_like(table) if ctx.needs_input_grad[4] else None
        for r0, r1, keys, allowed in _blocks(q, k_len):
            rows = r1 - r0
            scores = blocks.scores(r0, r1, keys)  # (H, B, rows, keys): scale q . k - lse
            scores += _block_bias(a, table, skewed, positions, q_len, r0, r1, keys)
            scores[..., keys - rows :].masked_fill_(~allowed[:, keys - rows :], float("-inf"))
            if positions is not None:
                gather = _Gather.of(positions, q_len, r0, r1, keys)
                dy = gather.gradient(blocks.gradients(scores, r0, r1))  # dS, future 0
                columns = gather.columns
            elif skewed:
                dy, columns = _skewed_gradients(blocks, scores, r0, r1), keys
            else:
                dy, columns = blocks.gradients(scores, r0, r1).view(H, B * rows, keys), keys
            rows_table = _block_table(table, columns, skewed)  # (H, columns, r)
            da[:, :, r0:r1] = torch.bmm(dy, rows_table).view(H, B, rows, -1)
            if dtable is not None:
                a_rows = a[:, :, r0:r1].reshape(H, B * rows, -1)
                _block_table(dtable, columns, skewed).add_(torch.bmm(dy.transpose(1, 2), a_rows))
        return blocks.dq, blocks.dk, blocks.dv, da, dtable, None, None, None


def _block_bias(
    a: Tensor,
    table: Tensor,
    skewed: bool,
    positions: Tensor | None,
    q_len: int,
    r0: int,
    r1: int,
    keys: int,
) -> Tensor:
    """The bias (H, B, rows, keys) of the block of query rows r0 .. r1 - 1, a tensor of its own
    (written in place by the caller)."""
    rows = r1 - r0
    if positions is not None:
        gather = _Gather.of(positions, q_len, r0, r1, keys)
        return gather.bias(_block_product(a[:, :, r0:r1], table, gather.columns, False))
    y = _block_product(a[:, :, r0:r1], table, keys, skewed)
    return _skewed(y, rows, keys, keys).contiguous() if skewed else y


def _skewed_gradients(blocks: BlockedSoftmaxBackward, scores: Tensor, r0: int, r1: int) -> Tensor:
    """The gradient dy (H, B * rows, keys) of a block's product y under the skewed view: dS
    lands in a buffer whose skewed view is dy, row a at column rows - 1 + j, zeros before, and
    rows + 1 spare elements per (h, b) so that (b, a) merge into one dimension of dy."""
    H, B, rows, keys = scores.shape
    width = keys + rows - 1
    buffer = scores.new_empty(H, B, rows * (width + 1))
    padded = buffer[..., : rows * width].view(H, B, rows, width)
    padded[..., : rows - 1] = 0.0
    blocks.gradients(scores, r0, r1, ds_out=padded[..., rows - 1 :])  # dS, future 0
    # dy[a, m] = dS[a, m + a - (rows - 1)] = padded[a, m + a]: a row stride of width + 1
    return padded.as_strided(
        (H, B, rows, keys), (*padded.stride()[:2], width + 1, 1), padded.storage_offset()
    ).view(H, B * rows, keys)


def _heads_first(*tensors: Tensor) -> list[Tensor]:
    return [t.transpose(0, 1).contiguous() for t in tensors]  # (B, H, ...) -> (H, B, ...)


def rel_shift_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    table: Tensor,
    scale: float,
    positions: Tensor | None = None,
) -> Tensor:
    """Causal softmax(scale * q k^T + bias) v on the CPU for q, a (B, H, Lq, d), k, v (B, H, Lk,
    d), the queries the last Lq keys, and a per-distance table (H, T, d) of distances
    0..T - 1: bias[b, h, i, j] = a_i . table[h, p_i - p_j] for j <= i (a carries its own
    scale), p the keys' positions: 0..Lk - 1 (T = Lk), or ``positions`` (Lk,) (drawn: strictly
    increasing, T past p_last - p_first)."""
    q, k, v, a = _heads_first(q, k, v, a)
    if positions is None:  # the table reversed, read through the skew
        out = _TableBiasAttention.apply(q, k, v, a, table.flip(1).contiguous(), scale, True, None)
    else:
        positions = positions.to(device="cpu", dtype=torch.int64)
        out = _TableBiasAttention.apply(q, k, v, a, table.contiguous(), scale, False, positions)
    return out.transpose(0, 1)


def key_table_attention(
    q: Tensor, k: Tensor, v: Tensor, a: Tensor, table: Tensor, scale: float
) -> Tensor:
    """Causal softmax(scale * q k^T + bias) v on the CPU for q (B, H, Lq, d), a (B, H, Lq, r),
    k, v (B, H, Lk, d), the queries the last Lq keys, and a per-key table (H|1, Lk, r):
    bias[b, h, i, j] = a_i . table[h, j] for j <= i (a carries its own scale)."""
    table = table.expand(q.shape[1], *table.shape[1:]).contiguous()  # (H, Lk, r)
    out = _TableBiasAttention.apply(*_heads_first(q, k, v, a), table, scale, False, None)
    return out.transpose(0, 1)
