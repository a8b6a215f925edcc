"""Attention with an additive bias on torch's CPU flash kernel, with its causal block skipping
(ALiBi, T5's table, DeBERTa's and Transformer-XL's position terms, KERPLE), and the helpers the
C++ kernel's calls share. posbench.kernels.dispatch chooses when each runs.

`scaled_dot_product_attention` takes either ``is_causal`` or a mask, never both, and sends a
mask that requires grad to its math path, which materialises every intermediate (about 4x the
cost of causal flash attention at L=1024 on a 2-core CPU). The CPU flash kernel itself accepts
both: here the forward pass runs it with the bias as a plain float mask and ``is_causal`` set,
so blocks above the diagonal are skipped. The backward pass runs the flash backward when the
bias is fixed; when the bias needs a gradient (a learned bias, or one formed from q), it forms
P = exp(S - logsumexp) and dS = P * (dP - rowsum(dO * O)) one block of query rows at a time,
over the keys those rows can see, and reads dq, dk, dv and dbias off them in the same pass; for
a ToeplitzBias (KERPLE) it sums each block's dS along its diagonals there and then, so the
gradient is per distance and the (H, L, L) one is never written."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels import flash_ops, served
from posbench.bias_kinds import (
    BandBias,
    BandProduct,
    DistanceTableBias,
    KeyTableBias,
    SegmentBias,
    ToeplitzBias,
    diagonal_sums,
    toeplitz,
)
from posbench.kernels.fused_band_attention import fused_band_attention
from posbench.kernels.softmax_backward import BlockedSoftmaxBackward

#: Below this many score pairs the math path's few operations beat the CPU flash kernel.
FLASH_MIN_PAIRS = 128 * 128
#: Below this many score pairs, attention with no bias or a fixed one runs faster on torch's
#: kernels than on posbench's C++ kernel: the default suite's model (d_model 64, 4 layers),
#: fwd+bwd over the torch kernels' time, NoPE 1.13x / 1.05x / 0.98x / 0.90x at L = 32 / 64 /
#: 128 / 256 and ALiBi 1.16x / 1.07x / 0.96x / 0.84x. A learned bias is faster on the kernel
#: at any length (T5 0.92x-0.97x at L = 17 and 32).
NATIVE_MIN_PAIRS = 128 * 128
ROW_BLOCK = 64


class _DenseBiasGradient:
    """The gradient of a bias (Bb, Hb, Lq, Lk) broadcast against (B, H, Lq, Lk), written a
    block of query rows at a time."""

    def __init__(self, bias: Tensor) -> None:
        self.grad = torch.empty_like(bias)  # every entry written
        self.reduce = [dim for dim in (0, 1) if bias.shape[dim] == 1]

    def add(self, r0: int, r1: int, ds: Tensor) -> None:
        """dS of query rows r0..r1-1 against the keys they see, (B, H, rows, keys)."""
        keys = ds.shape[-1]
        self.grad[:, :, r0:r1, :keys] = ds.sum(self.reduce, keepdim=True) if self.reduce else ds
        self.grad[:, :, r0:r1, keys:] = 0.0  # keys the block never sees


class _PerDistanceGradient:
    """The gradient of a ToeplitzBias's values (Hb, Lq + Lk - 1): each block's dS, summed over
    the batch, summed along its diagonals into the distances it covers."""

    def __init__(self, values: Tensor, k_len: int) -> None:
        self.grad = torch.zeros_like(values)
        self.k_len = k_len
        self.reduce = [0] if values.shape[0] > 1 else [0, 1]

    def add(self, r0: int, r1: int, ds: Tensor) -> None:
        """dS of query rows r0..r1-1 against the keys 0..keys-1 they see, (B, H, rows, keys)."""
        keys = ds.shape[-1]
        block = ds.sum(self.reduce).reshape(-1, r1 - r0, keys)  # (Hb, rows, keys)
        # the block's diagonals a' - b = -(keys - 1) .. rows - 1 are i - j = that + r0
        start = r0 + self.k_len - keys
        self.grad[:, start : start + r1 - r0 + keys - 1] += diagonal_sums(block)


def _backward_with_bias_gradient(
    saved: tuple[Tensor, ...],
    grad_out: Tensor,
    scale: float,
    causal_mask: Tensor | None,
    bias_grad: _DenseBiasGradient | _PerDistanceGradient,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dbias) for a bias broadcast against (B, H, L, Lk), one block of query rows
    at a time; ``bias_grad`` receives each block's dS and gives dbias in the bias's own form.
    The bias gradient needs dS = P * (dP - rowsum(dO * O)) at every pair, which the flash
    backward forms but does not return; forming it here once and reading dq, dk and dv off the
    same P and dS costs less than the flash backward plus a second pass for dS. With the
    kernel's causal masking (causal_mask (L, L)) a block reads only the keys it sees;
    otherwise every key, masked ones already -inf in the bias."""
    q, k, v, bias, out, lse = saved
    q_len, k_len = q.shape[2], k.shape[2]
    blocks = BlockedSoftmaxBackward(q, k, v, out, lse, grad_out, scale)
    future = None if causal_mask is None else ~causal_mask  # (L, L)
    for r0 in range(0, q_len, ROW_BLOCK):
        r1 = min(r0 + ROW_BLOCK, q_len)
        keys = k_len if future is None else r1
        scores = blocks.scores(r0, r1, keys)  # (B, H, rows, keys): scale q . k - lse
        scores += bias[:, :, r0:r1, :keys]
        if future is not None:  # the kernel's own masking left the bias unmasked above the diagonal
            # square scores: the future keys of rows r0..r1-1 all lie in columns r0..r1-1
            scores[..., r0:].masked_fill_(future[r0:r1, r0:keys], float("-inf"))
        bias_grad.add(r0, r1, blocks.gradients(scores, r0, r1))  # dS (B, H, rows, keys)
    return blocks.dq, blocks.dk, blocks.dv, bias_grad.grad


