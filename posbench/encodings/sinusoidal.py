"""Absolute sinusoidal positions added to the token embeddings (Vaswani et al. 2017)."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor

from posbench.encodings.registry import register_encoding
from posbench.encodings.base import AttentionShape, PositionalEncoding, Span
from posbench.encodings.tables import sinusoid
from posbench.validation import Range


@register_encoding("sinusoidal")
class Sinusoidal(PositionalEncoding):
    """Absolute sinusoidal embedding: PE[p, 2k] = sin(p w_k), PE[p, 2k+1] = cos(p w_k).

    With a cache, positions continue across segments. ``restart_per_segment=True`` restarts
    them at 0 in every call instead: the inconsistency Transformer-XL was built to avoid,
    offered to show that failure (so it is not cache consistent: free-running decoding
    recomputes its prefix instead of decoding a token per call, each at position 0).

    ``amplitude`` multiplies the table. Vaswani et al. add unit sinusoids to token embeddings
    scaled to unit size (fairseq: N(0, 1/d) times sqrt(d)); a model whose token embeddings
    start at N(0, 0.02) instead (GPT-2, nanoGPT, posbench's tied embeddings) keeps that ratio
    of token to position signal with ``amplitude = 0.02``; at 1 the positions drown the tokens.
    """

    def __init__(
        self,
        shape: AttentionShape,
        *,
        base: Annotated[float, Range(gt=1)] = 10000.0,
        restart_per_segment: bool = False,
        amplitude: Annotated[float, Range(gt=0)] = 1.0,
    ) -> None:
        super().__init__(shape)
        self.base = base
        self.restart_per_segment = restart_per_segment
        if restart_per_segment:  # chunks read through a memory restart: not the whole stream's
            self.cache_consistent = False
        self.amplitude = amplitude

    def table(self, span: Span, device: torch.device) -> Tensor:
        """PE rows for `span`, (L, d_model), sin and cos interleaved."""
        sin, cos = sinusoid(span.arange(device), self.d_model, self.base)
        return self.amplitude * torch.stack((sin, cos), dim=-1).flatten(-2)

    def embed(self, x: Tensor, span: Span) -> Tensor:
        if self.restart_per_segment:  # positions counted from the segment's first (drawn ones too)
            span = Span(0, len(span), None if span.contiguous else span.arange() - span.first)
        return x + self.table(span, x.device).to(x.dtype)  # (B, L, d_model)
