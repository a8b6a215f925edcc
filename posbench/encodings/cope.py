"""CoPE (Golovneva et al. 2024): contextual positions, counted by gates the content opens."""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch import Tensor, nn

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.bias_kinds import Scores, gated_position_bias
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
        "positions depend on content: gates, a running sum and an interpolation per pair, "
        "formed a block of query rows at a time (by posbench's C++ kernel on the CPU) and "
        "again in the backward pass, so no (B, H, L, L) tensor is kept"
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

        square = q_span.same_positions(k_span)  # each query the last of its keys
        bias = gated_position_bias(q, k, table, self.npos_max, scale, self.causal, square)
        return Scores(q, k, bias, scale)
