"""Self-attention (causal by default) that takes any positional encoding through its hooks."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.cache import Cache
from posbench.encodings.base import LayerContext, PositionalEncoding, Span
from posbench.bias_kinds import BandBias, DistanceTableBias, KeyTableBias, RowBlockBias
from posbench.kernels import dispatch
from posbench.kernels.cpu import process_environment_kept
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
        d_v = v.shape[-1]
        call = dispatch.Call(
            q,
            k,
            v,
            mask=causal_mask(q_len, k_len, x.device) if self.causal and q_len > 1 else None,
            causal=self.causal,
            square=self.causal and k_len == q_len,  # causal, and no memory held
            distance=lambda lo, hi: encoding.distance_bias(lo, hi, context, q.device),
            reach=(span.first - k_span.last, span.last - k_span.first),
            widest=span.last - span.first,
            positions=lambda: (span.arange(q.device), k_span.arange(q.device)),
            drawn=None if span.contiguous else span.arange(),
            make_scores=lambda: encoding.score(q, k, span, k_span, context),
        )
        y = dispatch.attend(call)[..., :d_v]  # (B, H, L, d): a widened q widened v too
        return self.out(y.transpose(1, 2).reshape(B, L, D))


#: The hooks run on the meta device at most this long to learn the scores' shape (a dense bias,
#: a band of some width, augmented q and k), which then scales to the length asked about.
SHAPE_PROBE_LENGTH = 8192


def attention_tensor_bytes(encoding: PositionalEncoding, batch_size: int, length: int) -> int:
    """Analytic size of the largest attention-side tensor for a sequence of `length`: the
    dense (B, H, L, L) score matrix when the encoding adds a dense bias (the mask SDPA must
    read), the (B, H, L, W) band of a BandBias, the per-query vectors of a table bias, one
    block of rows of a RowBlockBias, else the
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
    elif isinstance(scores.bias, (DistanceTableBias, KeyTableBias)):  # tables, a block of rows
        sizes.append(scores.bias.a.numel() // probe * L)  # at a time: (B, H, L, d) at most
    elif isinstance(scores.bias, RowBlockBias):  # one block of query rows at a time
        sizes.append(B * H * L * max(1, dispatch.BLOCK_ELEMENTS // (B * H * L)))
    elif scores.bias is not None:
        sizes.append(B * H * L * L)
    return 4 * max(sizes)
