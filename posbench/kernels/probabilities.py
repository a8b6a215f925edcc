"""Softmax probabilities exp(logits - lse) as the blocked kernels form them, in place, kept out
of float32's subnormal range (below 1.2e-38), where x86 CPUs do arithmetic in microcode.

Measured on a 2-core Intel Xeon with AVX-512, 4M float32 elements, 2 threads: torch's
vectorised exp takes 66 ms instead of 0.6 ms where its result underflows (inputs below about
-87.3), and a product with a subnormal operand or result 8.6 ms instead of 0.9 ms; a
(32, 32, 160) x (32, 160, 32) bmm whose left operand is subnormal 5.7 ms instead of 0.48 ms.
So inputs are clamped at EXP_FLOOR first, and probabilities below PROBABILITY_FLOOR are then
set to exactly 0. Without that second step a masked pair kept exp(-87) ~ 1.6e-38, and its
products with dP in the backward pass, or with a rescaling factor below 1, were subnormal.
posbench's own processes flush subnormals to zero (posbench.kernels.cpu), where this changes
nothing measurable; a library caller's process does not, and there it made each blocked kernel
slower than its encoding: fwd+bwd of one layer (B = 8, 4 heads, d_head 32, L = 1024) over NoPE's
went from 3.7x-3.8x to 1.3x for T5, 4.1x-4.2x to 1.5x for DeBERTa, 2.6x to 1.3x-1.4x for KERPLE
and 3.3x-3.4x to 1.9x for Transformer-XL (alternating runs, 2026-12-04). A probability below
1e-30 changes no float32 sum that holds the row's largest weight (at least 1 / L)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

EXP_FLOOR = -87.0
PROBABILITY_FLOOR = 1e-30


def probabilities_(scores: Tensor) -> Tensor:
    """exp(scores) in place for scores = logits - lse (<= 0, -inf where masked), with every
    result below PROBABILITY_FLOOR exactly 0."""
    return F.threshold_(scores.clamp_(min=EXP_FLOOR).exp_(), PROBABILITY_FLOOR, 0.0)
