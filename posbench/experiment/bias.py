"""What an encoding adds to the attention logits, for pictures: the logits of one layer on
real inputs minus their content term, averaged over a batch."""
from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels.masks import causal_mask
from posbench.encodings.base import LayerContext, Span
from posbench.model import Decoder


@torch.no_grad()
def positional_bias(model: Decoder, tokens: Tensor, layer: int = 0, head: int = 0) -> Tensor | None:
    """(L, L) bias over (query, key) positions for one head, averaged over the batch, shifted
    per query row so the query's own position is 0 (softmax ignores per-row constants).
    None for encodings that add no bias (absolute encodings, RoPE, NoPE)."""
    model.eval()
    enc = model.encoding
    L = tokens.shape[1]
    span = Span(0, L)
    x = enc.embed(model.tok_emb(tokens), span)
    for block in model.blocks[:layer]:
        x = block(x, span, enc, None)
    attn = model.blocks[layer].attn
    h = model.blocks[layer].ln_attn(x)
    q, k, _ = (attn._heads(t) for t in attn.qkv(h).split(h.shape[-1], dim=-1))  # (B, H, L, d)
    ctx = LayerContext(layer, attn.project_q, attn.project_k)
    q_rot, k_rot = enc.rotate(q, k, span, ctx)
    scores = enc.score(q_rot, k_rot, span, span, ctx)
    if scores.bias is None and scores.q.shape[-1] == q.shape[-1]:
        return None
    bias = scores.logits() - scores.scale * (q @ k.transpose(-1, -2))  # (B, H, L, L)
    bias = bias[:, head].mean(0)
    bias = bias - bias.diagonal()[:, None]
    return bias.masked_fill(~causal_mask(L, L, bias.device), float("nan"))
