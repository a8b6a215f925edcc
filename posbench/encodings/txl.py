"""Transformer-XL relative attention (Dai et al. 2019; mem_transformer.py's RelPartialLearnable).

score(i, j) = [ (q_i + u) . k_j  +  (q_i + v) . (W_kR R_{i-j}) ] * 1/sqrt(d)
which expands into the four terms (a) q.k, (b) q.W_kR R, (c) u.k_j, (d) v.W_kR R.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from posbench.encodings.registry import register_encoding
from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.tables import sinusoid
from posbench.bias_kinds import DistanceTableBias, KeyTableBias, Scores
from posbench.validation import Range

#: At drawn positions (square scores on the CPU) the table of distances serves terms (b) + (d)
#: while its products cost at most this times the per-key table's (_table_is_cheaper). Measured
#: (one layer, B 8, 4 heads of 32, fwd+bwd, C++ kernel): the two forms tie where the work does,
#: reach = 4 L (153 ms each at L = 1024 over 0..4095); reach = 2 L: 114 against 151 ms.
DRAWN_TABLE_WORK_RATIO = 1.0


@register_encoding("txl")
class TransformerXL(PositionalEncoding):
    """Transformer-XL: content and global biases u, v, its own W_kR, sinusoidal R of i - j.

    R is [sin | cos] concatenated (not interleaved). Distances above ``clamp_len`` use
    R_clamp_len. u and v are per layer ("untied", the original default) unless ``share_uv``.
    ``scale=False`` drops the 1/sqrt(d) the original code applies to the whole sum.
    Causal scores whose queries are the last keys (a segment, after its memory or not) hand
    attention terms (b)+(d) as (q + v) against the projected distance table (a
    DistanceTableBias), which posbench's C++ kernel (a segment without memory) or the rel-shift
    kernel runs a block of query rows at a time.
    At drawn positions, square causal scores take the same DistanceTableBias over the distances
    the positions reach (read at p_i - p_j) where its products cost no more than the per-key
    form's (the reach at most n_heads times the keys), carrying the per-key form for attention
    to take where posbench's C++ kernel does not run.
    Without clamp_len, terms (b)+(d) are also a dot product of a per-query vector and a per-key
    one (the sin/cos identity in docs/encodings/transformer-xl.md): at other drawn positions the
    blocked kernels run them as a KeyTableBias, without its skew. Each blocked form carries the
    unblocked one for attention to take where no kernel reads it (another device; attention
    chooses): q and k widened by the identity, keeping fused attention in
    linear memory, or with clamp_len one matmul of (q + v) against the projected distance table,
    then a gather. A single decoding query takes the position term against the distance table
    (at drawn positions, the shared position table), so cached keys stay d wide. No (Lq, Lk, d)
    tensor is ever built.
    """

    relative = True
    cost_note = (
        "terms (b) and (d) are a product of (q + v) with the distance table per block of rows "
        "on the CPU, inside posbench's C++ kernel where it is built (elsewhere they widen q "
        "and k by d_model), and u, v add two more"
    )

    def __init__(
        self,
        shape: AttentionShape,
        *,
        clamp_len: Annotated[int | None, Range(ge=1)] = None,
        scale: bool = True,
        share_uv: bool = False,
    ) -> None:
        super().__init__(shape)
        self.clamp_len = clamp_len
        self.scale = scale
        self.share_uv = share_uv
        n_uv = 1 if share_uv else shape.n_layers
        self.u = nn.Parameter(torch.randn(n_uv, shape.n_heads, shape.d_head) * 0.02)
        self.v = nn.Parameter(torch.randn(n_uv, shape.n_heads, shape.d_head) * 0.02)
        self.w_kr = nn.ModuleList(
            nn.Linear(self.d_model, self.d_model, bias=False) for _ in range(shape.n_layers)
        )

    def distance_embedding(self, distances: Tensor) -> Tensor:
        """R for each distance, (T, d_model) as [sin | cos], clamped to [0, clamp_len]."""
        if self.causal:
            distances = distances.clamp(min=0)  # negative distances are masked anyway
        if self.clamp_len is not None:
            distances = distances.clamp(max=self.clamp_len)
        sin, cos = sinusoid(distances, self.d_model)
        return torch.cat((sin, cos), dim=-1)

    def key_positions(self, span: Span, device: torch.device) -> Tensor:
        """[cos(j w) | sin(j w)] for the keys' absolute positions, (L, d_model), from a table
        that grows by doubling (never rebuilt per decoding step)."""

        def build(n: int) -> Tensor:
            sin, cos = sinusoid(torch.arange(n, device=device), self.d_model)
            return torch.cat((cos, sin), dim=-1)

        return self.position_rows("key_positions", span, device, build)

    def score(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext
    ) -> Scores:
        uv = 0 if self.share_uv else layer.index
        u, v = self.u[uv][:, None, :], self.v[uv][:, None, :]  # (H, 1, d)
        scale = 1.0 / math.sqrt(self.d_head) if self.scale else 1.0
        Lq, Lk = q.shape[2], k.shape[2]

        def unblocked() -> Scores:
            """Where no kernel reads the blocked forms: with clamp_len a gathered dense bias,
            else q and k widened by the identity, so fused attention keeps linear memory."""
            if self.clamp_len is not None:
                return self._score_gather(q, k, q_span, k_span, layer.index, u, v, scale)
            q_pos, k_pos = self._identity_vectors(q, k, q_span, k_span, layer.index, v)
            k_wide = torch.cat((k, k_pos.expand(*k.shape[:2], Lk, self.d_model)), dim=-1)
            return Scores(torch.cat((q + u, q_pos), dim=-1), k_wide, None, scale)

        # a block of query rows at a time, the queries the last keys (posbench's kernels)
        by_blocks = self.causal and 1 < Lq <= Lk and q_span.last == k_span.last
        if by_blocks:
            if q_span.contiguous and k_span.contiguous:
                table = self._distance_table(layer.index, Lk, q)  # distances 0..Lk-1
                bias = DistanceTableBias((q + v) * scale, table)
                return Scores(q + u, k, bias, scale, fallback=unblocked)
            positions = k_span.arange()
            reach = int(positions[-1] - positions[0]) + 1  # distances 0..reach-1
            if Lq == Lk and self._table_is_cheaper(reach, Lk):  # square: the C++ kernel's
                table = self._distance_table(layer.index, reach, q)

                def by_key() -> KeyTableBias:
                    q_pos, k_pos = self._identity_vectors(q, k, q_span, k_span, layer.index, v)
                    return KeyTableBias(q_pos * scale, k_pos[None])

                fallback = by_key if self.clamp_len is None else None
                bias = DistanceTableBias((q + v) * scale, table, positions, fallback)
                return Scores(q + u, k, bias, scale, fallback=unblocked)
        contiguous = q_span.contiguous and k_span.contiguous
        if self.causal and Lq == 1 and q_span.last == k_span.last and contiguous:
            # One decoding query: (q + v) against the distance table, (B, H, 1, Lk) once made
            # dense, so cached keys stay d wide and nothing per key is copied.
            table = self._distance_table(layer.index, Lk, q)
            return Scores(q + u, k, DistanceTableBias((q + v) * scale, table), scale)
        if self.clamp_len is not None:
            return self._score_gather(q, k, q_span, k_span, layer.index, u, v, scale)
        q_pos, k_pos = self._identity_vectors(q, k, q_span, k_span, layer.index, v)
        if q.shape[2] == 1:
            # One decoding query at drawn positions: the position term against the shared
            # table, (B, H, 1, Lk), so cached keys stay d wide and nothing per key is copied.
            return Scores(q + u, k, (q_pos @ k_pos.T) * scale, scale)
        if by_blocks:
            # drawn positions: the per-key table, a block of query rows at a time, q, k, v d wide
            bias = KeyTableBias(q_pos * scale, k_pos[None])
            return Scores(q + u, k, bias, scale, fallback=unblocked)
        return unblocked()

    def _identity_vectors(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: int, v: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Terms (b) + (d) as a dot product of per-query vectors (B, H, Lq, d_model) and per-key
        ones (Lk, d_model), one table for all. With a_i = q_i + v and W_kR's head block split
        into its sin and cos columns [A | B]: alpha = A^T a_i, beta = B^T a_i, and
          a_i . W_kR R_{i-j} = sum_k alpha_k sin((i-j)w_k) + beta_k cos((i-j)w_k)
          = [alpha sin(iw) + beta cos(iw) | beta sin(iw) - alpha cos(iw)] . [cos(jw) | sin(jw)]
        """
        H, d, half = self.n_heads, self.d_head, self.d_model // 2
        w = self.w_kr[layer].weight.view(H, d, self.d_model)  # (H, d, d_model)
        ab = (q + v) @ w  # (B, H, Lq, d_model) = [alpha | beta]
        alpha, beta = ab[..., :half], ab[..., half:]
        cos_i, sin_i = (
            self.key_positions(q_span, q.device).to(q.dtype).split(half, dim=-1)
        )  # (Lq, half)
        q_pos = torch.cat((alpha * sin_i + beta * cos_i, beta * sin_i - alpha * cos_i), dim=-1)
        return q_pos, self.key_positions(k_span, k.device).to(k.dtype)

    def _distance_table(self, layer: int, n: int, like: Tensor) -> Tensor:
        """W_kR R for distances 0..n-1, (H, n, d), in `like`'s dtype and device."""
        embedding = self.position_table(  # R for 0..n-1, from a table kept across calls
            "distance_embedding",
            n,
            like.device,
            lambda size: self.distance_embedding(torch.arange(size, device=like.device)),
        )
        table = self.w_kr[layer](embedding.to(like.dtype))  # (n, d_model)
        return table.view(n, self.n_heads, self.d_head).transpose(0, 1)

    def _table_is_cheaper(self, reach: int, keys: int) -> bool:
        """At drawn positions, whether terms (b) + (d) cost less against the table of the
        `reach` distances the keys span (d wide) than against the per-key table (d_model wide):
        a block's products are rows x reach x d against rows x keys x d_model."""
        return reach * self.d_head <= DRAWN_TABLE_WORK_RATIO * keys * self.d_model

    def score_terms(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext
    ) -> dict[str, Tensor]:
        """The four terms of Dai et al.'s decomposition, each scaled as the score is: (a) q.k,
        (b) q.W_kR R_{i-j}, (c) u.k, (d) v.W_kR R_{i-j}; formed explicitly from the distance
        embeddings (dense in Lq x Lk, for probes on short inputs)."""
        uv = 0 if self.share_uv else layer.index
        u, v = self.u[uv], self.v[uv]  # (H, d)
        scale = 1.0 / math.sqrt(self.d_head) if self.scale else 1.0
        H, d = self.n_heads, self.d_head
        rel = self.relative_positions(q_span, k_span, q.device)  # (Lq, Lk)
        r = self.w_kr[layer.index](
            self.distance_embedding(rel.flatten()).to(q.dtype)
        )  # (Lq Lk, d_model)
        r = r.view(*rel.shape, H, d)  # (Lq, Lk, H, d)
        return {
            "a content": scale * (q @ k.transpose(-1, -2)),
            "b content-position": scale * torch.einsum("bhid,ijhd->bhij", q, r),
            "c content bias": scale * torch.einsum("hd,bhjd->bhj", u, k)[:, :, None, :],
            "d position bias": scale * torch.einsum("hd,ijhd->hij", v, r)[None],
        }

    def _score_gather(
        self,
        q: Tensor,
        k: Tensor,
        q_span: Span,
        k_span: Span,
        layer: int,
        u: Tensor,
        v: Tensor,
        scale: float,
    ) -> Scores:
        """clamp_len breaks the dot-product identity: (q + v) against the projected table of
        the distinct distances the spans need (at most clamp_len + 1 of them when causal), one
        matmul, then a gather."""
        B, H, Lq, d = q.shape
        Lk = k.shape[2]
        lo = max(q_span.first - k_span.last, 0 if self.causal else -self.clamp_len)
        hi = min(q_span.last - k_span.first, self.clamp_len)
        distances = torch.arange(lo, hi + 1, device=q.device)  # (T,)
        r = self.w_kr[layer](self.distance_embedding(distances).to(q.dtype))  # (T, d_model)
        r = r.view(-1, H, d).transpose(0, 1)  # (H, T, d)
        bd_table = (q + v) @ r.transpose(-1, -2)  # (B, H, Lq, T): terms (b) + (d)
        index = self.relative_positions(q_span, k_span, q.device).clamp(lo, hi) - lo  # (Lq, Lk)
        bd = bd_table.gather(-1, index.expand(B, H, Lq, Lk))  # (B, H, Lq, Lk)
        return Scores(q + u, k, bd * scale, scale)  # terms (a) + (c) in the dot product