class _FlashBiasedAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor,
        scale: float,  # type: ignore[override]
        causal_mask: Tensor | None,
        toeplitz_shape: tuple[int, int] | None,
    ) -> Tensor:
        """causal_mask (L, L) for square scores the kernel masks itself, else None (any
        masking is already -inf in the bias). bias is the dense bias, or with toeplitz_shape
        (Lq, Lk) a ToeplitzBias's values (Hb, Lq + Lk - 1)."""
        if toeplitz_shape is None:
            mask = bias.detach()
        else:
            mask = toeplitz(bias.detach(), *toeplitz_shape)[None]  # (1, Hb, Lq, Lk)
        out, lse = flash_ops.forward(q, k, v, causal_mask is not None, mask, scale)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale, ctx.causal_mask = scale, causal_mask
        ctx.values = bias.detach() if toeplitz_shape is not None else None
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        grad_out = grad_out.contiguous()
        saved = ctx.saved_tensors
        if ctx.needs_input_grad[3]:
            mask, k_len = saved[3], saved[1].shape[2]
            bias_grad = (
                _DenseBiasGradient(mask)
                if ctx.values is None
                else _PerDistanceGradient(ctx.values, k_len)
            )
            dq, dk, dv, dbias = _backward_with_bias_gradient(
                saved, grad_out, ctx.scale, ctx.causal_mask, bias_grad
            )
            return dq, dk, dv, dbias, None, None, None
        q, k, v, mask, out, lse = saved
        dq, dk, dv = flash_ops.backward(
            grad_out, q, k, v, out, lse, ctx.causal_mask is not None, mask, ctx.scale
        )
        return dq, dk, dv, None, None, None, None


def needs_gradient(*tensors: Tensor | None) -> bool:
    """Whether any of a bias's tensors needs a gradient here (grad mode on)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def learned_bias(
    bias: Tensor | ToeplitzBias | BandBias | DistanceTableBias | KeyTableBias | SegmentBias,
) -> bool:
    """Whether a bias needs a gradient (a learned one, or one formed from q or k)."""
    if isinstance(bias, ToeplitzBias):
        return needs_gradient(bias.values)
    if isinstance(bias, BandBias):
        parts = [bias.band] if bias.key_band is None else [bias.band, bias.key_band]
        return needs_gradient(*(t for part in parts for t in _tensors_of(part)))
    if isinstance(bias, (DistanceTableBias, KeyTableBias)):
        return needs_gradient(bias.a, bias.table)
    if isinstance(bias, SegmentBias):
        return needs_gradient(bias.a, bias.b, bias.f)
    return needs_gradient(bias)


def _tensors_of(part: Tensor | BandProduct) -> tuple[Tensor, ...]:
    """A band's tensors: itself, or a product's factors and table."""
    return (part.a, part.table) if isinstance(part, BandProduct) else (part,)


def fused_band_bias(q: Tensor, k: Tensor, v: Tensor, bias: BandBias, scale: float) -> Tensor:
    """A BandBias through the C++ kernel: a band given entry by entry as the band, one given as
    products (with the key band's, if any) formed inside the kernel; a key band beside a band
    given entry by entry is added to it first."""
    if isinstance(bias.band, BandProduct):
        empty = q.new_empty(1, q.shape[1], 1, 0)
        products = (_in_dtype(bias.band, q.dtype), _in_dtype(bias.key_band, q.dtype))
        return fused_band_attention(q, k, v, empty, scale, band_products=products)
    return fused_band_attention(q, k, v, bias.full_band().to(q.dtype), scale)


def _in_dtype(product: BandProduct | None, dtype: torch.dtype) -> BandProduct | None:
    if product is None:
        return None
    return BandProduct(product.a.to(dtype), product.table.to(dtype))


def flash_toeplitz(
    q: Tensor, k: Tensor, v: Tensor, bias: ToeplitzBias, scale: float, causal_mask: Tensor | None
) -> Tensor:
    """A learned per-distance bias on the CPU flash kernel, its gradient summed per distance;
    causal_mask (L, L) for square causal scores the kernel masks itself, else None."""
    return _FlashBiasedAttention.apply(
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        bias.values.to(q.dtype),
        scale,
        causal_mask,
        (bias.q_len, bias.k_len),
    )


def flash_dense(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor,
    scale: float,
    causal_mask: Tensor | None,
    square: bool,
) -> Tensor:
    """A dense bias (B|1, H|1, Lq, Lk) on the CPU flash kernel: with `square` causal scores the
    kernel masks the future itself and skips the blocks above the diagonal; any other mask
    goes into the bias as -inf."""
    if causal_mask is not None and not square:
        bias = bias.masked_fill(~causal_mask, float("-inf"))
    served.note(served.TORCH_FLASH)
    q, k, v, bias = q.contiguous(), k.contiguous(), v.contiguous(), bias.contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, bias)):
        return _FlashBiasedAttention.apply(
            q, k, v, bias, scale, causal_mask if square else None, None
        )
    out, _ = flash_ops.forward(q, k, v, square, bias, scale)
    return out
