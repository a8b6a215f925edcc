"""DeBERTa disentangled attention (He et al.; HF deberta_v2's DisentangledSelfAttention).

score(i, j) = [ Qc_i . Kc_j + Qc_i . Kr_{δ(i,j)} + Kc_j . Qr_{δ(i,j)} ] / sqrt(3d)
with δ(i, j) = clamp(i - j + k, 0, 2k - 1). The paper writes the p2c index as δ(j, i); HF's
code gathers it so that it ends up indexed by the same δ(i, j) as c2p, and so do we.
The position-to-position term is dropped, as in the paper.
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from posbench.encodings.registry import register_encoding
from posbench.errors import OptionError
from posbench.encodings.base import (
    AttentionShape,
    IndexedTable,
    LayerContext,
    PositionalEncoding,
    Span,
)
from posbench.bias_kinds import BandBias, BandProduct, Scores
from posbench.validation import Range


def log_bucket_position(relative_pos: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """HF's make_log_bucket_position: exact within bucket_size/2, logarithmic beyond."""
    sign = torch.sign(relative_pos)
    mid = bucket_size // 2
    abs_pos = torch.where(
        (relative_pos < mid) & (relative_pos > -mid),
        torch.full_like(relative_pos, mid - 1),
        relative_pos.abs(),
    )
    log_pos = (
        torch.ceil(
            torch.log(abs_pos.double() / mid) / math.log((max_position - 1) / mid) * (mid - 1)
        )
        + mid
    )
    return torch.where(abs_pos <= mid, relative_pos.double(), log_pos * sign).long()


