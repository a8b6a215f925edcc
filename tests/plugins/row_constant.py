"""A test plugin whose only parameter moves every logit of a row alike: softmax ignores it,
so its true gradient is zero, and float32 round-off must not pass for a gradient."""
import torch
from torch import nn

from posbench import PositionalEncoding, register_encoding


@register_encoding("test_row_constant")
class RowConstant(PositionalEncoding):
    """A per-row constant bias: a parameter with no real gradient."""

    relative = True

    def __init__(self, n_heads, d_head, causal=True, n_layers=1):
        super().__init__(n_heads, d_head, causal, n_layers)
        self.offset = nn.Parameter(torch.ones(n_heads))

    def position_bias(self, q_span, k_span, layer, device):
        rows = torch.ones(len(q_span), len(k_span), device=device)
        return self.offset[:, None, None] * rows * q_span.arange(device)[:, None].float()
