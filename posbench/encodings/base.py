"""The one interface every positional encoding implements.

The attention module calls an encoding's hooks in one fixed order and never names an encoding:

1. ``embed(x, span)``            at the input: absolute encodings add to token embeddings.
2. ``rotate(q, k, span, layer)`` on the new queries and keys, before keys enter the cache (RoPE).
3. ``score(q, k, q_span, k_span, layer)`` returns :class:`Scores`: the (possibly augmented)
   q and k, an additive bias on the scaled logits, and the logit scale. The default asks
   ``position_bias`` for a static bias that depends on positions only (ALiBi, T5), read from
   tables that grow by doubling; content-dependent encodings (Transformer-XL, DeBERTa) override ``score``.

The attention logits are ``scale * q' @ k'^T + bias``, masked causally, fed to
``scaled_dot_product_attention``. Positions are absolute integers given as :class:`Span`s, so a
continuation through a cache is just a later span.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Hashable

import torch
from torch import Tensor, nn

from posbench.errors import PositionOutOfRangeError


@dataclass(frozen=True)
class Span:
    """Contiguous absolute positions ``start, start+1, ..., stop-1``."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def arange(self, device: torch.device | str | None = None) -> Tensor:
        return torch.arange(self.start, self.stop, device=device)


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
class LayerContext:
    """What an encoding may use of the attention layer it serves: its index and projections."""

    index: int
    project_q: Callable[[Tensor], Tensor]  # (T, d_model) -> (H, T, d_head)
    project_k: Callable[[Tensor], Tensor]  # (T, d_model) -> (H, T, d_head)


@dataclass
class Scores:
    """Inputs to attention: logits = scale * q @ k^T + bias (bias may be None)."""

    q: Tensor  # (B, H, Lq, d')
    k: Tensor  # (B, H, Lk, d')
    bias: Tensor | BandBias | None  # broadcastable to (B, H, Lq, Lk), on the scaled-logit scale
    scale: float

    def logits(self) -> Tensor:
        """The dense pre-mask logits (B, H, Lq, Lk); for tests and pictures, not the hot path."""
        logits = self.scale * self.q @ self.k.transpose(-1, -2)
        return logits if self.bias is None else logits + dense_bias(self.bias, self.q.shape[-2])


@dataclass
class BandBias:
    """A causal bias confined to a band of W keys, for square scores (query i at key position
    i): bias[b, h, i, j] = band[b, h, i, j - i + W - 1] for i - W < j <= i, 0 for keys further
    back, plus a per-row constant. T5 past max_distance and DeBERTa past its span reduce to
    this after moving their constant far value into a row constant or into q and k.

    Attention runs the far keys through flash attention with no mask and only the band
    densely (posbench.band_attention): O(L * W) memory instead of O(L^2). The row constant
    changes no attention weight (softmax ignores it); it is kept so ``dense`` matches the
    reference logits exactly."""

    band: Tensor  # (B|1, H, L|1, W): column c is key i - (W - 1) + c, c = W - 1 the query's own
    row_constant: Tensor  # broadcastable to (B, H, L, 1)

    @property
    def width(self) -> int:
        return self.band.shape[-1]

    @staticmethod
    def width_for(index_by_distance: Tensor, far_index: int) -> int:
        """The band width W for a relative index (bucket, δ) given at distances 0, 1, .. on the
        CPU: one past the last distance whose index is not the far one (at least 1)."""
        near = (index_by_distance != far_index).nonzero()
        return int(near.max()) + 1 if len(near) else 1

    def dense(self, length: int) -> Tensor:
        """The (B|1, H, L, L) matrix, zero on future keys; for tests, pictures and short inputs."""
        W = self.width
        distance = torch.arange(length, device=self.band.device)
        distance = distance[:, None] - distance[None, :]  # (L, L): i - j
        column = (W - 1 - distance).clamp(0, W - 1)
        band = self.band.expand(*self.band.shape[:2], length, W)
        values = band.gather(-1, column.expand(*band.shape[:2], length, length))
        return values.masked_fill((distance < 0) | (distance >= W), 0.0) + self.row_constant


def dense_bias(bias: Tensor | BandBias, length: int) -> Tensor:
    """A bias as a tensor broadcastable to (B, H, Lq, Lk); ``length`` is L for a BandBias."""
    return bias.dense(length) if isinstance(bias, BandBias) else bias


