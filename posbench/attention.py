"""Self-attention (causal by default) that takes any positional encoding through its hooks."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.cache import Cache
from posbench.encodings.base import LayerContext, PositionalEncoding, Span
from posbench.kernels import served
from posbench.kernels.bias_types import BandBias, RowBlockBias
from posbench.kernels.cpu import process_environment_kept
from posbench.kernels.row_block_attention import BLOCK_ELEMENTS
from posbench.kernels.biased_attention import biased_attention, fused_applies, needs_gradient
from posbench.kernels.fused_band_attention import distance_band, fused_band_attention
from posbench.kernels.flex_bias import flex_available, flex_distance_attention, flex_failed
from posbench.kernels.masks import causal_mask


class SelfAttention(nn.Module):
    """Multi-head attention; the encoding is passed in, never named. Causal (each query sees
    keys up to its own position) unless ``causal=False``, when every query sees every key."""

    def __init__(self, d_model: int, n_heads: int, layer: int, causal: bool = True) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads, self.d_head, self.layer, self.causal = (
            n_heads,
            d_model // n_heads,
            layer,
            causal,
        )
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def _heads(self, x: Tensor) -> Tensor:
        return x.unflatten(-1, (self.n_heads, self.d_head)).transpose(-3, -2)  # (..., H, T, d)

    def project_q(self, x: Tensor) -> Tensor:
        """The layer's query projection of rows x (T, d_model) -> (H, T, d)."""
        d = self.n_heads * self.d_head
        return self._heads(F.linear(x, self.qkv.weight[:d], self.qkv.bias[:d]))

    def project_k(self, x: Tensor) -> Tensor:
        """The layer's key projection of rows x (T, d_model) -> (H, T, d)."""
        d = self.n_heads * self.d_head
        return self._heads(F.linear(x, self.qkv.weight[d : 2 * d], self.qkv.bias[d : 2 * d]))

    def forward(
        self, x: Tensor, span: Span, encoding: PositionalEncoding, cache: Cache | None
    ) -> Tensor:
        B, L, D = x.shape
        q, k, v = (self._heads(t) for t in self.qkv(x).split(D, dim=-1))  # each (B, H, L, d)
        context = LayerContext(self.layer, self.project_q, self.project_k)
        q, k = encoding.rotate(q, k, span, context)
        k_span = span
        if cache is not None:
            k, v, k_span = cache.extend(self.layer, k, v)  # (B, H, M + L, d)
        q_len, k_len = q.shape[2], k.shape[2]
        scale = 1.0 / math.sqrt(self.d_head)
        if q_len > 1 and flex_available(q.device, q.shape[-1]):
            lo, hi = span.first - k_span.last, span.last - k_span.first
            values = encoding.distance_bias(lo, hi, context, q.device)  # (H, hi - lo + 1)
            if values is not None:  # a bias of (head, i - j) alone: flex reads it per distance
                try:
                    served.note(served.FLEX)
                    y = flex_distance_attention(
                        q,
                        k,
                        v,
                        values,
                        lo,
                        span.arange(q.device),
                        k_span.arange(q.device),
                        scale,
                        self.causal,
                    )
                    return self.out(y.transpose(1, 2).reshape(B, L, D))
                except Exception as error:  # a torch or driver that cannot compile it
                    flex_failed(error)
        square = self.causal and k_span is span  # causal, each query the last of its keys
        if square and fused_applies(q, v, learned=True):
            # the C++ kernel reads a bias of (head, p_i - p_j) alone as a one-row band
            widest = span.last - span.first
            values = encoding.distance_bias(0, widest, context, q.device)  # (H, widest + 1)
            if values is not None and fused_applies(q, v, needs_gradient(values)):
                positions = None if span.contiguous else span.arange()
                band = distance_band(values.to(q.dtype))  # (1, H, 1, widest + 1)
                y = fused_band_attention(q, k, v, band, scale, positions)
                return self.out(y.transpose(1, 2).reshape(B, L, D))
        scores = encoding.score(q, k, span, k_span, context)
        d_v = v.shape[-1]
        if scores.q.shape[-1] != d_v and q_len > 1:
            # Folded encodings widen q and k; flash attention needs v just as wide. A single
            # decoding query needs no kernel, so the cached values are not copied per token.
            v = F.pad(v, (0, scores.q.shape[-1] - d_v))
        mask = causal_mask(q_len, k_len, x.device) if self.causal and q_len > 1 else None
        if scores.bias is None:
            if square and fused_applies(scores.q, v, learned=False):  # the C++ kernel, no bias
                no_bias = scores.q.new_empty(1, scores.q.shape[1], 1, 0)
                y = fused_band_attention(scores.q, scores.k, v, no_bias, scores.scale)
            elif self.causal and q_len == k_len:  # the fused causal fast path
                served.note(served.TORCH_SDPA)
                y = F.scaled_dot_product_attention(
                    scores.q, scores.k, v, is_causal=True, scale=scores.scale
                )
            else:
                served.note(served.TORCH_SDPA)
                y = F.scaled_dot_product_attention(
                    scores.q, scores.k, v, attn_mask=mask, scale=scores.scale
                )
        else:
            y = biased_attention(
                scores.q, scores.k, v, scores.bias, scores.scale, mask
            )  # (B, H, L, d')
        y = y[..., :d_v]
        return self.out(y.transpose(1, 2).reshape(B, L, D))


#: The hooks run on the meta device at most this long to learn the scores' shape (a dense bias,
#: a band of some width, augmented q and k), which then scales to the length asked about.
SHAPE_PROBE_LENGTH = 8192


def attention_tensor_bytes(encoding: PositionalEncoding, batch_size: int, length: int) -> int:
    """Analytic size of the largest attention-side tensor for a sequence of `length`: the
    dense (B, H, L, L) score matrix when the encoding adds a dense bias (the mask SDPA must
    read), the (B, H, L, W) band of a BandBias, one block of rows of a RowBlockBias, else the
    largest of the augmented q and k
    (fused attention never forms the scores). Found by running the hooks on the meta device,
    which computes shapes only, at up to SHAPE_PROBE_LENGTH positions: tables an encoding keeps
    on the CPU are never built for the length itself."""
    B, H, d, L = batch_size, encoding.n_heads, encoding.d_head, length
    meta = torch.device("meta")
    probe = min(L, SHAPE_PROBE_LENGTH)  # kept tables grow with the length: never build L's
    q = torch.empty(B, H, probe, d, device=meta)
    ctx = LayerContext(
        0, lambda t: t.new_empty(H, t.shape[0], d), lambda t: t.new_empty(H, t.shape[0], d)
    )
    try:
        with process_environment_kept():  # meta operations import torch's compiler
            on_meta = copy.deepcopy(encoding).to(meta)
            q2, k2 = on_meta.rotate(q, q.clone(), Span(0, probe), ctx)
            scores = on_meta.score(q2, k2, Span(0, probe), Span(0, probe), ctx)
    except Exception:  # an encoding whose hooks cannot run on meta: assume dense scores
        return 4 * B * H * L * L
    sizes = [scores.q.numel() // probe * L, scores.k.numel() // probe * L]
    if isinstance(scores.bias, BandBias):
        sizes.append(B * H * L * scores.bias.width)  # plus blocks of ROWS x (ROWS + W - 1) pairs
    elif isinstance(scores.bias, RowBlockBias):  # one block of query rows at a time
        sizes.append(B * H * L * max(1, BLOCK_ELEMENTS // (B * H * L)))
    elif scores.bias is not None:
        sizes.append(B * H * L * L)
    return 4 * max(sizes)
