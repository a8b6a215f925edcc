"""The one interface every positional encoding implements.

The attention module calls an encoding's hooks in one fixed order and never names an encoding:

0. ``place(length)``             once per stream: None for positions 0..length-1, or the drawn
   positions of randomized positions (any encoding built with ``randomize_positions``).
1. ``embed(x, span)``            at the input: absolute encodings add to token embeddings.
2. ``rotate(q, k, span, layer)`` on the new queries and keys, before keys enter the cache (RoPE).
3. ``score(q, k, q_span, k_span, layer)`` returns :class:`Scores`: the (possibly augmented)
   q and k, an additive bias on the scaled logits, and the logit scale. The default asks
   ``position_bias`` for a static bias that depends on positions only (ALiBi, T5), read from
   tables that grow by doubling; content-dependent encodings (Transformer-XL, DeBERTa) override
   ``score``.

The attention logits are ``scale * q' @ k'^T + bias``, masked causally, fed to
``scaled_dot_product_attention``. Positions are absolute integers given as :class:`Span`s, so a
continuation through a cache is just a later span. A span may carry explicit, strictly
increasing positions (randomized positions); hooks read them through ``span.arange``,
``span.first``, ``span.last`` and the table helpers, and keep fast paths that assume
``start .. stop - 1`` behind ``span.contiguous``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import Tensor, nn

from posbench.encodings.positions import RandomPositions, Span
from posbench.encodings.tables import PositionTables
from posbench.errors import PositionOutOfRangeError
from posbench.bias_kinds import BandBias, Scores, ToeplitzBias, dense_bias


@dataclass(frozen=True)
class AttentionShape:
    """The attention an encoding serves; every encoding is built from one, plus its own options."""

    n_heads: int
    d_head: int
    #: False for attention that sees every key (encoder-style): T5 then uses bidirectional
    #: buckets and ALiBi a symmetric bias by default.
    causal: bool = True
    n_layers: int = 1

    @property
    def d_model(self) -> int:
        return self.n_heads * self.d_head


@dataclass(frozen=True)
class IndexedTable:
    """A parameter whose rows are read by position or distance (T5's buckets, DeBERTa's
    relative embeddings, a learned position table). Training that never reads a row leaves it
    at its initialisation, so an evaluation that reads it measures an untrained parameter:
    posbench counts which rows each length reads before anything is trained.

    ``row_of(query_positions (Lq,), key_positions (Lk,))`` gives the row each (query, key) pair
    reads, broadcastable to (Lq, Lk), or -1 for none; with ``per_token`` the rows are read once
    per token (an absolute table added at the input) and ``row_of`` returns (Lq, 1)."""

    parameter: str  # the parameter's name in the encoding's state dict, e.g. "tables.0.weight"
    row_name: str  # what one row is, for messages: "bucket", "relative embedding", "position"
    size: int
    row_of: Callable[[Tensor, Tensor], Tensor]
    per_token: bool = False
    #: How to make training reach every row at a longest training distance (or position),
    #: for the configuration-time warning; None when no option can (a learned table).
    fix: Callable[[int], str | None] | None = None


@dataclass(frozen=True)
class LayerContext:
    """What an encoding may use of the attention layer it serves: its index and projections."""

    index: int
    project_q: Callable[[Tensor], Tensor]  # (T, d_model) -> (H, T, d_head)
    project_k: Callable[[Tensor], Tensor]  # (T, d_model) -> (H, T, d_head)


class PositionalEncoding(PositionTables, nn.Module):
    """Base class: no positional signal at all. Subclasses override the hooks they need."""

    name: ClassVar[str] = ""
    #: The score depends on positions only through i - j (checked by the conformance kit).
    relative: ClassVar[bool] = False
    #: Feeding a sequence in chunks through a cache gives the logits of the whole (checked by
    #: the conformance kit; an encoding that declares False must really differ, with the
    #: reason in its docstring, e.g. dynamic NTK's base following the length read).
    cache_consistent: ClassVar[bool] = True
    #: Each logit depends on its own query, key and their two positions only, so the logits at
    #: drawn positions are those at all positions, gathered (checked by the conformance kit).
    #: CoPE's counts read every key in between: False.
    pairwise: ClassVar[bool] = True
    #: Why the encoding costs what it does, printed by `posbench bench` where its forward and
    #: backward pass is more than 2.5x NoPE's.
    cost_note: ClassVar[str] = ""
    #: Largest number of positions the encoding can represent, or None for unbounded.
    max_positions: int | None = None
    #: Parameters (wildcards over their names) whose true gradient is zero by construction;
    #: the conformance kit checks they get none, and that every other parameter gets one.
    gradient_free: ClassVar[tuple[str, ...]] = ()
    #: Randomized positions, set when the encoding is built with ``randomize_positions``.
    random_positions: RandomPositions | None = None
    #: False for an encoding whose scores never read a position (NoPE): drawing its positions
    #: changes none of its numbers.
    reads_positions: ClassVar[bool] = True

    def __init__(self, shape: AttentionShape) -> None:
        super().__init__()
        self.shape = shape
        self.n_heads, self.d_head, self.d_model = shape.n_heads, shape.d_head, shape.d_model
        self.causal, self.n_layers = shape.causal, shape.n_layers
        self.init_tables()

    # ---- capabilities -------------------------------------------------------------------
    @property
    def draws_positions(self) -> bool:
        """True when streams get drawn positions now: randomized, and training or drawing at
        evaluation too."""
        drawn = self.random_positions
        return drawn is not None and (self.training or drawn.at_evaluation)

    def supports(self, span: Span) -> str | None:
        """None when the encoding can represent `span`, else the reason it cannot. While
        positions are drawn, a plain span stands for a stream of that many tokens."""
        if span.contiguous and self.draws_positions:
            limit = self.random_positions.max_position  # type: ignore[union-attr]
            if len(span) > limit:
                return (
                    f"randomized positions place at most {limit} tokens (distinct positions "
                    f"0..{limit - 1}), got {len(span)}"
                )
            return None
        if self.max_positions is not None and span.last >= self.max_positions:
            return (
                f"encoding {self.name!r} represents positions 0..{self.max_positions - 1} only, "
                f"got up to {span.last}"
            )
        return None

    def check(self, span: Span) -> None:
        """Raise PositionOutOfRangeError with a clear reason when `span` is unsupported."""
        reason = self.supports(span)
        if reason is not None:
            raise PositionOutOfRangeError(
                f"{reason}; use shorter sequences or a larger max_positions."
            )

    # ---- hooks, called in this order ----------------------------------------------------
    def place(self, length: int) -> Tensor | None:
        """Positions for a stream of `length` tokens, (length,) int64: None means 0..length-1.
        Randomized positions draw them (in training, and at evaluation unless told not to)."""
        if not self.draws_positions:
            return None
        return self.random_positions.draw(length)  # type: ignore[union-attr]

    def embed(self, x: Tensor, span: Span) -> Tensor:
        """Add an absolute signal to token embeddings x (B, L, d_model)."""
        return x

    def rotate(
        self, q: Tensor, k: Tensor, span: Span, layer: LayerContext
    ) -> tuple[Tensor, Tensor]:
        """Transform new queries and keys (B, H, L, d) before the keys are cached."""
        return q, k

    def score(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext
    ) -> Scores:
        """Build the attention inputs from q (B, H, Lq, d) and all keys k (B, H, Lk, d)."""
        bias = self.position_bias(q_span, k_span, layer, q.device)
        return Scores(q, k, bias, 1.0 / math.sqrt(self.d_head))

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor | ToeplitzBias | BandBias | None:
        """A bias (H, Lq, Lk) that depends on positions only (and on the layer, for per-layer
        tables), or None."""
        return None

    def distance_bias(
        self, lo: int, hi: int, layer: LayerContext, device: torch.device
    ) -> Tensor | None:
        """The bias as one value per head and distance, (H, hi - lo + 1) for i - j = lo .. hi,
        for an encoding whose logits are the base class's (1/sqrt(d) q . k) plus a bias that is
        a function of the head and i - j alone, at any positions (ALiBi, T5, KERPLE, Sandwich);
        None otherwise (the default). CUDA attention then runs through flex_attention with a
        score_mod that reads this table instead of an (H, L, L) bias."""
        return None

    # ---- reachability ----------------------------------------------------------------------
    def indexed_tables(self) -> list[IndexedTable]:
        """The parameters whose rows are read by position or distance (none by default)."""
        return []

    # ---- diagnostics (never on the training path) ----------------------------------------
    def score_terms(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext
    ) -> dict[str, Tensor]:
        """The pre-mask logits split into named terms that sum to them, each broadcastable to
        (B, H, Lq, Lk), for the score-term probe. By default 'content' (the scaled q . k of the
        rotated queries and keys, so RoPE's and absolute encodings' positions live inside it)
        and, when the encoding adds anything else, 'position' (the rest). Encodings whose
        logits have more named parts (Transformer-XL, DeBERTa) override this."""
        scores = self.score(q, k, q_span, k_span, layer)
        content = scores.scale * (q @ k.transpose(-1, -2))  # (B, H, Lq, Lk)
        unchanged = (
            scores.q.shape == q.shape and torch.equal(scores.q, q) and torch.equal(scores.k, k)
        )
        if unchanged and scores.bias is None:
            return {"content": content}
        if unchanged:  # the bias alone, so its own gradient path is what the probe sees
            return {"content": content, "position": dense_bias(scores.bias, q.shape[-2])}
        return {"content": content, "position": scores.logits() - content}  # folded into q and k
