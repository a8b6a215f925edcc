"""A test plugin whose bias is 10% off when one query is scored alone, as in a decoding step:
the conformance kit must catch a decoding path that differs from the whole sequence's, even
when the learned term is as small as learned position terms start."""

import torch
from torch import nn

from posbench import AttentionShape, PositionalEncoding, register_encoding


@register_encoding("test_decode_drift")
class DecodeDrift(PositionalEncoding):
    """bias[h, i, j] = slope[h] * (i - j), times 1.1 for a single query."""

    relative = True

    def __init__(self, shape: AttentionShape):
        super().__init__(shape)
        self.slope = nn.Parameter(torch.full((shape.n_heads,), -0.005))

    def position_bias(self, q_span, k_span, layer, device):
        distance = q_span.arange(device)[:, None] - k_span.arange(device)[None, :]
        drift = 1.1 if len(q_span) == 1 else 1.0
        return drift * self.slope[:, None, None] * distance.float()