@register_encoding("deberta")
class DeBERTa(PositionalEncoding):
    """DeBERTa: content-to-position and position-to-content terms, scale 1/sqrt(3d).

    ``span`` is k: relative distances are clamped to [-k, k - 1] over 2k shared embeddings.
    ``position_buckets`` > 0 maps distances to log buckets first (DeBERTa v2/v3), with that
    many buckets per side and ``span`` as the largest distance. ``share_att_key`` projects the
    relative embeddings with the layer's own query/key projections instead of separate ones.
    Causal square scores longer than the span are a BandBias (see ``_band_scores``).

    The bias of the key projection of the relative embeddings adds Qc_i . b to every key of
    query i, a per-row constant that softmax ignores: its true gradient is zero (kept for
    parity with Hugging Face, declared in ``gradient_free``).
    """

    gradient_free = ("pos_key_proj.*.bias",)

    relative = True
    cost_note = (
        "c2p and p2c project a (2k, d) position table per layer and gather it twice per pair"
    )

    def __init__(
        self,
        shape: AttentionShape,
        *,
        span: Annotated[int, Range(ge=1)] = 64,
        position_buckets: Annotated[int, Range(ge=0)] = 0,
        share_att_key: bool = False,
    ) -> None:
        super().__init__(shape)
        if position_buckets and (position_buckets < 2 or span <= position_buckets // 2 + 1):
            raise OptionError(
                "encoding 'deberta': position_buckets must be 0 (off) or >= 2 with span > "
                "position_buckets/2 + 1, "
                f"got position_buckets={position_buckets}, span={span}."
            )
        self.span = span
        self.position_buckets = position_buckets
        self.att_span = position_buckets if position_buckets > 0 else span
        self.share_att_key = share_att_key
        self.rel_embeddings = nn.Embedding(2 * self.att_span, self.d_model)
        nn.init.normal_(self.rel_embeddings.weight, std=0.02)
        if not share_att_key:
            self.pos_key_proj = nn.ModuleList(
                nn.Linear(self.d_model, self.d_model) for _ in range(shape.n_layers)
            )
            self.pos_query_proj = nn.ModuleList(
                nn.Linear(self.d_model, self.d_model) for _ in range(shape.n_layers)
            )

    def delta_of(self, distance: Tensor) -> Tensor:
        """δ = clamp(i - j + k, 0, 2k - 1) of each distance i - j (log-bucketed first with
        position_buckets): the row of the relative embeddings a pair reads."""
        if self.position_buckets > 0:
            distance = log_bucket_position(distance, self.position_buckets, self.span)
        return (distance + self.att_span).clamp(0, 2 * self.att_span - 1)

    def delta(self, q_span: Span, k_span: Span, device: torch.device) -> Tensor:
        """δ(i, j) for every pair, (Lq, Lk), from a per-distance table."""
        return self.distance_lookup("delta", q_span, k_span, device, self.delta_of)

    def indexed_tables(self) -> list[IndexedTable]:
        """The relative embeddings' rows are read by δ of each (query, key) pair."""
        return [
            IndexedTable(
                "rel_embeddings.weight",
                "relative embedding",
                2 * self.att_span,
                lambda q, k: self.delta_of(q[:, None] - k[None, :]),
                fix=self.reaching_span,
            )
        ]

    def reaching_span(self, longest: int) -> str | None:
        """The largest span that lets training distances up to `longest` reach every row
        evaluation reads (without log buckets): causal, rows k .. 2k - 1, so k = longest + 1;
        bidirectional, rows 0 .. 2k - 1 (distances -k .. k - 1), so k = longest."""
        if self.position_buckets > 0:
            return None
        return f"span = {longest + 1 if self.causal else max(1, longest)} would reach them all"

    @torch.compiler.assume_constant_result
    def _band_width(self, length: int) -> int:
        """The band width of causal scores over `length` positions: one past the last distance
        whose δ is not the far one. It follows from the options alone (a constant to
        torch.compile, which cannot trace a width read off a tensor)."""
        last_row = Span(length - 1, length), Span(0, length)  # distances L - 1 .. 0
        far = 2 * self.att_span - 1
        return BandBias.width_for(self.delta(*last_row, torch.device("cpu"))[0].flip(0), far)

    def projected_positions(self, layer: LayerContext, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Kr and Qr, each (H, 2k, d)."""
        p = self.rel_embeddings.weight.to(dtype)  # (2k, d_model)
        if self.share_att_key:
            return layer.project_k(p), layer.project_q(p)
        H, d = self.n_heads, self.d_head
        kr = self.pos_key_proj[layer.index](p).view(-1, H, d).transpose(0, 1)
        qr = self.pos_query_proj[layer.index](p).view(-1, H, d).transpose(0, 1)
        return kr, qr

    def score(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext
    ) -> Scores:
        B, H, Lq, d = q.shape
        scale = 1.0 / math.sqrt(3 * d)
        kr, qr = self.projected_positions(layer, q.dtype)
        if self.causal and q_span.same_positions(k_span):
            far = 2 * self.att_span - 1  # δ of every key far enough back
            width = self._band_width(Lq)
            if Lq > width and not q_span.contiguous:
                return self._drawn_band_scores(q, k, kr, qr, q_span, width, far, scale)
            if Lq > width:
                last_row = Span(Lq - 1, Lq), Span(0, Lq)  # the last query's distances L - 1 .. 0
                band_deltas = self.delta(*last_row, q.device)[0, Lq - width :]  # i - W + 1 .. i
                return self._band_scores(q, k, kr, qr, band_deltas, far, scale)
        if Lq == 1:
            return self._decoding_scores(q, k, q_span, k_span, kr, qr, scale)
        c2p, p2c = self._relative_terms(q, k, q_span, k_span, kr, qr)
        return Scores(q, k, (c2p + p2c) * scale, scale)

    def _decoding_scores(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, kr: Tensor, qr: Tensor, scale: float
    ) -> Scores:
        """One query (a decoding step): every key whose δ is the far one reads Qr_far . Kc_j,
        which moves into the query (q + Qr_far), so position-to-content is formed only for the
        keys whose δ differs (at most the span), not for every cached key."""
        B, H, _, _ = q.shape
        Lk = k.shape[2]
        far = 2 * self.att_span - 1
        delta = self.delta(q_span, k_span, torch.device("cpu"))[0]  # (Lk,)
        near = (delta != far).nonzero()[:, 0]  # (n,): found on the CPU, so no GPU step waits
        delta, near = delta.to(q.device), near.to(q.device)
        c2p_table = torch.einsum("bhqd,hrd->bhqr", q, kr)  # (B, H, 1, 2k), kr not copied per b
        c2p = c2p_table.gather(-1, delta.expand(B, H, 1, Lk))  # (B, H, 1, Lk)
        p2c_near = torch.linalg.vecdot(
            qr[:, delta[near]] - qr[:, far, None], k[:, :, near]
        )  # (B, H, n): (Qr_δ - Qr_far) . Kc_j
        bias = c2p.index_add(-1, near, p2c_near[:, :, None])  # (B, H, 1, Lk)
        return Scores(q + qr[:, None, far], k, bias * scale, scale)

    def _relative_terms(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, kr: Tensor, qr: Tensor
    ) -> tuple[Tensor, Tensor]:
        """c2p = Qc_i . Kr_δ(i,j) and p2c = Qr_δ(i,j) . Kc_j, each (B, H, Lq, Lk), unscaled."""
        B, H, Lq, _ = q.shape
        Lk = k.shape[2]
        delta = self.delta(q_span, k_span, q.device)  # (Lq, Lk)
        c2p = (q @ kr.transpose(-1, -2)).gather(-1, delta.expand(B, H, Lq, Lk))  # (B, H, Lq, Lk)
        p2c_table = qr @ k.transpose(-1, -2)  # (B, H, 2k, Lk): Qr_r . Kc_j
        p2c = p2c_table.gather(-2, delta.expand(B, H, Lq, Lk))  # (B, H, Lq, Lk)
        return c2p, p2c

    def score_terms(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext
    ) -> dict[str, Tensor]:
        """DeBERTa's three terms, each scaled by 1/sqrt(3d): content-to-content, content-to-position
        and position-to-content (dense, for probes on short inputs)."""
        scale = 1.0 / math.sqrt(3 * self.d_head)
        kr, qr = self.projected_positions(layer, q.dtype)
        c2p, p2c = self._relative_terms(q, k, q_span, k_span, kr, qr)
        return {"c2c": scale * (q @ k.transpose(-1, -2)), "c2p": scale * c2p, "p2c": scale * p2c}

    def _drawn_band_scores(
        self,
        q: Tensor,
        k: Tensor,
        kr: Tensor,
        qr: Tensor,
        span: Span,
        W: int,
        far: int,
        scale: float,
    ) -> Scores:
        """_band_scores at drawn positions p: distinct increasing positions put keys W or more
        tokens back at least W positions back, so they read δ = far as before, and only the
        band's δ change from row to row: δ(i, c) of key j = i - W + 1 + c, gathered from each
        query's c2p row and each key's p2c row."""
        B, H, L, d = q.shape
        keys, distance = span.band(W, q.device)  # (L, W) each
        deltas = self.delta_of(distance)  # (L, W)
        rows = kr.shape[1]  # 2k
        # scaled on the (H, 2k, d) tables, as in _band_scores
        c2p = (q @ ((kr - kr[:, far, None]) * scale).transpose(-1, -2)).gather(
            -1, deltas.expand(B, H, L, W)
        )  # (B, H, L, W): Qc_i . (Kr_δ - Kr_far)
        p2c_rows = k @ ((qr - qr[:, far, None]) * scale).transpose(-1, -2)  # (B, H, L, 2k)
        p2c = (
            p2c_rows.flatten(-2)
            .gather(-1, (keys * rows + deltas).flatten().expand(B, H, L * W))
            .view(B, H, L, W)
        )  # (Qr_δ - Qr_far) . Kc_j
        row_constant = BandProduct(q, kr[:, None, far] * scale)  # Qc_i . Kr_far
        return Scores(q + qr[:, None, far], k, BandBias(c2p + p2c, row_constant), scale)

    @staticmethod
    def _band_scores(
        q: Tensor, k: Tensor, kr: Tensor, qr: Tensor, band_deltas: Tensor, far: int, scale: float
    ) -> Scores:
        """Causal square scores past the span: keys W or more back all read δ = far, so
        Qc_i . Kr_far is a row constant and Qr_far . Kc_j moves into the queries (q + Qr_far);
        what is left lives in a band of W keys, two products with tables by distance that
        attention forms where it reads them. band_deltas (W,): δ of keys i - W + 1 .. i."""
        q = q.contiguous()  # (B, H, L, d): read by two products, each needs it contiguous
        by_distance = band_deltas.flip(0)  # δ of distances 0 .. W - 1
        # scaled here, on the (H, W, d) tables
        kr_band = (kr[:, by_distance] - kr[:, far, None]) * scale  # (H, W, d)
        qr_band = (qr[:, by_distance] - qr[:, far, None]) * scale  # (H, W, d)
        bias = BandBias(
            BandProduct(q, kr_band),  # Qc_i . (Kr_δ - Kr_far)
            BandProduct(q, kr[:, None, far] * scale),  # the row constant Qc_i . Kr_far
            key_band=BandProduct(k, qr_band),  # (Qr_δ - Qr_far) . Kc_j
        )
        return Scores(q + qr[:, None, far], k, bias, scale)
