"""Tables an encoding keeps between calls, and the helpers that read them.

Every table is keyed by (name, device) and grows by doubling, so decoding token by token never
rebuilds it for the whole prefix. The invariant that makes keeping them sound: a kept table
holds values that depend on positions only (frequencies, bucket ids, sinusoids), never on
parameters, since a table built from a parameter would hand later calls a stale autograd graph;
one is refused. The last parameter-free relative bias matrix is kept as well (ALiBi's), keyed
by the spans' lengths and offset.
"""

from __future__ import annotations

from typing import Callable, Hashable

import torch
from torch import Tensor

from posbench.encodings.positions import Span
from posbench.bias_kinds import toeplitz


class PositionTables:
    """Mixin for PositionalEncoding: kept tables and relative-position helpers."""

    name: str = ""

    def init_tables(self) -> None:
        self._tables: dict[Hashable, Tensor] = {}
        self._last_bias: dict[str, tuple[Hashable, Tensor]] = {}
        #: How many kept tables were built (tests check that decoding reuses them).
        self.table_builds = 0

    def _kept_table(
        self,
        name: str,
        device: torch.device,
        fits: Callable[[Tensor], bool],
        build: Callable[[], Tensor],
    ) -> Tensor:
        key = (name, str(device))
        table = self._tables.get(key)
        if table is None or not fits(table):
            table = build()
            if table.requires_grad:
                raise ValueError(
                    f"encoding {self.name!r}: table {name!r} depends on parameters and cannot be "
                    "kept; "
                    "keep the parameter-free part (e.g. bucket ids) and index the parameters with "
                    "it on every call"
                )
            self.table_builds += 1
            self._tables[key] = table
        return table

    def position_table(
        self, name: str, stop: int, device: torch.device, build: Callable[[int], Tensor]
    ) -> Tensor:
        """A table indexed by position 0..stop-1, built for a capacity that doubles as needed,
        so decoding token by token never rebuilds it for the whole prefix. build(n) -> (n, ...)."""
        capacity = max(64, 1 << max(0, stop - 1).bit_length())
        return self._kept_table(
            name, device, lambda t: t.shape[0] >= stop, lambda: build(capacity)
        )[:stop]

    def position_rows(
        self, name: str, span: Span, device: torch.device, build: Callable[[int], Tensor]
    ) -> Tensor:
        """The rows of ``position_table`` at the span's positions, (L, ...): a slice for
        contiguous positions, a gather for drawn ones."""
        table = self.position_table(name, span.last + 1, device, build)
        return table[span.start :] if span.contiguous else table[span.arange(table.device)]

    def distance_values(
        self, name: str, lo: int, hi: int, device: torch.device, build: Callable[[Tensor], Tensor]
    ) -> Tensor:
        """f(d) for the distances d = lo..hi, (hi - lo + 1, ...), read from a table of f over
        -(C-1)..C-1 whose capacity C doubles as needed, so decoding token by token never
        rebuilds it for the whole prefix. build(distances) -> f(distances)."""
        reach = max(abs(lo), abs(hi)) + 1
        capacity = max(64, 1 << (reach - 1).bit_length())
        table = self._kept_table(
            name,
            device,
            lambda t: (t.shape[0] + 1) // 2 >= reach,
            lambda: build(torch.arange(-(capacity - 1), capacity, device=device)),
        )
        offset = (table.shape[0] + 1) // 2 - 1
        return table[lo + offset : hi + offset + 1]

    def distance_lookup(
        self,
        name: str,
        q_span: Span,
        k_span: Span,
        device: torch.device,
        build: Callable[[Tensor], Tensor],
    ) -> Tensor:
        """f(i - j) for every (query, key) pair, (Lq, Lk, ...), from ``distance_values``."""
        lo = q_span.first - k_span.last
        values = self.distance_values(name, lo, q_span.last - k_span.first, device, build)
        return values[self.relative_positions(q_span, k_span, device) - lo]

    def parameter_free_relative_bias(
        self,
        name: str,
        q_span: Span,
        k_span: Span,
        device: torch.device,
        build: Callable[[Tensor], Tensor],
    ) -> Tensor:
        """A bias f(i - j) with no learned parameters (ALiBi's) as an (H, Lq, Lk) Toeplitz
        matrix, build(distances) -> (n, H) read through ``distance_values``. The last matrix is
        kept and served again for spans of the same lengths and offset, so a training or
        evaluation loop at one length builds it once; that is only sound because nothing in it
        is learned (``distance_values`` refuses a `build` whose result requires a gradient).
        Drawn (non-contiguous) positions are not Toeplitz: they read ``distance_lookup``."""
        if not (q_span.contiguous and k_span.contiguous):
            return self.distance_lookup(name, q_span, k_span, device, build).permute(
                2, 0, 1
            )  # (H, Lq, Lk)
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


def sinusoid(positions: Tensor, dim: int, base: float = 10000.0) -> tuple[Tensor, Tensor]:
    """sin and cos of positions * base^(-2k/dim), each (len(positions), dim // 2), float32.

    Angles are formed in float64 so large positions keep their precision."""
    inv_freq = base ** (
        -torch.arange(0, dim, 2, device=positions.device, dtype=torch.float64) / dim
    )
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.sin().float(), angles.cos().float()
