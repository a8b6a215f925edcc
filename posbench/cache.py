"""The memory of a decoder: detached keys and values of the positions seen so far."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posbench.encodings.base import PositionalEncoding, Span
from posbench.errors import PositionOutOfRangeError


class _Buffer:
    """Keys or values of one layer in a preallocated tensor with spare room, so appending a
    token costs O(new tokens), not a copy of the whole memory (amortised by doubling)."""

    def __init__(self) -> None:
        self.data: Tensor | None = None
        self.start = 0  # first held position's slot
        self.stop = 0  # one past the last

    def view(self) -> Tensor | None:
        return None if self.data is None else self.data[:, :, self.start : self.stop]

    def hold(self, held: Tensor) -> None:
        """Hold exactly `held` (B, H, n, d), a tensor of the buffer's own."""
        self.data, self.start, self.stop = held, 0, held.shape[2]

    def append(self, new: Tensor, keep: float) -> None:
        """Append `new` (B, H, n, d), then hold at most the newest `keep` positions (inf: all)."""
        n = new.shape[2]
        if self.data is None:
            capacity = max(64, 2 * n if math.isinf(keep) else 2 * max(int(keep), n))
            self.data = new.new_empty(*new.shape[:2], capacity, new.shape[3])
        elif self.stop + n > self.data.shape[2]:
            held = self.data[:, :, self.start : self.stop]
            if not math.isinf(keep):
                held = held[:, :, max(0, held.shape[2] + n - int(keep)) :]
            capacity = max(self.data.shape[2], 2 * (held.shape[2] + n))
            grown = new.new_empty(*new.shape[:2], capacity, new.shape[3])
            grown[:, :, : held.shape[2]] = held
            self.data, self.start, self.stop = grown, 0, held.shape[2]
        self.data[:, :, self.stop : self.stop + n] = new.detach()
        self.stop += n
        if self.stop - self.start > keep:
            self.start = self.stop - int(keep)


