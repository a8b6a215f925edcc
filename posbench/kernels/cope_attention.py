"""CoPE's attention in torch (posbench.bias_kinds.GatedPositionBias) over every query row, a
block of rows at a time (posbench.kernels.row_block_attention.row_blocks), forward and backward
written out: where posbench's C++ CoPE kernel does not serve (a cache, another device, the
kernel not built). It keeps its inputs and output only and forms each block's gates, positions
and weights again in the backward pass, so no (B, H, L, L) tensor outlives its block."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.bias_kinds import contextual_position_bias, own_keys
from posbench.kernels import served
from posbench.kernels.row_block_attention import row_blocks


def cope_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor,
    causal_mask: Tensor | None,
    causal: bool,
    scale: float,
    npos: int,
) -> Tensor:
    """softmax(scale * q k^T + CoPE's bias, masked) v for q (B, H, Lq, d), k and v (B, H, Lk,
    d) and the position table (d, npos); causal_mask (Lq, Lk) True where attention is allowed."""
    served.note(served.TORCH_COPE)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # blocks view (B * H)
    return _CopeAttention.apply(q, k, v, table, causal_mask, causal, scale, npos)


def _block_weights(
    q: Tensor,
    k: Tensor,
    table: Tensor,
    own: Tensor | None,
    mask: Tensor | None,
    scale: float,
    npos: int,
    for_backward: bool,
) -> dict[str, Tensor]:
    """The attention weights of query rows q (B, H, R, d) against keys k (B, H, K, d), with
    ``for_backward`` what the backward pass reads (each (B, H, R, K)). Masked keys get content
    -inf from the GEMM itself (its additive input), so their gates, weights and gate slopes
    are exactly 0; they precede no allowed key, so no allowed position changes."""
    B, H, R, _ = q.shape
    if mask is None:
        content = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    else:
        masked = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
            ~mask, float("-inf")
        )  # (R, K)
        content = torch.baddbmm(
            masked, q.flatten(0, 1), k.flatten(0, 1).transpose(-1, -2), alpha=scale
        ).view(B, H, R, -1)
    parts = contextual_position_bias(q, content, table, own, npos, for_backward)
    logits = content.add_(parts.pop("bias"))  # the gates were read off the content first
    return parts | {"probs": torch.softmax(logits, dim=-1)}


class _CopeAttention(torch.autograd.Function):
    """CoPE attention over every query row, a block of rows at a time
    (posbench.kernels.row_block_attention.row_blocks), forward and backward written out. It
    keeps its inputs and output only and forms each block's gates, positions and weights again
    in the backward pass, so no (B, H, L, L) tensor outlives its block; the gradients of k, v
    and the table accumulate in place across blocks."""

    @staticmethod
    def forward(ctx, q, k, v, table, causal_mask, causal, scale, npos):  # type: ignore[override]
        q_len, k_len = q.shape[2], k.shape[2]
        out = q.new_empty(*q.shape[:-1], v.shape[-1])  # (B, H, Lq, dv), every row written
        for r0, r1, keys, mask in row_blocks(q, k_len, causal_mask):
            own = own_keys(r0, r1, q_len, k_len, q.device) if causal else None
            f = _block_weights(
                q[:, :, r0:r1], k[:, :, :keys], table, own, mask, scale, npos, for_backward=False
            )
            out[:, :, r0:r1] = torch.matmul(f["probs"], v[:, :, :keys])
        ctx.save_for_backward(q, k, v, table, out)
        ctx.causal_mask, ctx.causal, ctx.scale, ctx.npos = causal_mask, causal, scale, npos
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, table, out = ctx.saved_tensors
        causal_mask, causal, scale, npos = ctx.causal_mask, ctx.causal, ctx.scale, ctx.npos
        q_len, k_len = q.shape[2], k.shape[2]
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1, keepdim=True)  # (B, H, Lq, 1): rowsum(dP * P)
        grad_q = torch.empty_like(q)  # every row block written
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)  # accumulated over blocks
        grad_table = torch.zeros_like(table)
        for r0, r1, keys, mask in row_blocks(q, k_len, causal_mask):
            own = own_keys(r0, r1, q_len, k_len, q.device) if causal else None
            grads = _block_backward(
                q[:, :, r0:r1],
                k[:, :, :keys],
                v[:, :, :keys],
                grad_out[:, :, r0:r1],
                delta[:, :, r0:r1],
                table,
                own,
                mask,
                scale,
                npos,
            )
            grad_q[:, :, r0:r1] = grads[0]
            grad_k[:, :, :keys] += grads[1]
            grad_v[:, :, :keys] += grads[2]
            grad_table += grads[3]
        return grad_q, grad_k, grad_v, grad_table, None, None, None, None


def _block_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grad_out: Tensor,
    delta: Tensor,
    table: Tensor,
    own: Tensor | None,
    mask: Tensor | None,
    scale: float,
    npos: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of one block of query rows q (B, H, R, d) against keys k (B, H, K, d):
    (dq (B, H, R, d), dk and dv (B, H, K, d), dtable); delta (B, H, R, 1) is rowsum(dO * O).
    A function of its own, so a block's (B, H, R, K) tensors are freed before the next block
    forms its own, and each is released as soon as it is spent."""
    f = _block_weights(q, k, table, own, mask, scale, npos, for_backward=True)
    probs = f.pop("probs")
    grad_v = torch.matmul(probs.transpose(-1, -2), grad_out)
    grad_probs = torch.matmul(grad_out, v.transpose(-1, -2)).sub_(delta)  # dP - rowsum(dP * P)
    # softmax: dlogits = P * (dP - rowsum(dP * P)); masked keys have P = 0
    grad_logits = probs.mul_(grad_probs)
    # bias = at[index] + weight * slope[index], slope[m] = at[m + 1] - at[m]
    index = f.pop("index")
    ends = _position_ends(index, npos)
    del index
    grad_at = _sums_per_position(grad_logits, ends)
    grad_slopes = _sums_per_position(
        torch.mul(grad_logits, f.pop("weight"), out=grad_probs), ends
    )  # grad_probs's buffer, spent, holds grad_logits * weight
    del grad_probs
    grad_at[..., 1:] += grad_slopes[..., :-1]
    grad_at[..., :-1] -= grad_slopes[..., :-1]
    # positions = clamp(raw), raw_j = total - running_{j-1} with running the cumulative
    # sum of the gates and total the running sum at the query's own key o:
    # d raw_j / d gates_t = [t <= o] - [t <= j - 1], so with G = dL/d raw the gates'
    # gradient is cumsum(G)_t for t <= o (keys past o are masked)
    grad_raw = f.pop("slope").mul_(grad_logits).mul_(f.pop("inside"))
    grad_gates = grad_raw.cumsum(-1)  # past o it meets gates of slope 0 (masked keys)
    del grad_raw
    gates = f.pop("gates")
    sigmoid_slope = gates.addcmul_(gates, gates, value=-1.0)  # g (1 - g), in place
    grad_content = grad_logits.addcmul_(grad_gates, sigmoid_slope)  # scale applied below
    del grad_gates, sigmoid_slope, gates
    grad_q = torch.matmul(grad_content, k).mul_(scale) + torch.matmul(
        grad_at, table.transpose(0, 1)
    )
    grad_k = torch.matmul(grad_content.transpose(-1, -2), q).mul_(scale)
    grad_table = torch.einsum("bhrd,bhrn->dn", q, grad_at)
    return grad_q, grad_k, grad_v, grad_table


