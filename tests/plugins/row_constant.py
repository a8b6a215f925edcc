"""A test plugin whose only parameter moves every logit of a row alike: softmax ignores it,
so its true gradient is zero, and float32 round-off must not pass for a gradient."""

import torch
from torch import nn

from posbench import AttentionShape, PositionalEncoding, register_encoding


@register_encoding("test_row_constant")
class RowConstant(PositionalEncoding):
    """A per-row constant bias: a parameter with no real gradient."""

    relative = True

    def __init__(self, shape: AttentionShape):
        super().__init__(shape)
        self.offset = nn.Parameter(torch.ones(shape.n_heads))

    def position_bias(self, q_span, k_span, layer, device):
        rows = torch.ones(len(q_span), len(k_span), device=device)
        return self.offset[:, None, None] * rows * q_span.arange(device)[:, None].float()
