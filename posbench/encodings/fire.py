"""FIRE (Li et al. 2024): a learned function of a progressively interpolated distance;
mcleish7/arithmetic, cramming/architectures/embeddings.py (class FIRE)."""

from __future__ import annotations

import math
from functools import partial
from typing import Annotated

import torch
from torch import Tensor, nn

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.bias_kinds import SegmentBias, diagonal_sums, toeplitz
from posbench.validation import Range

#: Rows per block when assembling the rows past the threshold (measured on the bias alone,
#: forward and backward at L = 2048, one profile each: 16 rows 128 ms, 32 118, 64 104, 128 122,
#: 256 154).
FIRE_ROWS = 64


@register_encoding("fire")
class FIRE(PositionalEncoding):
    """FIRE (Li et al. 2024; mcleish7/arithmetic): bias = MLP_h( log(|c (i - j)| + 1) / (log(|c
    max(i, L)| + 1) + eps) ).

    A 1 -> ``mlp_width`` -> H MLP with a ReLU, learned c (init 0.1) and a learned multiplier on
    the threshold L (init ``init_threshold`` = 512), one per model, as the reference. The
    normaliser grows with the query's position i once i passes L (progressive interpolation),
    so the bias is not a function of i - j alone: FIRE is not shift-invariant past L.

    The MLP has one input, so it is piecewise linear in f(u): along a query's keys the bias is
    f(u) * a + b, with a and b changing only where a hidden unit switches on or off. Square
    scores (a segment read without memory) get those segments as a SegmentBias (``_segments``),
    which posbench's C++ kernel forms row by row, reducing the gradient to the segments'; its
    dense form, and the bias of any other spans, is dense (H, Lq, Lk): rows i < L read one value
    per distance (a Toeplitz matrix), rows past L, in blocks of rows, are summed along the keys
    from the keys where each hidden unit switches (``_past_threshold``, ``_FireBias``): O(L^2 *
    H) instead of the MLP's O(L^2 * mlp_width * H), forward and backward.
    """

    relative = False  # the normaliser depends on i once i >= L
    cost_note = (
        "the MLP is piecewise linear in its one input, so each query's keys fall into at most "
        "2 * mlp_width + 1 segments where the bias is linear in log(|c (i - j)| + 1); "
        "posbench's C++ kernel forms it in each row of causal square scores and sums its "
        "gradient per segment (no (H, L, L) tensor); elsewhere the bias is dense (H, Lq, Lk)"
    )
    #: The MLP's output bias adds one constant per head to every logit, which softmax ignores.
    gradient_free = ("mlp.2.bias",)

    def __init__(
        self,
        shape: AttentionShape,
        *,
        mlp_width: Annotated[int, Range(ge=1)] = 32,
        init_c: Annotated[float, Range(gt=0)] = 0.1,
        init_threshold: Annotated[float, Range(gt=0)] = 512.0,
        eps: Annotated[float, Range(gt=0)] = 1e-6,
    ) -> None:
        super().__init__(shape)
        self.mlp = nn.Sequential(
            nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, shape.n_heads)
        )
        self.c = nn.Parameter(torch.tensor(init_c))
        self.register_buffer("init_threshold", torch.tensor(init_threshold), persistent=False)
        self.threshold_multiplier = nn.Parameter(torch.tensor(1.0))
        self.eps = eps

    def _log_scaled(self, x: Tensor) -> Tensor:
        """log(|c x| + 1): f of a distance, and of max(i, L) in the normaliser."""
        return torch.log(torch.abs(self.c * x) + 1)

    def _normaliser(self, position: Tensor) -> Tensor:
        """N_i = log(|c max(i, L)| + 1) + eps for query positions i."""
        threshold = torch.abs(self.threshold_multiplier * self.init_threshold)
        return self._log_scaled(torch.maximum(position, threshold)) + self.eps

    def _normalised(self, distance: Tensor, position: Tensor) -> Tensor:
        """f(d) / N_i, broadcasting d against i."""
        return self._log_scaled(distance) / self._normaliser(position)

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor | SegmentBias:
        """Square scores (a segment read without memory, at plain or drawn positions): a
        SegmentBias, which posbench's kernel forms row by row where attention is causal; any
        other spans: the dense (H, Lq, Lk) bias."""
        if not q_span.same_positions(k_span):
            return self._dense_bias(q_span, k_span, device)
        start, a, b, f = self._segments(q_span, device)
        dense = partial(self._dense_bias, q_span, k_span, device)
        return SegmentBias(start, a, b, f, dense, q_span.positions)

    def _segments(self, span: Span, device: torch.device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The causal square bias as a SegmentBias's (start, a, b, f). In row i the MLP reads
        x = f(u) / N_i, u = p_i - p_j, so each hidden unit is on for one run of distances (see
        ``_on_distances``): a run of keys. Between the keys where a unit of the row switches on
        or off the same units are on and the bias is f(u) * a + b, a = sum w2 * w1 / N_i and
        b = sum w2 * b1 (+ b2) over them: each row's switches, sorted, start its segments and
        the running sum of their steps gives each segment's a and b. A row has at most
        2 * mlp_width + 1 segments; switches at no key of the row are placed at key L, past
        every row, so its unused segments come last and are empty. Returns starts (L, S),
        a and b (H, L, S), differentiable in every parameter, and f (U + 1,) at the distances
        0 .. U, U the span's widest."""
        hidden, out = self.mlp[0], self.mlp[2]
        dtype, length, widest = self.c.dtype, len(span), span.last - span.first
        positions = span.arange(device)  # (L,)
        normaliser = self._normaliser(positions.to(dtype))  # (L,)
        f = self._log_scaled(torch.arange(widest + 1, device=device, dtype=dtype))  # (U + 1,)
        with torch.no_grad():
            on_from, on_to = self._on_distances(f.detach(), normaliser.detach())  # (L, K)
            row = torch.arange(length, device=device)[:, None]  # (L, 1)
            if span.contiguous:  # the unit's keys: first .. last - 1
                first, last = (row - on_to + 1).clamp(min=0), (row - on_from + 1).clamp(min=0)
            else:  # keys at distances on_from <= p_i - p_j < on_to
                at = positions[:, None] + 1
                first = torch.searchsorted(positions, (at - on_to).contiguous())
                last = torch.searchsorted(positions, (at - on_from).contiguous())
            used = first < last
            # (L, 1 + 2K): the row's start, then each unit's switch on and off
            switches = torch.cat([torch.zeros_like(row), first, last], 1)
            row_start = torch.ones_like(row, dtype=torch.bool)
            inside = torch.cat([row_start, used, used & (last <= row)], 1)  # at a key of the row
            start, order = torch.where(inside, switches, length).sort(1)  # (L, S)
            units = hidden.out_features
            signs = torch.ones_like(switches, dtype=dtype)
            signs[:, 0] = 0  # the row's start steps nothing
            signs[:, 1 + units :] = -1  # on, then off
            signs = torch.where(inside, signs, 0.0).gather(1, order)
            unit = ((order - 1) % units).view(1, -1)  # (1, L * S): the unit of each switch
        # each unit's steps, w2 * w1 (a's) then w2 * b1 (b's): (2H, K), summed in segment order
        per_unit = torch.cat([out.weight * hidden.weight[:, 0], out.weight * hidden.bias])
        steps = per_unit.gather(1, unit.expand(per_unit.shape[0], -1)).view(-1, *start.shape)
        a, b = (steps * signs).cumsum(2).chunk(2)  # (H, L, S) each
        return start, a / normaliser[:, None], b + out.bias[:, None, None], f

    def _on_distances(self, f: Tensor, normaliser: Tensor) -> tuple[Tensor, Tensor]:
        """Where each hidden unit relu(w1 x + b1) is on in rows with normalisers (P,), x = f(u)
        / N: distances start <= u < stop, (P, K) each, found in f (U + 1,) at the distances
        0 .. U (f rises with u, so a unit is off on one side of one distance)."""
        hidden = self.mlp[0]
        w1, b1 = hidden.weight[:, 0].detach(), hidden.bias.detach()  # (K,)
        longest = f.shape[0] - 1
        crossing = -b1[None, :] * normaliser[:, None] / w1[None, :]  # f(u) at w1 x + b1 = 0
        crossing = torch.nan_to_num(crossing)  # w1 = 0: the unit's sign is b1's alone
        rising, falling = w1 > 0, w1 < 0
        start = torch.where(rising, torch.searchsorted(f, crossing, right=True), 0)
        stop = torch.where(
            falling,
            torch.searchsorted(f, crossing, right=False),
            torch.where(rising | (b1 > 0), longest + 1, 0),
        )
        return start, torch.maximum(stop, start)

    def _dense_bias(self, q_span: Span, k_span: Span, device: torch.device) -> Tensor:
        """The (H, Lq, Lk) bias at every pair of the spans."""
        dtype = self.c.dtype
        n_short = 0  # rows whose normaliser is the threshold's, positions below it
        if q_span.contiguous and k_span.contiguous:
            threshold = abs(float(self.threshold_multiplier.detach() * self.init_threshold))
            below = math.ceil(threshold) - q_span.first
            n_short = min(len(q_span), max(0, below))
        short_values = None
        if n_short:  # one value per distance i - j for these rows: a Toeplitz matrix
            lo, hi = q_span.first - k_span.last, q_span.first + n_short - 1 - k_span.first
            distances = torch.arange(lo, hi + 1, device=device).to(dtype)  # (n,)
            short_values = self.mlp(
                self._normalised(distances, torch.zeros((), device=device, dtype=dtype))[:, None]
            ).T  # (H, n)
        past, keys = q_span.arange(device)[n_short:], k_span.arange(device)  # (P,), (Lk,)
        steps = intervals = f = None
        if len(past):
            # the largest distance any pair of the spans has, at least any past row's
            longest = max(q_span.last - k_span.first, k_span.last - q_span.first, 0)
            steps, intervals, f = self._past_threshold(past, keys, longest)
        return _FireBias.apply(
            short_values, steps, f, self.c, self.mlp[2].bias, n_short, past, keys, intervals
        )

    def _past_threshold(
        self, rows: Tensor, keys: Tensor, longest: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Rows at positions `rows` (P,) past the threshold, against keys at `keys` (Lk,), as
        each hidden unit's contribution and where it is on, without running the MLP per pair.
        In a row i the MLP reads x = f(u) / N_i, with f(u) = log(|c u| + 1) rising in the
        distance u = |i - j| and N_i the row's normaliser, so each hidden unit relu(w1 x + b1)
        is off on one side of one distance and linear in f(u) on the other: the row's bias is
        f(u) * A_i(u) + B_i(u) + b2, where A and B sum w2 * w1 / N_i and w2 * b1 over the units
        on at u. Returns those steps (2H, P, K), A's then B's, the keys where each unit is
        on, (P, 4K) key indices [a, b, a', b']: on for a <= j < b (keys at or before the
        query) and a' <= j < b' (keys after it), and f at the distances 0..longest, which
        must cover every pair's."""
        hidden, out = self.mlp[0], self.mlp[2]
        w1, b1 = hidden.weight[:, 0], hidden.bias  # (K,)
        normaliser = self._normaliser(rows.to(self.c.dtype))  # (P,)
        slope = (out.weight * w1)[:, None, :] / normaliser[None, :, None]  # (H, P, K)
        offset = (out.weight * b1)[:, None, :].expand_as(slope)  # (H, P, K)
        with torch.no_grad():  # each unit is on for distances start <= u < stop, (P, K)
            distances = torch.arange(longest + 1, device=rows.device, dtype=self.c.dtype)
            f = self._log_scaled(distances)  # (U + 1,)
            start, stop = self._on_distances(f, normaliser)
            at = rows[:, None]  # (P, 1): keys with at - stop < j <= at - start, then
            intervals = torch.cat(  # at + max(start, 1) <= j < at + max(stop, 1)
                [
                    torch.searchsorted(keys, at - stop, right=True),
                    torch.searchsorted(keys, at - start, right=True),
                    torch.searchsorted(keys, at + start.clamp(min=1)),
                    torch.searchsorted(keys, at + stop.clamp(min=1)),
                ],
                dim=1,
            )  # (P, 4K)
        return torch.cat([slope, offset]), intervals, f


class _FireBias(torch.autograd.Function):
    """FIRE's (H, Lq, Lk) bias: the Toeplitz rows below the threshold from their per-distance
    values, the rows past it from their hidden units' steps, a block of rows at a time. A past
    row's bias is f(u) * A + B + b2 with A and B piecewise constant along the keys: the steps
    are scattered at the keys where each unit switches on and off and summed along the keys.
    The backward pass needs only the sums of G * f(u), G and G * df(u)/dc over each unit's
    keys, read off prefix sums along the keys, so nothing of size (H, rows, keys) is kept
    between the passes."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        short_values: Tensor | None,  # (H, n_short + Lk - 1): the rows below the threshold
        steps: Tensor | None,  # (2H, P, K): A's steps, then B's, for the rows past it
        f: Tensor | None,  # (U + 1,): log(|c u| + 1) at every distance the spans have
        c: Tensor,  # ()
        b2: Tensor,  # (H,): the MLP's output bias
        n_short: int,
        rows: Tensor,  # (P,): positions of the rows past the threshold
        keys: Tensor,  # (Lk,): key positions, increasing
        intervals: Tensor | None,  # (P, 4K): key indices a, b, a', b' per unit
    ) -> Tensor:
        H, k_len, n_past = b2.shape[0], keys.shape[0], rows.shape[0]
        out = b2.new_empty(H, n_short + n_past, k_len)
        if short_values is not None:
            out[:, :n_short] = toeplitz(short_values, n_short, k_len)
        ctx.save_for_backward(steps, f, c, rows, keys, intervals)
        ctx.n_short, ctx.has_short = n_short, short_values is not None
        if steps is None:
            return out
        signed = torch.cat([steps, -steps, steps, -steps], dim=2)  # (2H, P, 4K): on, off
        for r0 in range(0, n_past, FIRE_ROWS):
            r1 = min(r0 + FIRE_ROWS, n_past)
            on = out.new_zeros(2 * H, r1 - r0, k_len + 1)  # column Lk: past the last key
            on.scatter_add_(2, intervals[None, r0:r1].expand(2 * H, -1, -1), signed[:, r0:r1])
            on[H:, :, 0] += b2[:, None]
            on.cumsum_(2)  # (2H, R, Lk + 1): A, then B + b2, at every key
            distance = (rows[r0:r1, None] - keys[None, :]).abs()  # (R, Lk)
            torch.addcmul(
                on[H:, :, :k_len],
                on[:H, :, :k_len],
                f[distance],
                out=out[:, n_short + r0 : n_short + r1],
            )
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        steps, f, c, rows, keys, intervals = ctx.saved_tensors
        n_short = ctx.n_short
        d_short = diagonal_sums(grad[:, :n_short]) if ctx.has_short else None
        if steps is None:
            return d_short, None, None, None, None, None, None, None, None
        H, k_len, n_past, units = grad.shape[0], keys.shape[0], rows.shape[0], steps.shape[2]
        distances = torch.arange(f.shape[0], device=c.device, dtype=c.dtype)
        df_dc = torch.sign(c) * distances / (torch.abs(c * distances) + 1)  # (U + 1,)
        d_steps = torch.empty_like(steps)
        d_c, d_b2 = c.new_zeros(()), c.new_zeros(H)
        for r0 in range(0, n_past, FIRE_ROWS):
            r1 = min(r0 + FIRE_ROWS, n_past)
            g = grad[:, n_short + r0 : n_short + r1]  # (H, R, Lk)
            distance = (rows[r0:r1, None] - keys[None, :]).abs()  # (R, Lk)
            sums = grad.new_empty(3 * H, r1 - r0, k_len + 1)
            sums[..., 0] = 0.0
            torch.mul(g, f[distance], out=sums[:H, :, 1:])
            sums[H : 2 * H, :, 1:] = g
            torch.mul(g, df_dc[distance], out=sums[2 * H :, :, 1:])
            sums.cumsum_(2)  # (3H, R, Lk + 1): column j sums the keys before j
            at = sums.gather(2, intervals[None, r0:r1].expand(3 * H, -1, -1))  # (3H, R, 4K)
            on = at[..., units : 2 * units] - at[..., :units]  # keys a..b-1, (3H, R, K)
            on += at[..., 3 * units :] - at[..., 2 * units : 3 * units]  # keys a'..b'-1
            d_steps[:, r0:r1] = on[: 2 * H]
            d_c += (steps[:H, r0:r1] * on[2 * H :]).sum()
            d_b2 += sums[H : 2 * H, :, k_len].sum(1)
        return d_short, d_steps, None, d_c, d_b2, None, None, None, None