def _position_ends(index: Tensor, npos: int) -> Tensor:
    """For each row of integer positions index (B, H, R, K), never increasing along the keys
    and negated here in place, the number of keys at position m or above, for m = 0..npos
    (B, H, R, npos + 1): those keys are a prefix of the row, so its length is a binary
    search."""
    levels = torch.arange(0, -npos - 1, -1, device=index.device)  # -m, ascending as -index
    levels = levels.expand(*index.shape[:-1], -1).contiguous()
    return torch.searchsorted(index.neg_(), levels, right=True)  # index is spent


def _sums_per_position(values: Tensor, ends: Tensor) -> Tensor:
    """The sum of values (B, H, R, K) over the keys at each integer position m, (B, H, R, npos),
    from ends (B, H, R, npos + 1), the number of keys at position m or above: prefix sums
    differenced at the ends, instead of a scatter-add (about 3x slower here)."""
    prefix = values.new_empty(*values.shape[:-1], values.shape[-1] + 1)  # (B, H, R, K + 1)
    prefix[..., 0] = 0.0
    torch.cumsum(values, -1, out=prefix[..., 1:])  # prefix[n]: the sum of the first n keys
    above = prefix.gather(-1, ends)  # sum over the keys at position m or above
    return above[..., :-1] - above[..., 1:]
