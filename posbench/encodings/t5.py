"""T5 relative position bias (Raffel et al.): a learned scalar per head and log bucket."""

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
from posbench.bias_kinds import BandBias, toeplitz
from posbench.validation import Range


def t5_bucket(
    relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> Tensor:
    """Bucket of relative_position = key - query, as in HF T5Attention._relative_position_bucket.

    Causal: n = max(i - j, 0) (future keys land in bucket 0). Bidirectional: half the buckets
    per direction, offset by num_buckets/2 for keys after the query. Exact buckets below
    nb/2, logarithmic up to max_distance, capped at nb - 1."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = (
        max_exact
        + (
            torch.log(n.float().clamp(min=1) / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).long()
    )
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, n, large)


@register_encoding("t5")
class T5Bias(PositionalEncoding):
    """T5 bias: bias[h, i, j] = table[bucket(j - i), h]; one table shared by all layers.

    The bias is built per distance (Lq + Lk - 1 values per head) and expanded to the
    (Lq, Lk) Toeplitz matrix; buckets come from a per-distance table that grows by doubling,
    so decoding through the cache never recomputes them for the whole prefix. Causal scores
    longer than max_distance are a BandBias: every distance past max_distance reads the last
    bucket, so only the band of max_distance keys carries a bias relative to it."""

    relative = True
    cost_note = (
        "its learned bias is one value per head and distance, which posbench's C++ kernel adds "
        "block by block and whose gradient it sums per distance; without that kernel, a band "
        "of W keys runs beside the flash kernel"
    )

    def __init__(
        self,
        shape: AttentionShape,
        *,
        num_buckets: Annotated[int, Range(ge=2)] = 32,
        max_distance: Annotated[int, Range(ge=2)] = 128,
        bidirectional: bool | None = None,
        per_layer: bool = False,
    ) -> None:
        super().__init__(shape)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = (not shape.causal) if bidirectional is None else bidirectional
        exact = num_buckets // (4 if self.bidirectional else 2)  # exact buckets per direction
        if exact < 1 or max_distance <= exact:
            raise OptionError(
                f"encoding 't5': needs num_buckets >= {4 if self.bidirectional else 2} and "
                "max_distance > "
                f"the {max(exact, 1)} exact buckets, got num_buckets={num_buckets}, "
                f"max_distance={max_distance}."
            )
        self.tables = nn.ModuleList(
            nn.Embedding(num_buckets, shape.n_heads)
            for _ in range(shape.n_layers if per_layer else 1)
        )
        for table in self.tables:
            nn.init.normal_(table.weight, std=0.02)

    def bucket_of(self, distance: Tensor) -> Tensor:
        """T5's bucket of each distance i - j (relative_position = j - i in its code)."""
        return t5_bucket(-distance, self.bidirectional, self.num_buckets, self.max_distance)

    def indexed_tables(self) -> list[IndexedTable]:
        """Each bias table's rows are buckets, read by the distance of each (query, key) pair."""
        return [
            IndexedTable(
                f"tables.{i}.weight",
                "bucket",
                self.num_buckets,
                lambda q, k: self.bucket_of(q[:, None] - k[None, :]),
                fix=self.reaching_max_distance,
            )
            for i in range(len(self.tables))
        ]

    def reaching_max_distance(self, longest: int) -> str:
        """The options that let training distances up to `longest` reach every bucket: the
        largest max_distance that does, else the most buckets that can with some max_distance."""
        distances = torch.arange(-longest if self.bidirectional else 0, longest + 1)
        per_side = 4 if self.bidirectional else 2
        for num_buckets in range(self.num_buckets, per_side - 1, -1):
            exact = num_buckets // per_side
            for max_distance in range(
                self.max_distance - 1 if num_buckets == self.num_buckets else longest + 1, exact, -1
            ):
                if (
                    len(
                        t5_bucket(
                            -distances, self.bidirectional, num_buckets, max_distance
                        ).unique()
                    )
                    == num_buckets
                ):
                    if num_buckets == self.num_buckets:
                        return f"max_distance = {max_distance} would reach them all"
                    return (
                        f"no max_distance does with {self.num_buckets} buckets; "
                        f"num_buckets = {num_buckets} with max_distance = {max_distance} would"
                    )
        return "no bucket layout reaches them: train on longer sequences"

    def _drawn_band(self, span: Span, W: int, table: nn.Embedding, device: torch.device) -> Tensor:
        """The band (1, H, L, W) at drawn positions p: row i, column c is key j = i - W + 1 + c
        at distance p_i - p_j, relative to the last bucket. Drawn positions are distinct and
        increasing, so p_i - p_j >= i - j: keys W or more tokens back are at least W positions
        back and read the last bucket, exactly as in the plain band."""
        _, distance = span.band(W, device)  # (L, W)
        last = table.weight[self.num_buckets - 1]  # (H,)
        band = table(self.bucket_of(distance)) - last  # (L, W, H)
        return band.permute(2, 0, 1)[None]  # (1, H, L, W)

    def buckets(self, q_span: Span, k_span: Span, device: torch.device) -> Tensor:
        """Bucket of each distance i - j from the spans' nearest to farthest reach, ascending,
        (Lq + Lk - 1,) for contiguous spans."""
        return self.distance_values(
            "buckets",
            q_span.first - k_span.last,
            q_span.last - k_span.first,
            device,
            self.bucket_of,
        )

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor | BandBias:
        table = self.tables[layer.index if len(self.tables) > 1 else 0]
        banded = (
            self.causal
            and not self.bidirectional
            and q_span.same_positions(k_span)
            and len(q_span) > self.max_distance
        )
        if not (q_span.contiguous and k_span.contiguous) and not banded:  # drawn: not Toeplitz
            return table(
                self.distance_lookup("buckets", q_span, k_span, device, self.bucket_of)
            ).permute(2, 0, 1)  # (H, Lq, Lk)
        if banded:
            # every distance >= max_distance reads the last bucket (the log term reaches 1 before
            # the cap): the band holds the nearer buckets relative to it, the last is a constant
            D = self.max_distance
            W = BandBias.width_for(
                self.buckets(Span(0, D), Span(0, D), torch.device("cpu"))[D - 1 :],
                self.num_buckets - 1,
            )
            last = table.weight[self.num_buckets - 1]  # (H,)
            if not q_span.contiguous:
                return BandBias(
                    self._drawn_band(q_span, W, table, device), last[None, :, None, None]
                )
            buckets = self.buckets(Span(0, D), Span(0, D), device)[D - 1 :]  # distances 0 .. D - 1
            band = (table(buckets[:W].flip(0)) - last).T  # (H, W), column c is distance W - 1 - c
            return BandBias(band[None, :, None, :], last[None, :, None, None])
        lo, hi = q_span.first - k_span.last, q_span.last - k_span.first
        per_distance = self.distance_bias(lo, hi, layer, device)  # (H, Lq + Lk - 1)
        return toeplitz(per_distance, len(q_span), len(k_span))  # (H, Lq, Lk)

    def distance_bias(self, lo: int, hi: int, layer: LayerContext, device: torch.device) -> Tensor:
        table = self.tables[layer.index if len(self.tables) > 1 else 0]
        return table(self.distance_values("buckets", lo, hi, device, self.bucket_of)).T
