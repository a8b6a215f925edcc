"""The one place attention chooses its kernel. An ordered list of backends, as ATen's
select_sdp_backend walks its own: each says why it does not serve a call, or serves it, and the
first that serves runs it. Encodings only describe their scores (posbench.bias_kinds: no bias,
a bias of (head, i - j) alone, a band, a table by distance or by key, a dense bias, CoPE's
content-gated positions); none names a kernel or tests the device. Each call's choice, with
every earlier backend's reason for refusing it, is recorded (served.decided) into the run's
env.json.

The backends, in order:
1. torch flex_attention (CUDA): a bias of (head, i - j) alone, read per distance.
2. posbench's C++ kernels (CPU, float32 or float64, built here): causal square attention with
   no bias (from NATIVE_MIN_PAIRS pairs), a per-distance bias, a band, a table by distance or
   by key, FIRE's segments, a dense bias, or CoPE's positions.
3. posbench's blocked torch kernels: CPU flash attention with the bias as a mask (a band, the
   tables, a learned per-distance bias with its gradient per distance), and attention a block of
   query rows at a time for a bias formed per block (CoPE on any device).
4. torch scaled_dot_product_attention: everything else, the bias made dense (or, off the CPU,
   the encoding's fallback form of it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from posbench.bias_kinds import (
    BandBias,
    DistanceTableBias,
    GatedPositionBias,
    KeyTableBias,
    RowBlockBias,
    Scores,
    SegmentBias,
    ToeplitzBias,
)
from posbench.kernels import biased_attention as blocked
from posbench.kernels import flash_ops, native, served
from posbench.kernels.band_attention import band_attention
from posbench.kernels.cope_attention import cope_attention
from posbench.kernels.flex_bias import flex_available, flex_distance_attention, flex_failed
from posbench.kernels.fused_band_attention import (
    causal_band,
    distance_band,
    fused_band_attention,
)
from posbench.kernels.fused_cope_attention import cope_fused_applies, fused_cope_attention
from posbench.kernels.masks import causal_mask
from posbench.kernels.rel_shift_attention import (
    causal_table_bias,
    key_table_attention,
    rel_shift_attention,
)
from posbench.kernels.row_block_attention import BLOCK_ELEMENTS, row_block_attention

__all__ = ["BLOCK_ELEMENTS", "BACKENDS", "Call", "attend", "biased_attention"]

#: Biases a kernel takes (Tensor: dense, broadcastable to (B, H, Lq, Lk)).
Bias = (
    Tensor | ToeplitzBias | BandBias | DistanceTableBias | KeyTableBias | RowBlockBias | SegmentBias
)


@dataclass
class Call:
    """One attention call: q (B, H, Lq, d) and k, v (B, H, Lk, d) after rotation and the cache;
    mask (Lq, Lk) True where attention is allowed (None: every key); `square`: causal, each
    query the last of its keys at the same positions (a segment with no memory). What the
    scores need comes from the encoding's hooks: `distance(lo, hi)` its bias of (head, i - j)
    for distances lo..hi, (H, hi - lo + 1), or None where it is not a function of the distance
    alone; `make_scores()` its scores (formed once, on first use)."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    causal: bool
    square: bool
    distance: Callable[[int, int], Tensor | None] = lambda lo, hi: None
    #: The distances i - j the queries and keys reach (flex reads them all) and the widest a
    #: square call reaches (the C++ kernel reads 0..widest).
    reach: tuple[int, int] = (0, 0)
    widest: int = 0
    #: The queries' and keys' positions (flex), and a square call's drawn positions (None:
    #: contiguous; the C++ kernel reads them).
    positions: Callable[[], tuple[Tensor, Tensor]] | None = None
    drawn: Tensor | None = None
    make_scores: Callable[[], Scores] | None = None
    _scores: Scores | None = field(default=None, repr=False)
    _distances: dict[tuple[int, int], Tensor | None] = field(default_factory=dict, repr=False)

    @property
    def scores(self) -> Scores:
        """The encoding's scores, formed once."""
        if self._scores is None:
            assert self.make_scores is not None
            self._scores = self.make_scores()
        return self._scores

    def distance_values(self, lo: int, hi: int) -> Tensor | None:
        """The encoding's bias for distances lo..hi, formed once."""
        if (lo, hi) not in self._distances:
            self._distances[lo, hi] = self.distance(lo, hi)
        return self._distances[lo, hi]

    def scale(self) -> float:
        return 1.0 / math.sqrt(self.q.shape[-1])


