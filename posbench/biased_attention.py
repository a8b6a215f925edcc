"""Attention with an additive bias that needs a gradient (T5's table, DeBERTa's and
Transformer-XL's position terms, KERPLE), kept on the CPU flash kernel.

`scaled_dot_product_attention` sends a mask that requires grad to its math path, which
materialises every intermediate (about 4x the cost of causal flash attention at L=1024 on a
2-core CPU). Here the forward pass runs the flash kernel with the bias as a plain float mask,
and the backward pass runs the flash backward for q, k and v and forms the bias gradient
dS = P * (dP - rowsum(dO * O)) one (batch, head) block at a time, P = exp(S - logsumexp)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


FLASH_MIN_PAIRS = 128 * 128


class _FlashBiasedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        mask = bias.detach()
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, mask, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=ctx.scale
        )
        dbias = None
        if ctx.needs_input_grad[3]:
            B, H = q.shape[:2]
            delta = (grad_out * out).sum(-1, keepdim=True)  # (B, H, Lq, 1)
            dbias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
            for b in range(B):
                mb = mask[b if mask.shape[0] > 1 else 0]  # (H or 1, Lq, Lk)
                scores = torch.baddbmm(mb.expand(H, -1, -1), q[b], k[b].transpose(-1, -2), alpha=ctx.scale)
                probs = scores.sub_(lse[b].unsqueeze(-1)).exp_()  # (H, Lq, Lk)
                dprobs = torch.bmm(grad_out[b], v[b].transpose(-1, -2))  # (H, Lq, Lk)
                ds = probs.mul_(dprobs.sub_(delta[b]))
                target = dbias[b if mask.shape[0] > 1 else 0]
                target += ds if mask.shape[1] > 1 else ds.sum(0, keepdim=True)
        return dq, dk, dv, dbias, None


def biased_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
    """softmax(scale * q k^T + bias) v for q, k (B, H, Lq|Lk, d), v (B, H, Lk, dv) and a bias
    broadcastable to (B, H, Lq, Lk) with -inf where attention is masked."""
    bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)) if bias.dim() < 4 else bias
    large = q.shape[-2] * k.shape[-2] >= FLASH_MIN_PAIRS  # below, the math path's few ops win
    if large and bias.requires_grad and q.device.type == "cpu" and torch.is_grad_enabled() and q.dtype == torch.float32:
        return _FlashBiasedAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), bias.contiguous(), scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
