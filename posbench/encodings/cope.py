"""CoPE (Golovneva et al. 2024): contextual positions, counted by gates the content opens."""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.kernels.bias_types import RowBlockBias, Scores
from posbench.validation import Range


@register_encoding("cope")
class CoPE(PositionalEncoding):
    """CoPE (Golovneva et al. 2024): positions are sums of gates sigmoid(q . k), so the bias depends
    on content.

    With z_ij = q_i . k_j / sqrt(d) (future keys masked), g_ij = sigmoid(z_ij) and the position
    of key j for query i is p_ij = sum_{t=j..i} g_it, clamped to ``npos_max`` - 1. The added
    logit is q_i . e[p_ij], interpolated linearly between the learned embeddings e of the two
    integer positions around p_ij (e: one (d, npos_max) table per layer, shared by the heads,
    initialised to zero), as the paper's reference code. A position counts what the gates open
    on (words, sentences), not tokens, so CoPE is not relative in tokens (declared).
    """

    relative = False  # positions are counted in gated content, not in i - j
    pairwise = False  # p_ij counts the gates of every key between j and i
    cost_note = (
        "positions depend on content: gates, a reverse cumulative sum and two gathers per "
        "pair, formed a block of query rows at a time and again in the backward pass, so no "
        "(B, H, L, L) tensor is kept"
    )

    def __init__(
        self, shape: AttentionShape, *, npos_max: Annotated[int, Range(ge=2)] = 64
    ) -> None:
        super().__init__(shape)
        self.npos_max = npos_max
        self.pos_emb = nn.Parameter(torch.zeros(shape.n_layers, shape.d_head, npos_max))

    def score(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext
    ) -> Scores:
        scale = 1.0 / math.sqrt(self.d_head)
        table = self.pos_emb[layer.index].to(q.dtype)  # (d, npos_max)

        def rows(r0: int, r1: int, keys: int, content: Tensor | None) -> Tensor:
            """The bias of query rows r0..r1-1 against keys 0..keys-1, (B, H, rows, keys),
            from those pairs' content logits scale * q . k (formed here when not given)."""
            q_rows = q[:, :, r0:r1]
            if content is None:
                content = scale * (q_rows @ k[:, :, :keys].transpose(-1, -2))
            gates = torch.sigmoid(content)  # (B, H, rows, keys)
            # p_ij = sum of the gates from key j to query i: the running sum at the query's own
            # key less the running sum before j. Later keys' gates never enter it, so they need
            # no masking (their positions come out <= 0 and attention masks them).
            running = gates.cumsum(-1)
            if self.causal:  # query i is the last q_len keys' i-th: its own key
                own = torch.arange(r0, r1, device=q.device) + (k.shape[2] - q.shape[2])
                total = running.gather(-1, own.view(1, 1, -1, 1).expand(*running.shape[:-1], 1))
            else:
                total = running[..., -1:]
            positions = (total - running + gates).clamp(0, self.npos_max - 1)
            floor = positions.floor()
            weight = positions - floor  # interpolation weight of the next integer position
            at_integers = q_rows @ table  # (B, H, rows, npos_max)
            slopes = F.pad(at_integers.diff(dim=-1), (0, 1))  # to the next integer position
            index = floor.long()
            return at_integers.gather(-1, index) + weight * slopes.gather(-1, index)

        return Scores(q, k, RowBlockBias(rows, q.shape[2], k.shape[2]), scale)