class Backend(Protocol):
    """A kernel family: `refusal` says why it does not serve a call (None: it serves it), and
    `run` computes it (None when it failed at run time and the next backend must)."""

    name: str

    def refusal(self, call: Call) -> str | None: ...

    def run(self, call: Call) -> Tensor | None: ...


class Flex:
    name = served.FLEX

    def refusal(self, call: Call) -> str | None:
        if call.q.shape[2] == 1:
            return "one query (decoding) needs no kernel"
        if not flex_available(call.q.device, call.q.shape[-1]):
            return "needs CUDA with a working flex_attention and heads of 16 or more"
        if call.distance_values(*call.reach) is None:
            return "the bias is not a function of (head, i - j) alone"
        return None

    def run(self, call: Call) -> Tensor | None:
        lo, hi = call.reach
        values = call.distance_values(lo, hi)  # (H, hi - lo + 1)
        assert values is not None and call.positions is not None
        q_pos, k_pos = call.positions()
        try:
            served.note(served.FLEX)
            return flex_distance_attention(
                call.q, call.k, call.v, values, lo, q_pos, k_pos, call.scale(), call.causal
            )
        except Exception as error:  # a torch or driver that cannot compile it
            flex_failed(error)
            return None


def _native_refusal(q: Tensor, v: Tensor, learned: bool, kernel: str = "band_flash") -> str | None:
    """Why posbench's C++ kernel does not take q (B, H, L, d) and v (None: it does)."""
    if not native.serves(q):
        return "needs the CPU and float32 or float64"
    if q.shape[-1] != v.shape[-1]:
        return "needs v as wide as q"
    if not learned and q.shape[-2] ** 2 < blocked.NATIVE_MIN_PAIRS:
        return f"a fixed bias below {blocked.NATIVE_MIN_PAIRS} pairs runs faster on torch's kernels"
    if not native.built(kernel):
        return "not built here (switched off, or the build failed)"
    return None


class NativeDistance:
    """The C++ kernel reading a bias of (head, p_i - p_j) alone as a one-row band, before the
    encoding forms any scores."""

    name = "C++ kernel, per-distance bias"

    def refusal(self, call: Call) -> str | None:
        if not call.square:
            return "not causal square attention (a cache, or an encoder)"
        why = _native_refusal(call.q, call.v, learned=True)
        if why:
            return why
        values = call.distance_values(0, call.widest)
        if values is None:
            return "the bias is not a function of (head, i - j) alone"
        return _native_refusal(call.q, call.v, blocked.needs_gradient(values))

    def run(self, call: Call) -> Tensor:
        values = call.distance_values(0, call.widest)  # (H, widest + 1)
        assert values is not None
        band = distance_band(values.to(call.q.dtype))  # (1, H, 1, widest + 1)
        return fused_band_attention(call.q, call.k, call.v, band, call.scale(), call.drawn)


class Native:
    """posbench's C++ kernels on the encoding's scores."""

    name = "C++ kernel"

    def refusal(self, call: Call) -> str | None:
        scores, v = call.scores, call.v
        bias = scores.bias
        if isinstance(bias, GatedPositionBias):
            if not (bias.square and bias.causal):
                return "CoPE's kernel needs causal square attention"
            if not cope_fused_applies(scores.q, scores.k, v, bias.causal):
                return _native_refusal(scores.q, v, True, "cope_flash") or "q, k and v differ"
            return None
        if isinstance(bias, RowBlockBias):
            return "a bias formed a block of rows at a time has no C++ kernel"
        if bias is None:
            if not call.square:
                return "not causal square attention (a cache, or an encoder)"
            return _native_refusal(scores.q, v, learned=False)
        q_len, k_len = scores.q.shape[-2], scores.k.shape[-2]
        if call.mask is None or q_len != k_len:
            return "not causal square attention (a cache, or an encoder)"
        return _native_refusal(scores.q, v, blocked.learned_bias(bias))

    def run(self, call: Call) -> Tensor:
        scores, q, k, v = call.scores, call.scores.q, call.scores.k, call.v
        bias, scale = scores.bias, scores.scale
        if isinstance(bias, GatedPositionBias):
            assert bias.table is not None
            return fused_cope_attention(q, k, v, bias.table, scale)
        if bias is None:
            return fused_band_attention(q, k, v, q.new_empty(1, q.shape[1], 1, 0), scale)
        if isinstance(bias, BandBias):
            return blocked.fused_band_bias(q, k, v, bias, scale)
        if isinstance(bias, (DistanceTableBias, KeyTableBias)):
            by_distance = isinstance(bias, DistanceTableBias)
            positions = bias.positions if isinstance(bias, DistanceTableBias) else None
            no_band = q.new_empty(1, q.shape[1], 1, 0)
            table = (bias.a, bias.table.to(q.dtype), by_distance)
            return fused_band_attention(q, k, v, no_band, scale, positions, table_bias=table)
        if isinstance(bias, ToeplitzBias):
            band = causal_band(bias.values.to(q.dtype), bias.q_len, bias.k_len)
            return fused_band_attention(q, k, v, band, scale)
        if isinstance(bias, SegmentBias):
            no_band = q.new_empty(1, q.shape[1], 1, 0)
            return fused_band_attention(q, k, v, no_band, scale, bias.positions, segments=bias)
        return fused_band_attention(q, k, v, _four_dims(bias.to(q.dtype)), scale, by_key=True)


