"""FIRE (Li et al. 2024): a learned function of a progressively interpolated distance;
mcleish7/arithmetic, cramming/architectures/embeddings.py (class FIRE)."""

from __future__ import annotations

from typing import Annotated

import torch
from torch import Tensor, nn

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.kernels.bias_types import toeplitz
from posbench.validation import Range


@register_encoding("fire")
class FIRE(PositionalEncoding):
    """FIRE (Li et al. 2024; mcleish7/arithmetic): bias = MLP_h( log(|c (i - j)| + 1) / (log(|c
    max(i, L)| + 1) + eps) ).

    A 1 -> ``mlp_width`` -> H MLP with a ReLU, learned c (init 0.1) and a learned multiplier on
    the threshold L (init ``init_threshold`` = 512), one per model, as the reference. The
    normaliser grows with the query's position i once i passes L (progressive interpolation),
    so the bias is not a function of i - j alone: FIRE is not shift-invariant past L. Rows
    i < L read one value per distance (a Toeplitz matrix); rows past L, in blocks of rows, from
    each hidden unit's switching distance (see ``_past_threshold``): O(L^2 * H) per block
    instead of the MLP's O(L^2 * mlp_width * H).
    """

    relative = False  # the normaliser depends on i once i >= L
    cost_note = (
        "an MLP runs per distance below the threshold; past it each row is assembled per "
        "distance from the hidden units' switching points; the learned (H, L, L) bias is "
        "dense, so attention forms its gradient at every pair in the backward pass"
    )
    #: The MLP's output bias adds one constant per head to every logit, which softmax ignores.
    gradient_free = ("mlp.2.bias",)
    #: Rows per block when the bias is computed per (i, j) pair.
    ROW_BLOCK = 128

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

    def _normalised(self, distance: Tensor, position: Tensor) -> Tensor:
        """log(|c d| + 1) / (log(|c max(i, L)| + 1) + eps), broadcasting d against i."""
        threshold = torch.abs(self.threshold_multiplier * self.init_threshold)
        normaliser = torch.log(torch.abs(self.c * torch.maximum(position, threshold)) + 1)
        return torch.log(torch.abs(self.c * distance) + 1) / (normaliser + self.eps)

    def position_bias(
        self, q_span: Span, k_span: Span, layer: LayerContext, device: torch.device
    ) -> Tensor:
        threshold = float(
            torch.abs(self.threshold_multiplier.detach() * self.init_threshold)
        )  # which rows
        dtype = self.c.dtype
        rows = q_span.arange(device).to(dtype)  # (Lq,)
        short = rows < threshold  # rows whose normaliser is the threshold's
        n_short = (
            int(short.sum()) if q_span.contiguous and k_span.contiguous else 0
        )  # Toeplitz rows
        parts = []
        if n_short:  # one value per distance i - j for these rows: a Toeplitz matrix
            lo, hi = q_span.first - k_span.last, q_span.first + n_short - 1 - k_span.first
            distances = torch.arange(lo, hi + 1, device=device).to(dtype)  # (n,)
            values = self.mlp(
                self._normalised(distances, torch.zeros((), device=device, dtype=dtype))[:, None]
            )  # (n, H)
            parts.append(toeplitz(values.T, n_short, len(k_span)))  # (H, n_short, Lk)
        keys = k_span.arange(device).to(dtype)
        for start in range(n_short, len(q_span), self.ROW_BLOCK):
            parts.append(self._past_threshold(rows[start : start + self.ROW_BLOCK], keys))
        return torch.cat(parts, dim=1)  # (H, Lq, Lk)

    def _past_threshold(self, rows: Tensor, keys: Tensor) -> Tensor:
        """The bias of queries at positions `rows` (R,) against keys at `keys` (Lk,), (H, R,
        Lk), without running the MLP per pair. In a row i the MLP reads x = f(u) / N_i, with
        f(u) = log(|c u| + 1) rising in the distance u = |i - j| and N_i the row's normaliser,
        so each hidden unit relu(w1 x + b1) is off on one side of one distance and linear in
        f(u) on the other. The row's bias is therefore f(u) * A_i(u) + B_i(u) + b2, where A and
        B sum w2 * w1 / N_i and w2 * b1 over the units that are on at u: piecewise constant in
        u, built from each unit's switching distance by a cumulative sum, then read per pair."""
        hidden, out = self.mlp[0], self.mlp[2]
        w1, b1 = hidden.weight[:, 0], hidden.bias  # (K,)
        threshold = torch.abs(self.threshold_multiplier * self.init_threshold)
        normaliser = torch.log(torch.abs(self.c * torch.maximum(rows, threshold)) + 1) + self.eps
        distance = (rows[:, None] - keys[None, :]).abs().long()  # (R, Lk)
        longest = int(distance.max())
        f = torch.log(torch.abs(self.c * torch.arange(longest + 1, device=rows.device)) + 1)
        with torch.no_grad():  # where each unit is on: start <= u < stop, (R, K)
            crossing = -b1[None, :] * normaliser[:, None] / w1[None, :]  # f(u) at w1 x + b1 = 0
            crossing = torch.nan_to_num(crossing)  # w1 = 0: the unit's sign is b1's alone
            rising, falling = w1 > 0, w1 < 0
            start = torch.where(rising, torch.searchsorted(f.detach(), crossing, right=True), 0)
            stop = torch.where(
                falling,
                torch.searchsorted(f.detach(), crossing, right=False),
                torch.where(rising | (b1 > 0), longest + 1, 0),
            )
            stop = torch.maximum(stop, start)
        H = out.weight.shape[0]
        slope = (out.weight * w1)[:, None, :] / normaliser[None, :, None]  # (H, R, K)
        offset = (out.weight * b1)[:, None, :].expand_as(slope)  # (H, R, K)
        steps = torch.cat([slope, offset])  # (2H, R, K): switched on at start, off at stop
        deltas = torch.zeros(2 * H, len(rows), longest + 2, dtype=steps.dtype, device=rows.device)
        deltas = deltas.scatter_add(2, start.expand(2 * H, -1, -1), steps)
        deltas = deltas.scatter_add(2, stop.expand(2 * H, -1, -1), -steps)
        on = deltas.cumsum(2)[..., : longest + 1]  # (2H, R, U + 1): A and B at every distance
        values = f * on[:H] + on[H:] + out.bias[:, None, None]  # (H, R, U + 1)
        return values.gather(2, distance.expand(H, -1, -1))  # (H, R, Lk)