class Cache:
    """Per-layer key/value memory, Transformer-XL style.

    ``seen`` counts every position ever fed, also those no longer held, so a continuation
    always gets its true absolute positions. ``mem_len``, the memory length, is how many of the
    newest positions are kept: an integer (``0`` keeps none, yet positions keep counting) or
    ``math.inf``, which keeps all. (Throughout posbench, ``math.inf`` is an unbounded memory and
    None means no cache at all.) Stored tensors are detached: gradients stop at the memory.

    ``positions``, when given, are the whole stream's drawn positions (randomized positions,
    drawn once for the stream so cached keys keep theirs); spans then carry their slice.
    """

    def __init__(
        self, n_layers: int, mem_len: float = math.inf, positions: Tensor | None = None
    ) -> None:
        if mem_len is None or mem_len < 0 or (not math.isinf(mem_len) and mem_len != int(mem_len)):
            raise ValueError(
                f"mem_len must be a whole number >= 0, or math.inf for a memory that keeps every "
                f"position, got {mem_len}"
                + (" (before posbench 0.2 None kept every position)" if mem_len is None else "")
            )
        self.mem_len = mem_len
        self.positions = positions  # (stream length,) or None: positions are token indices
        self.seen = 0
        self._keys = [_Buffer() for _ in range(n_layers)]
        self._values = [_Buffer() for _ in range(n_layers)]

    @classmethod
    def for_stream(
        cls, n_layers: int, mem_len: float, encoding: PositionalEncoding, length: int | None
    ) -> "Cache":
        """A memory for a stream of `length` tokens read through `encoding`. The length is
        needed only when the encoding draws positions: they spread over their whole range, so
        the stream's are drawn up front."""
        if length is None and encoding.draws_positions:
            raise ValueError(
                f"encoding {encoding.name!r} draws randomized positions for a whole stream up "
                "front; "
                "pass the stream's length when making its cache (new_cache(mem_len, length=...))."
            )
        return cls(n_layers, mem_len, None if length is None else encoding.place(length))

    def span_for(self, new_tokens: int) -> Span:
        """Absolute positions of the next `new_tokens` tokens."""
        return self._span(self.seen, self.seen + new_tokens)

    def _span(self, start: int, stop: int) -> Span:
        if self.positions is None:
            return Span(start, stop)
        if stop > len(self.positions):
            raise PositionOutOfRangeError(
                f"this cache was made for a stream of {len(self.positions)} tokens (its positions "
                "are drawn "
                f"up front) and was asked for token {stop - 1}; pass the whole stream's length to "
                "new_cache."
            )
        return Span(start, stop, self.positions[start:stop])

    def batch_size(self) -> int:
        """Sequences the memory holds (0 before it has read any)."""
        view = self._keys[0].view() if self._keys else None
        return 0 if view is None else view.shape[0]

    def held(self, layer: int = 0) -> int:
        """Number of positions a layer's memory holds now."""
        view = self._keys[layer].view()
        return 0 if view is None else view.shape[2]

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Span]:
        """Keys and values to attend to (memory then new), (B, H, M + L, d), with their
        positions; stores the newest. ``seen`` advances only after all layers have run, so
        every layer of one forward pass sees the same positions."""
        keys, values = self._keys[layer], self._values[layer]
        held = self.held(layer)
        span = self._span(self.seen - held, self.seen + k.shape[2])
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            # training through the memory: the new keys keep their gradient, the memory not
            mem_k, mem_v = keys.view(), values.view()
            k_all = k if mem_k is None else torch.cat((mem_k, k), dim=2)
            v_all = v if mem_v is None else torch.cat((mem_v, v), dim=2)
            keys.append(k, self.mem_len)
            values.append(v, self.mem_len)
            return k_all, v_all, span
        keys.append(k, self.mem_len + k.shape[2])
        values.append(v, self.mem_len + k.shape[2])
        # nothing held: attention reads the new keys themselves, as it would with no memory
        k_all, v_all = (k, v) if held == 0 else (keys.view(), values.view())
        if not math.isinf(self.mem_len):  # keep only mem_len for the next call
            keys.start = values.start = max(keys.start, keys.stop - int(self.mem_len))
        return k_all, v_all, span

    def resumed(self, mem_len: float, at: int, rows: Tensor | None = None) -> "Cache":
        """The memory of `mem_len` a stream read in segments holds after its first `at` tokens
        (the newest min(mem_len, at) of them), taken from this memory, which read the same
        stream from its start in one pass and dropped nothing; of the sequences `rows` (None:
        all). For a cache-consistent encoding the two are the same keys and values until the
        segments' memory first drops a token, so a reading through a shorter memory continues
        from here without reading its first tokens again."""
        if not math.isinf(self.mem_len) or self.seen < at:
            raise ValueError(
                f"a memory resumes from an unbounded one that has read at least {at} tokens; "
                f"this one keeps {self.mem_len} and has read {self.seen}"
            )
        out = Cache(len(self._keys), mem_len, self.positions)
        keep = at if math.isinf(mem_len) else min(int(mem_len), at)
        for theirs, mine in ((self._keys, out._keys), (self._values, out._values)):
            for source, target in zip(theirs, mine):
                held = source.view()
                assert held is not None, "an unbounded memory that has read tokens holds them"
                kept = held[:, :, at - keep : at]  # (B, H, keep, d): the stream starts at slot 0
                target.hold((kept if rows is None else kept[rows]).clone())
        out.seen = at
        return out

    def advance(self, new_tokens: int) -> None:
        """Count `new_tokens` more positions as seen (after all layers have run)."""
        self.seen += new_tokens


class MemoryParts:
    """The unbounded memories of consecutive groups of sequences (one per batch of a sample,
    each from its full-context pass), resumed as one memory of the whole sample: each group
    gives only the rows and positions asked for, so nothing else is copied."""

    def __init__(self, parts: list[Cache]) -> None:
        self.parts = parts

    def resumed(self, mem_len: float, at: int, rows: Tensor | None = None) -> Cache:
        """Cache.resumed over the whole sample: `rows` (None: all) count across the groups."""
        pieces: list[Cache] = []
        offset = 0
        for part in self.parts:
            size = part.batch_size()
            if rows is None:
                pieces.append(part.resumed(mem_len, at))
            else:
                mine = rows[(rows >= offset) & (rows < offset + size)] - offset
                if len(mine):
                    pieces.append(part.resumed(mem_len, at, mine))
            offset += size
        return _stacked(pieces)


def _stacked(memories: list[Cache]) -> Cache:
    """One memory holding the sequences of `memories` one after another along the batch:
    memories of the same stream that have read and kept the same positions."""
    first = memories[0]
    if len(memories) == 1:
        return first
    if any(
        m.seen != first.seen or m.mem_len != first.mem_len or m.held() != first.held()
        for m in memories
    ):
        raise ValueError("stacked memories must have read and kept the same positions")
    out = Cache(len(first._keys), first.mem_len, first.positions)
    for name in ("_keys", "_values"):
        for layer, target in enumerate(getattr(out, name)):
            views = [getattr(m, name)[layer].view() for m in memories]
            if views[0] is not None:
                target.hold(torch.cat(views))  # (sum of B, H, held, d)
    out.seen = first.seen
    return out