def _four_dims(bias: Tensor) -> Tensor:
    return bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape)) if bias.dim() < 4 else bias


def _flash(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why the CPU flash kernel does not take q, k and v (None: it does)."""
    if q.device.type != "cpu" or q.dtype != torch.float32:
        return "needs the CPU and float32"
    if q.shape[-1] != v.shape[-1]:
        return "needs v as wide as q"
    if q.shape[-2] * k.shape[-2] < blocked.FLASH_MIN_PAIRS:
        return f"below {blocked.FLASH_MIN_PAIRS} pairs the math path's few operations win"
    if not flash_ops.available():
        return "torch's CPU flash operators are not available in this torch"
    return None


class Blocked:
    """posbench's blocked torch kernels: the CPU flash kernel with the bias as a mask, and
    attention a block of query rows at a time for a bias formed per block."""

    name = "posbench's blocked torch kernels"

    def refusal(self, call: Call) -> str | None:
        scores = call.scores
        if isinstance(scores.bias, RowBlockBias):
            return None  # torch code, any device
        if scores.bias is None:
            return "no bias: torch's fused attention serves it"
        return _flash(scores.q, scores.k, call.v)

    def run(self, call: Call) -> Tensor:
        scores, v, mask = call.scores, call.v, call.mask
        q, k, bias, scale = scores.q, scores.k, scores.bias, scores.scale
        if isinstance(bias, GatedPositionBias):
            assert bias.table is not None
            return cope_attention(q, k, v, bias.table, mask, bias.causal, scale, bias.npos)
        if isinstance(bias, RowBlockBias):
            return row_block_attention(q, k, v, bias, scale, mask)
        q_len, k_len = q.shape[-2], k.shape[-2]
        square = mask is not None and q_len == k_len
        if isinstance(bias, BandBias):
            if square:
                served.note(served.TORCH_FLASH)
                return band_attention(q, k, v, bias.full_band().to(q.dtype), scale)
            bias = bias.dense(q_len)
        if isinstance(bias, DistanceTableBias) and bias.by_key is not None:
            bias = bias.by_key()
        if isinstance(bias, (DistanceTableBias, KeyTableBias)):
            if mask is not None and q_len <= k_len:  # queries: the last keys
                served.note(served.TORCH_FLASH)
                table = bias.table.to(q.dtype)
                if isinstance(bias, DistanceTableBias):
                    return rel_shift_attention(q, k, v, bias.a, table, scale, bias.positions)
                return key_table_attention(q, k, v, bias.a, table, scale)
            bias = bias.dense()
        if isinstance(bias, SegmentBias):
            bias = bias.dense()
        if isinstance(bias, ToeplitzBias):
            kernel_masks = mask is None or square  # nothing left to mask in the bias
            if kernel_masks and blocked.needs_gradient(bias.values):
                served.note(served.TORCH_FLASH)
                return blocked.flash_toeplitz(q, k, v, bias, scale, mask)
            bias = bias.dense()
        return blocked.flash_dense(q, k, v, _four_dims(bias.to(q.dtype)), scale, mask, square)


class Math:
    """torch's scaled_dot_product_attention: no bias through its fused paths, any bias made
    dense (off the CPU, the encoding's fallback form where it gives one)."""

    name = served.TORCH_SDPA

    def refusal(self, call: Call) -> str | None:
        return None

    def run(self, call: Call) -> Tensor:
        scores, v, mask = call.scores, call.v, call.mask
        if scores.bias is not None and scores.fallback is not None and not reads_blocked(scores.q):
            scores = scores.fallback()
            v = _widen(v, scores.q)
        q, k, bias = scores.q, scores.k, scores.bias
        if bias is None:
            served.note(served.TORCH_SDPA)
            if call.causal and q.shape[2] == k.shape[2]:  # the fused causal fast path
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scores.scale)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scores.scale)
        if isinstance(bias, DistanceTableBias) and bias.by_key is not None:
            bias = bias.by_key()
        q_len, k_len = q.shape[2], k.shape[2]
        if (
            isinstance(bias, DistanceTableBias)
            and bias.positions is None
            and bias.table.shape[-2] >= k_len
            and (
                mask is causal_mask(q_len, k_len, q.device)
                or (mask is None and q_len == 1 and call.causal)
            )
        ):  # the shifted table holds the causal mask as -inf
            dense = causal_table_bias(bias.a, bias.table, k_len).to(q.dtype)
            if k_len <= UNFUSED_MAX_KEYS and q.is_cpu and not torch.is_grad_enabled():
                return _unfused_attention(q, k, v, dense, scores.scale)
            served.note(served.TORCH_SDPA)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scores.scale)
        served.note(served.TORCH_SDPA)
        dense = bias.dense(q.shape[2]) if not isinstance(bias, Tensor) else bias
        dense = _four_dims(dense.to(q.dtype))
        if mask is not None:
            dense = dense.masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=scores.scale)


