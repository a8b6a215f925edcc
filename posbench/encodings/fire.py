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
    i < L read one value per distance (a Toeplitz matrix); rows past L are computed per pair in
    blocks of rows, which costs O(L^2 * mlp_width) time there (the design, not a shortcut).
    """

    relative = False  # the normaliser depends on i once i >= L
    cost_note = (
        "an MLP runs per distance below the threshold and per (i, j) pair past "
        "it; the learned (H, L, L) bias is dense"
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
            block = rows[start : start + self.ROW_BLOCK]  # (R,)
            normalised = self._normalised(block[:, None] - keys[None, :], block[:, None])  # (R, Lk)
            parts.append(self.mlp(normalised[..., None]).permute(2, 0, 1))  # (H, R, Lk)
        return torch.cat(parts, dim=1)  # (H, Lq, Lk)
