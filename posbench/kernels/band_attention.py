"""Causal attention whose bias lives in a band of W diagonals (T5 past max_distance, DeBERTa
past its span): logits = scale * q k^T + band[i, j - i + W - 1] for i - W < j <= i, and no
bias beyond (see BandBias).

The score matrix splits into two parts that are merged by their log-sum-exp, as flash
decoding merges key blocks:

* far keys (i - j >= W) carry no bias: the CPU flash kernel computes them without a mask, with
  its causal block skipping, on q[W:] against k[:L - W] (query W + x sees keys 0 .. x);
* near keys (the band) are dense blocks of ROWS query rows against the W - 1 + ROWS keys they
  can reach, with the band added on a strided view.

The far part runs first, so each near block is normalised by its rows' total log-sum-exp as it
is formed, and its probabilities are kept for the backward pass: B * H * L * (ROWS + W - 1)
floats, which spares the backward pass one GEMM and four elementwise passes per block (about
8% of T5's attention time at L = 1024). The backward pass reuses the merged output and
log-sum-exp: the flash backward given the total (out, lse) forms exactly the far part's share
of dq, dk, dv, and the near blocks form theirs and the band's gradient from the kept
probabilities. Nothing of size L x L is allocated."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from posbench.kernels import flash_ops
from posbench.kernels.probabilities import probabilities_

#: Query rows per near block. With T5's W = 113, 64 rows spend 36% of each block's pairs outside
#: the band (32 rows: 22%) but halve the blocks and their small operations: on a 2-core Xeon, 64
#: beat 32 for T5 and DeBERTa at L = 1024 and 2048, matched 48 and beat 96 and 128 at 1024, with
#: the same peak memory (docs/encodings/t5.md).
ROWS = 64


def _near_blocks(q: Tensor, k_padded: Tensor, band: Tensor, scale: float):
    """For each block of query rows: (r0, r1, logits (B, H, rows, rows + W - 1)) over the keys
    r0 - W + 1 .. r1 - 1 (rows r0 .. r1 + W - 2 of k_padded), band added, -inf outside the
    band and before key 0."""
    B, H, L, _ = q.shape
    W = band.shape[-1]
    q_rows, k_rows = _flat(q), _flat(k_padded)
    for r0 in range(0, L, ROWS):
        r1 = min(r0 + ROWS, L)
        rows, keys = r1 - r0, r1 - r0 + W - 1
        mask = _additive_mask(rows, W, max(0, W - 1 - r0), q.device, q.dtype)  # (rows, keys)
        logits = torch.baddbmm(
            mask, q_rows[:, r0:r1], k_rows[:, r0 : r0 + keys].transpose(-1, -2), alpha=scale
        )
        logits = logits.view(B, H, rows, keys)
        diagonal = _band_of(logits, W)  # row a's band: columns a .. a + W - 1
        diagonal += band[:, :, r0:r1] if band.shape[2] > 1 else band
        yield r0, r1, logits


@functools.lru_cache(maxsize=16)
def _additive_mask(
    rows: int, W: int, before_key_0: int, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """(rows, rows + W - 1): 0 on each row's band of W keys from key 0 on, -inf elsewhere."""
    column = torch.arange(rows + W - 1, device=device)
    row = torch.arange(rows, device=device)[:, None]
    outside = (column < row) | (column >= row + W) | (column < before_key_0)
    return torch.zeros(outside.shape, device=device, dtype=dtype).masked_fill_(
        outside, float("-inf")
    )


def _flat(t: Tensor) -> Tensor:
    """(B, H, n, m) -> (B * H, n, m), a view of a contiguous tensor."""
    return t.flatten(0, 1)


def _band_of(blocked: Tensor, W: int) -> Tensor:
    """The band (B, H, rows, W) of a contiguous (B, H, rows, rows + W - 1) block over keys
    r0 - W + 1 .., as a strided view: row a's W keys start at column a."""
    rows, keys = blocked.shape[-2:]
    return blocked.as_strided((*blocked.shape[:2], rows, W), (*blocked.stride()[:2], keys + 1, 1))


