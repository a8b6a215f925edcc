"""The CPU flash-attention kernel, called directly: the one place posbench uses torch's
private ops, behind one availability check.

`scaled_dot_product_attention` takes either ``is_causal`` or a float mask; the CPU flash
kernel underneath takes both, which keeps causal block skipping for biased attention. Those
aten ops are private and may change with a torch release, so posbench probes them once (a
tiny forward and backward); where they are missing or changed, `available()` is False and
attention falls back to SDPA's public math path: slower, the same numbers."""

from __future__ import annotations

import functools

import torch
from torch import Tensor


@torch.compiler.assume_constant_result  # torch.compile reads the answer, never the probe
def available() -> bool:
    """Whether the private CPU flash forward and backward ops exist and take posbench's call."""
    return _probe()


@functools.cache
def _probe() -> bool:
    try:
        q = torch.zeros(1, 1, 2, 4)
        mask = torch.zeros(1, 1, 2, 2)
        out, lse = forward(q, q, q, True, mask, 1.0)
        backward(out, q, q, q, out, lse, True, mask, 1.0)
    except (AttributeError, RuntimeError, TypeError):
        return False
    return True


def forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor]:
    """(out (B, H, Lq, d), logsumexp (B, H, Lq)) of softmax(scale q k^T + mask) v."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, is_causal, attn_mask=mask, scale=scale
    )


def backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    is_causal: bool,
    mask: Tensor | None,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of `forward`, given its output and log-sum-exp."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale
    )