class PositionalEncoding(nn.Module):
    """Base class: no positional signal at all. Subclasses override the hooks they need."""

    name: ClassVar[str] = ""
    #: The score depends on positions only through i - j (checked by the conformance kit).
    relative: ClassVar[bool] = False
    #: Largest number of positions the encoding can represent, or None for unbounded.
    max_positions: int | None = None
    #: Parameters (wildcards over their names) whose true gradient is zero by construction;
    #: the conformance kit checks they get none, and that every other parameter gets one.
    gradient_free: ClassVar[tuple[str, ...]] = ()

    def __init__(self, shape: AttentionShape) -> None:
        super().__init__()
        self.shape = shape
        self.n_heads, self.d_head, self.d_model = shape.n_heads, shape.d_head, shape.d_model
        self.causal, self.n_layers = shape.causal, shape.n_layers
        self._tables: dict[Hashable, Tensor] = {}
        self._last_bias: dict[str, tuple[Hashable, Tensor]] = {}
        #: How many static tables were built (tests check that decoding reuses them).
        self.table_builds = 0

    # ---- capabilities -------------------------------------------------------------------
    def supports(self, span: Span) -> str | None:
        """None when the encoding can represent `span`, else the reason it cannot."""
        if self.max_positions is not None and span.stop > self.max_positions:
            return (
                f"encoding {self.name!r} represents positions 0..{self.max_positions - 1} only, "
                f"got up to {span.stop - 1}"
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
    def embed(self, x: Tensor, span: Span) -> Tensor:
        """Add an absolute signal to token embeddings x (B, L, d_model)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, span: Span, layer: LayerContext) -> tuple[Tensor, Tensor]:
        """Transform new queries and keys (B, H, L, d) before the keys are cached."""
        return q, k

    def score(self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext) -> Scores:
        """Build the attention inputs from q (B, H, Lq, d) and all keys k (B, H, Lk, d)."""
        bias = self.position_bias(q_span, k_span, layer.index, q.device)
        return Scores(q, k, bias, 1.0 / math.sqrt(self.d_head))

    def position_bias(
        self, q_span: Span, k_span: Span, layer: int, device: torch.device
    ) -> Tensor | BandBias | None:
        """A bias (H, Lq, Lk) that depends on positions only, or None."""
        return None

    # ---- helpers for subclasses ---------------------------------------------------------
    # Tables are kept per (name, device) and grow by doubling; they hold values that depend on
    # positions only (frequencies, bucket ids, sinusoids), never on parameters: a kept table
    # built from a parameter would hand later calls a stale autograd graph, so one is refused.
    def _kept_table(self, name: str, device: torch.device, fits: Callable[[Tensor], bool],
                    build: Callable[[], Tensor]) -> Tensor:
        key = (name, str(device))
        table = self._tables.get(key)
        if table is None or not fits(table):
            table = build()
            if table.requires_grad:
                raise ValueError(
                    f"encoding {self.name!r}: table {name!r} depends on parameters and cannot be kept; "
                    "keep the parameter-free part (e.g. bucket ids) and index the parameters with it on every call"
                )
            self.table_builds += 1
            self._tables[key] = table
        return table

    def position_table(self, name: str, stop: int, device: torch.device, build: Callable[[int], Tensor]) -> Tensor:
        """A table indexed by position 0..stop-1, built for a capacity that doubles as needed,
        so decoding token by token never rebuilds it for the whole prefix. build(n) -> (n, ...)."""
        capacity = max(64, 1 << max(0, stop - 1).bit_length())
        return self._kept_table(name, device, lambda t: t.shape[0] >= stop, lambda: build(capacity))[:stop]

    def distance_values(
        self, name: str, lo: int, hi: int, device: torch.device, build: Callable[[Tensor], Tensor]
    ) -> Tensor:
        """f(d) for the distances d = lo..hi, (hi - lo + 1, ...), read from a table of f over
        -(C-1)..C-1 whose capacity C doubles as needed, so decoding token by token never
        rebuilds it for the whole prefix. build(distances) -> f(distances)."""
        reach = max(abs(lo), abs(hi)) + 1
        capacity = max(64, 1 << (reach - 1).bit_length())
        table = self._kept_table(name, device, lambda t: (t.shape[0] + 1) // 2 >= reach,
                                 lambda: build(torch.arange(-(capacity - 1), capacity, device=device)))
        offset = (table.shape[0] + 1) // 2 - 1
        return table[lo + offset : hi + offset + 1]

    def distance_lookup(
        self, name: str, q_span: Span, k_span: Span, device: torch.device, build: Callable[[Tensor], Tensor]
    ) -> Tensor:
        """f(i - j) for every (query, key) pair, (Lq, Lk, ...), from ``distance_values``."""
        lo = q_span.start - (k_span.stop - 1)
        values = self.distance_values(name, lo, q_span.stop - 1 - k_span.start, device, build)
        return values[self.relative_positions(q_span, k_span, device) - lo]

    def parameter_free_relative_bias(
        self, name: str, q_span: Span, k_span: Span, device: torch.device, build: Callable[[Tensor], Tensor]
    ) -> Tensor:
        """A bias f(i - j) with no learned parameters (ALiBi's) as an (H, Lq, Lk) Toeplitz
        matrix, build(distances) -> (n, H) read through ``distance_values``. The last matrix is
        kept and served again for spans of the same lengths and offset, so a training or
        evaluation loop at one length builds it once; that is only sound because nothing in it
        is learned (``distance_values`` refuses a `build` whose result requires a gradient)."""
        key = (len(q_span), len(k_span), q_span.start - k_span.start, str(device))
        last = self._last_bias.get(name)
        if last is None or last[0] != key:
            lo, hi = q_span.start - (k_span.stop - 1), q_span.stop - 1 - k_span.start
            per_distance = self.distance_values(name, lo, hi, device, build).T  # (H, Lq + Lk - 1)
            last = self._last_bias[name] = (key, toeplitz(per_distance, len(q_span), len(k_span)))
        return last[1]

    @staticmethod
    def relative_positions(q_span: Span, k_span: Span, device: torch.device) -> Tensor:
        """i - j for every (query, key) pair, (Lq, Lk)."""
        return q_span.arange(device)[:, None] - k_span.arange(device)[None, :]


class _Toeplitz(torch.autograd.Function):
    """values (H, Lq + Lk - 1) per distance -> (H, Lq, Lk); the backward pass sums the
    gradient along diagonals with a skew view instead of scattering Lq * Lk entries."""

    @staticmethod
    def forward(ctx, values: Tensor, q_len: int, k_len: int) -> Tensor:  # type: ignore[override]
        ctx.shape = (q_len, k_len)
        # rows reversed, the matrix is a Hankel view of the reversed values: [h, Lq-1-a, b] = w[h, a + b]
        reversed_values = values.flip(-1).contiguous()  # (H, Lq + Lk - 1)
        hankel = reversed_values.as_strided((values.shape[0], q_len, k_len), (reversed_values.stride(0), 1, 1))
        return hankel.flip(-2)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        return diagonal_sums(grad), None, None


def diagonal_sums(matrix: Tensor) -> Tensor:
    """Sums of (..., Lq, Lk) along its diagonals, (..., Lq + Lk - 1), ordered by a - b
    ascending (index (a - b) + Lk - 1): the adjoint of ``toeplitz``, with a skew view instead
    of scattering Lq * Lk entries."""
    q_len, k_len = matrix.shape[-2:]
    width = q_len + k_len - 1
    # flipping the keys puts pair (a, b) in column (a - b) + k_len - 1 of a skewed view
    padded = torch.nn.functional.pad(matrix.flip(-1), (0, q_len))  # (..., Lq, Lk + Lq)
    skewed = padded.flatten(-2)[..., : q_len * width].unflatten(-1, (q_len, width))
    return skewed.sum(-2)


def toeplitz(values: Tensor, q_len: int, k_len: int) -> Tensor:
    """Expand per-distance values (H, Lq + Lk - 1), ordered by i - j ascending, into
    (H, Lq, Lk) with [h, a, b] = values[h, (a - b) + Lk - 1]."""
    return _Toeplitz.apply(values, q_len, k_len)


def sinusoid(positions: Tensor, dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """sin and cos of positions * base^(-2k/dim), each (len(positions), dim // 2), float32.

    Angles are formed in float64 so large positions keep their precision."""
    inv_freq = base ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.sin().float(), angles.cos().float()