class _BandAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, q: Tensor, k: Tensor, v: Tensor, band: Tensor, scale: float
    ) -> Tensor:
        B, H, L, _ = q.shape
        W = band.shape[-1]
        k_padded, v_padded = (F.pad(t, (0, 0, W - 1, 0)) for t in (k, v))  # key -W+1 .. L-1
        out = torch.empty_like(q)
        lse = q.new_empty(B, H, L)
        probs = []  # each block's probabilities over its near keys, (B * H, rows, keys)
        far_keys = slice(W - 1, L - 1)  # keys 0 .. L - W - 1 in the padded keys
        if L > W:  # far keys first: their log-sum-exp normalises the near blocks
            out_far, lse_far = flash_ops.forward(
                q[:, :, W:], k_padded[:, :, far_keys], v_padded[:, :, far_keys], True, None, scale
            )
        for r0, r1, logits in _near_blocks(q, k_padded, band, scale):
            keys = logits.shape[-1]
            peak = logits.amax(dim=-1)  # (B, H, rows): every row sees at least its own key
            weights = probabilities_(logits.sub_(peak[..., None]))
            block_lse = lse[:, :, r0:r1]
            torch.add(peak, weights.sum(-1).log_(), out=block_lse)  # the near keys' own
            if r1 > W:  # rows W .. see far keys too
                f0 = max(r0, W)
                torch.logaddexp(
                    block_lse[..., f0 - r0 :],
                    lse_far[..., f0 - W : r1 - W],
                    out=block_lse[..., f0 - r0 :],
                )
            weights.mul_((peak - block_lse).exp_()[..., None])  # P = exp(logits - lse)
            probs.append(_flat(weights))
            out[:, :, r0:r1] = weights @ v_padded[:, :, r0 : r0 + keys]
        if L > W:
            out[:, :, W:] += out_far * (lse_far - lse[:, :, W:]).exp_()[..., None]
        ctx.save_for_backward(q, k_padded, v_padded, band, out, lse, *probs)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k_padded, v_padded, band, out, lse, *probs = ctx.saved_tensors  # keys -W+1 .. L-1
        scale, (B, H, L, d), W = ctx.scale, q.shape, band.shape[-1]
        grad_out = grad_out.contiguous()
        far_keys = slice(W - 1, L - 1)  # keys 0 .. L - W - 1 in the padded keys
        if L > W:
            dq_far, dk_far, dv_far = flash_ops.backward(
                grad_out[:, :, W:],
                q[:, :, W:],
                k_padded[:, :, far_keys],
                v_padded[:, :, far_keys],
                out[:, :, W:],
                lse[:, :, W:],
                True,
                None,
                scale,
            )
            dq = torch.cat([q.new_zeros(B, H, W, d), dq_far], 2)
            dk_padded, dv_padded = (
                torch.cat([q.new_zeros(B, H, W - 1, d), far, q.new_zeros(B, H, W, d)], 2)
                for far in (dk_far, dv_far)
            )
        else:
            dq = torch.zeros_like(q)
            dk_padded, dv_padded = torch.zeros_like(k_padded), torch.zeros_like(v_padded)
        q3, k3, v3, grad3 = _flat(q), _flat(k_padded), _flat(v_padded), _flat(grad_out)
        dq3, dk3, dv3 = _flat(dq), _flat(dk_padded), _flat(dv_padded)
        minus_delta = _flat((grad_out * out).sum(-1, keepdim=True).neg_())  # (B * H, L, 1)
        per_row = band.shape[2] > 1
        reduce = [dim for dim, size in ((0, band.shape[0]), (2, band.shape[2])) if size == 1]
        dband = (
            torch.zeros(band.shape, dtype=q.dtype, device=q.device)
            if ctx.needs_input_grad[3]
            else None
        )
        for r0, block_probs in zip(range(0, L, ROWS), probs):  # (B * H, rows, keys)
            r1, keys = min(r0 + ROWS, L), block_probs.shape[-1]
            ds = torch.baddbmm(
                minus_delta[:, r0:r1], grad3[:, r0:r1], v3[:, r0 : r0 + keys].transpose(-1, -2)
            )
            ds.mul_(block_probs)  # dS = P * (dP - rowsum(dO * O))
            dv3[:, r0 : r0 + keys] += torch.bmm(block_probs.transpose(-1, -2), grad3[:, r0:r1])
            dq3[:, r0:r1].add_(torch.bmm(ds, k3[:, r0 : r0 + keys]), alpha=scale)
            dk3[:, r0 : r0 + keys].add_(torch.bmm(ds.transpose(-1, -2), q3[:, r0:r1]), alpha=scale)
            if dband is not None:
                block_band = _band_of(ds.view(B, H, r1 - r0, keys), W)  # (B, H, rows, W)
                block_band = block_band.sum(reduce, keepdim=True) if reduce else block_band
                if per_row:
                    dband[:, :, r0:r1] += block_band
                else:
                    dband += block_band
        return dq, dk_padded[:, :, W - 1 :], dv_padded[:, :, W - 1 :], dband, None


def band_attention(q: Tensor, k: Tensor, v: Tensor, band: Tensor, scale: float) -> Tensor:
    """Causal softmax(scale * q k^T + bias) v for q, k, v (B, H, L, d) on the CPU, the bias
    band[b, h, i, j - i + W - 1] for i - W < j <= i and 0 beyond; band (B|1, H, L|1, W)."""
    return _BandAttention.apply(q.contiguous(), k, v, band, scale)  # k, v: padded copies
