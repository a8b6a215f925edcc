"""What an encoding does inside attention, measured on real inputs: the bias picture, the
score-term probe with its health rules, and attention mass by key distance.

The probe follows the Transformer-XL debugging practice: early in training, each named term
of the logits (Transformer-XL's a, b, c, d; DeBERTa's c2c, c2p, p2c; a bias encoding's content
and position) should be within about 10x of the others and non-zero. A term that is all zero,
or that no gradient can reach, means broken gradient flow; one orders of magnitude below the
largest means a bad projection init or learning rate."""

from __future__ import annotations

from typing import Any, Iterator

import pandas as pd
import torch
from torch import Tensor

from posbench.encodings.base import LayerContext, Span
from posbench.encodings.positions import seeded_draws
from posbench.kernels.masks import causal_mask
from posbench.model import Decoder, stream_span

#: A term whose spread (std) is this many times below the largest term's in its layer is flagged.
TERM_RATIO_LIMIT = 100.0
#: Sequences the probes read (a fixed sample: cheap, never the whole batch).
PROBE_SAMPLES = 8


def layer_queries_and_keys(
    model: Decoder, tokens: Tensor
) -> Iterator[tuple[int, Tensor, Tensor, Span, LayerContext]]:
    """Replay the forward pass over whole sequences (B, L), yielding each layer's index, its
    rotated queries and keys (B, H, L, d), the span and the layer context, as attention sees them.
    Randomized positions are drawn as the model's mode draws them, from a fixed seed."""
    enc = model.encoding
    with seeded_draws(0):  # drawn positions, if any: one fixed draw, training's draws untouched
        span = stream_span(model.encoding, tokens.shape[1])
    x = enc.embed(model.tok_emb(tokens), span)  # (B, L, d_model)
    for index, block in enumerate(model.blocks):
        attn = block.attn
        h = block.ln_attn(x)
        q, k, _ = (attn._heads(t) for t in attn.qkv(h).split(h.shape[-1], dim=-1))  # (B, H, L, d)
        ctx = LayerContext(index, attn.project_q, attn.project_k)
        q, k = enc.rotate(q, k, span, ctx)
        yield index, q, k, span, ctx
        x = block(x, span, enc, None)


def _mask(model: Decoder, length: int, device: torch.device) -> Tensor:
    """(L, L) keys each query may see: causal, or all of them for a bidirectional model."""
    if model.config.causal:
        return causal_mask(length, length, device)
    return torch.ones(length, length, dtype=torch.bool, device=device)


@torch.no_grad()
def positional_bias(model: Decoder, tokens: Tensor, layer: int = 0, head: int = 0) -> Tensor | None:
    """(L, L) bias over (query, key) positions for one head, averaged over the batch, shifted
    per query row so the query's own position is 0 (softmax ignores per-row constants).
    None for encodings that add no bias (absolute encodings, RoPE, NoPE)."""
    model.eval()
    enc = model.encoding
    for index, q, k, span, ctx in layer_queries_and_keys(model, tokens):
        if index < layer:
            continue
        scores = enc.score(q, k, span, span, ctx)
        if scores.bias is None and scores.q.shape[-1] == q.shape[-1]:
            return None
        bias = scores.logits() - scores.scale * (q @ k.transpose(-1, -2))  # (B, H, L, L)
        bias = bias[:, head].mean(0)
        bias = bias - bias.diagonal()[:, None]
        return bias.masked_fill(~_mask(model, len(span), bias.device), float("nan"))
    return None


def term_rows(model: Decoder, tokens: Tensor, step: int) -> list[dict[str, Any]]:
    """The score-term probe on `tokens`: per layer and named term, the mean and std of its
    values over the keys each query sees, the share of attention mass it moves (total
    variation between the attention with and without it, averaged over queries), and whether a
    gradient can reach it. The model is left in the mode it was in."""
    was_training = model.training
    model.eval()
    rows = []
    with torch.enable_grad():  # whether a term requires grad says whether training can move it
        for layer, q, k, span, ctx in layer_queries_and_keys(model, tokens):
            terms = model.encoding.score_terms(q, k, span, span, ctx)
            total = sum(terms.values())  # (B, H, L, L)
            mask = _mask(model, len(span), q.device)
            weights = total.detach().masked_fill(~mask, float("-inf")).softmax(-1)
            for name, term in terms.items():
                values = term.detach().expand_as(total)
                without = (total.detach() - values).masked_fill(~mask, float("-inf")).softmax(-1)
                seen = values[..., mask]  # (B, H, pairs)
                rows.append(
                    {
                        "step": step,
                        "layer": layer,
                        "term": name,
                        "mean": float(seen.mean()),
                        "std": float(seen.std()) if seen.numel() > 1 else 0.0,
                        "mass_moved": float(0.5 * (weights - without).abs().sum(-1).mean()),
                        "learns": bool(term.requires_grad),
                    }
                )
    model.train(was_training)
    return rows


def health_flags(terms: pd.DataFrame, label: str, has_parameters: bool) -> list[str]:
    """One sentence per unhealthy (layer, term), at the first probe that shows it: a term that
    is all zero, that no gradient reaches although the encoding has trainable parameters, or
    whose spread is TERM_RATIO_LIMIT times below the largest term's in its layer."""
    flags: dict[tuple[int, str, str], str] = {}
    for (step, layer), group in terms.sort_values("step").groupby(["step", "layer"], sort=True):
        largest = group.loc[group["std"].idxmax()]
        for row in group.itertuples():
            where = f"{label} layer {layer}: term '{row.term}'"
            if row.mean == 0 and row.std == 0:
                flags.setdefault(
                    (layer, row.term, "zero"),
                    f"{where} is all zero at step {step}: its gradient flow is broken",
                )
            elif has_parameters and not row.learns:
                flags.setdefault(
                    (layer, row.term, "grad"),
                    f"{where} receives no gradient at step {step} although the "
                    "encoding has trainable parameters: its gradient flow is broken",
                )
            if row.std > 0 and largest["std"] / row.std >= TERM_RATIO_LIMIT:
                flags.setdefault(
                    (layer, row.term, "ratio"),
                    f"{where} is {largest['std'] / row.std:.0f}x below "
                    f"'{largest['term']}' at step {step}: check its projection's init or the "
                    "learning rate",
                )
    return list(flags.values())


@torch.no_grad()
def attention_by_distance(model: Decoder, tokens: Tensor) -> Tensor:
    """Attention mass by key distance i - j (L,): each query's weights over the keys it sees,
    averaged over queries, heads, layers and the batch (a query closer to the start than d
    puts nothing at d), so the values sum to 1."""
    model.eval()
    L = tokens.shape[1]
    total = torch.zeros(L, dtype=torch.float64)
    layers = 0
    distance = torch.arange(L)[:, None] - torch.arange(L)[None, :]  # (L, L): i - j
    for _, q, k, span, ctx in layer_queries_and_keys(model, tokens):
        logits = model.encoding.score(q, k, span, span, ctx).logits()
        mask = _mask(model, L, q.device)
        weights = (
            logits.masked_fill(~mask, float("-inf")).softmax(-1).mean(dim=(0, 1)).cpu()
        )  # (L, L)
        seen = (distance >= 0) if model.config.causal else torch.ones_like(mask.cpu())
        total += torch.zeros(L, dtype=torch.float64).index_add_(
            0, distance.abs()[seen], weights[seen].double()
        )
        layers += 1
    return (total / (layers * L)).float()
