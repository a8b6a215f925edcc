"""Transformer-XL relative attention (Dai et al. 2019; mem_transformer.py's RelPartialLearnable).

score(i, j) = [ (q_i + u) . k_j  +  (q_i + v) . (W_kR R_{i-j}) ] * 1/sqrt(d)
which expands into the four terms (a) q.k, (b) q.W_kR R, (c) u.k_j, (d) v.W_kR R.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posbench.encodings import register_encoding
from posbench.encodings.base import LayerContext, PositionalEncoding, Scores, Span, sinusoid


@register_encoding("txl")
class TransformerXL(PositionalEncoding):
    """Transformer-XL: content and global biases u, v, its own W_kR, sinusoidal R of i - j.

    R is [sin | cos] concatenated (not interleaved). Distances above ``clamp_len`` use
    R_clamp_len. u and v are per layer ("untied", the original default) unless ``share_uv``.
    ``scale=False`` drops the 1/sqrt(d) the original code applies to the whole sum.
    Terms (b)+(d) are one matmul of (q + v) against the projected table of the distances the
    spans need, then a gather: no (Lq, Lk, d) tensor is ever built.
    """

    relative = True

    def __init__(
        self,
        n_heads: int,
        d_head: int,
        causal: bool = True,
        n_layers: int = 1,
        *,
        clamp_len: int | None = None,
        scale: bool = True,
        share_uv: bool = False,
    ) -> None:
        super().__init__(n_heads, d_head, causal, n_layers)
        self.clamp_len = clamp_len
        self.scale = scale
        self.share_uv = share_uv
        n_uv = 1 if share_uv else n_layers
        self.u = nn.Parameter(torch.randn(n_uv, n_heads, d_head) * 0.02)
        self.v = nn.Parameter(torch.randn(n_uv, n_heads, d_head) * 0.02)
        self.w_kr = nn.ModuleList(nn.Linear(self.d_model, self.d_model, bias=False) for _ in range(n_layers))

    def distance_embedding(self, distances: Tensor) -> Tensor:
        """R for each distance, (T, d_model) as [sin | cos], clamped to [0, clamp_len]."""
        if self.causal:
            distances = distances.clamp(min=0)  # negative distances are masked anyway
        if self.clamp_len is not None:
            distances = distances.clamp(max=self.clamp_len)
        sin, cos = sinusoid(distances, self.d_model)
        return torch.cat((sin, cos), dim=-1)

    def score(self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext) -> Scores:
        B, H, Lq, d = q.shape
        Lk = k.shape[2]
        uv = 0 if self.share_uv else layer.index
        u, v = self.u[uv][:, None, :], self.v[uv][:, None, :]  # (H, 1, d)
        scale = 1.0 / math.sqrt(d) if self.scale else 1.0

        d_min = q_span.start - (k_span.stop - 1)
        d_max = q_span.stop - 1 - k_span.start
        distances = torch.arange(d_min, d_max + 1, device=q.device)  # (T,), T = Lq + Lk - 1
        r = self.w_kr[layer.index](self.distance_embedding(distances).to(q.dtype))  # (T, d_model)
        r = r.view(-1, H, d).transpose(0, 1)  # (H, T, d)
        bd_table = (q + v) @ r.transpose(-1, -2)  # (B, H, Lq, T): terms (b) + (d)
        index = self.relative_positions(q_span, k_span, q.device) - d_min  # (Lq, Lk)
        bd = bd_table.gather(-1, index.expand(B, H, Lq, Lk))  # (B, H, Lq, Lk)
        return Scores(q + u, k, bd * scale, scale)  # terms (a) + (c) in the dot product