#: Rows of at most this many keys read a dense bias faster unfused on the CPU: torch's flash
#: kernel works per (batch, head) block, and for short rows that overhead exceeds the arithmetic.
#: Measured for 1024 (batch, head) pairs of 16 dimensions, 2 threads, 1 to 64 queries: unfused
#: 1.2x-4.4x faster up to 96 keys, from 0.7x to 2x at 128 and more (docs/performance.md).
UNFUSED_MAX_KEYS = 96


def _unfused_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float | None
) -> Tensor:
    """softmax(scale q k^T + bias) v for q (B, H, Lq, d), k (B, H, Lk, d), v (B, H, Lk, e) and a
    bias (B, H, Lq, Lk) that leaves each query at least one key, as three plain operations."""
    B, H, q_len, d = q.shape
    k_len = k.shape[2]
    logits = torch.baddbmm(
        bias.expand(B, H, q_len, k_len).reshape(B * H, q_len, k_len),
        q.reshape(B * H, q_len, d),
        k.reshape(B * H, k_len, d).transpose(1, 2),
        alpha=d**-0.5 if scale is None else scale,
    )  # (B * H, Lq, Lk): bias + scale q k^T
    torch.softmax(logits, -1, out=logits)
    served.note(served.TORCH_UNFUSED)
    return torch.matmul(logits.view(B, H, q_len, k_len), v)  # (B, H, Lq, e)


def reads_blocked(q: Tensor) -> bool:
    """Whether torch reads a blocked bias densely at least as well as its fallback form (on the
    CPU, where the math path serves only short or float64 inputs); elsewhere (CUDA) the
    encoding's fallback keeps fused attention in linear memory."""
    return q.is_cpu


def _widen(v: Tensor, q: Tensor) -> Tensor:
    """Folded encodings widen q and k; flash attention needs v just as wide. A single decoding
    query needs no kernel, so the cached values are not copied per token."""
    if q.shape[-1] != v.shape[-1] and q.shape[2] > 1:
        return F.pad(v, (0, q.shape[-1] - v.shape[-1]))
    return v


#: The backends attention walks, in order; the first that serves a call runs it.
BACKENDS: tuple[Backend, ...] = (Flex(), NativeDistance(), Native(), Blocked(), Math())
#: The backends that read the encoding's scores (the first two read its per-distance bias).
ON_SCORES: tuple[Backend, ...] = BACKENDS[2:]


def attend(call: Call, backends: tuple[Backend, ...] = BACKENDS) -> Tensor:
    """softmax(scores, masked) v for `call` through the first backend that serves it: (B, H,
    Lq, dv). Records the choice and why each earlier backend refused (served.decided)."""
    refused: dict[str, str] = {}
    for backend in backends:
        reason = backend.refusal(call)
        if reason is not None:
            refused[backend.name] = reason
            continue
        if backend in ON_SCORES and call.v.shape[-1] != call.scores.q.shape[-1]:
            call.v = _widen(call.v, call.scores.q)
        out = backend.run(call)
        if out is None:
            refused[backend.name] = "failed at run time (warned once)"
            continue
        served.decided(backend.name, refused)
        return out
    raise AssertionError("the math backend serves every call")


def biased_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Bias, scale: float, mask: Tensor | None
) -> Tensor:
    """softmax(scale * q k^T + bias) v for q, k (B, H, Lq|Lk, d), v (B, H, Lk, d) and a bias of
    any kind; mask (Lq, Lk) True where attention is allowed (None: no mask), causal when
    given. The scores are formed already, so the per-distance backends are not asked."""
    scores = Scores(q, k, bias, scale)
    call = Call(q, k, v, mask, causal=mask is not None, square=False, _scores=scores)
    return attend(call, ON_SCORES)
