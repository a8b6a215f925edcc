"""Learned absolute positions (GPT-2): an embedding table added at the input."""

from __future__ import annotations

from typing import Annotated

from torch import Tensor, nn

from posbench.encodings.registry import register_encoding
from posbench.encodings.base import AttentionShape, IndexedTable, PositionalEncoding, Span
from posbench.validation import Range


@register_encoding("learned")
class Learned(PositionalEncoding):
    """Learned absolute embedding of max_positions rows; positions past the table are n/a.

    ``init_std`` is the rows' initial standard deviation: 1 (torch's default for an embedding,
    matching posbench's untied token embedding), or 0.02 as GPT-2 and nanoGPT start theirs,
    beside a token embedding tied to the head at the same scale."""

    def __init__(
        self,
        shape: AttentionShape,
        *,
        max_positions: Annotated[int, Range(ge=1)] = 1024,
        init_std: Annotated[float, Range(gt=0)] = 1.0,
    ) -> None:
        super().__init__(shape)
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, self.d_model)  # rows N(0, 1)
        if init_std != 1.0:  # drawn again only then: the default keeps stored runs' weights
            nn.init.normal_(self.table.weight, std=init_std)

    def indexed_tables(self) -> list[IndexedTable]:
        """Each token reads the row of its position: rows past the training length stay
        untrained, the expected limit of a learned table (no option fixes it)."""
        return [
            IndexedTable(
                "table.weight",
                "position",
                self.max_positions,
                lambda q, k: q[:, None],
                per_token=True,
            )
        ]

    def embed(self, x: Tensor, span: Span) -> Tensor:
        return x + self.table(span.arange(x.device))  # (B, L, d_model)
