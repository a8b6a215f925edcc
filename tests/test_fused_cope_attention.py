"""CoPE's C++ kernel (posbench.kernels.fused_cope_attention): outputs and gradients, the
position table's included, equal CoPE's blocked torch attention in float64 and float32, with
positions below and at the clamp; the layer routes to it only where it applies."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_to_scale

from posbench.kernels.cope_attention import _CopeAttention
from posbench.kernels import native
from posbench.kernels.fused_cope_attention import cope_fused_applies, fused_cope_attention

needs_kernel = pytest.mark.skipif(
    native.cope_flash() is None,
    reason="posbench's C++ CoPE kernel could not be built here (no g++ or ninja, or "
    "POSBENCH_NATIVE_KERNELS=0); CoPE takes its torch attention instead",
)


def _torch_attention(q, k, v, table, scale, npos):
    L = q.shape[2]
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    return _CopeAttention.apply(q, k, v, table, mask, True, scale, npos)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "L, npos, gate_scale",
    [
        (37, 64, 1.0),  # positions below the clamp
        (150, 8, 1.0),  # far keys clamped at npos - 1: several blocks of rows
        (150, 64, 1.0),
        (90, 2, 3.0),  # the fewest positions, gates near 0 and 1
    ],
)
def test_the_kernel_matches_the_torch_attention(
    L: int, npos: int, gate_scale: float, dtype: torch.dtype
) -> None:
    """In float64 the two agree to round-off. In float32 each position is a running sum of up to
    L gates, so both kernels' gradients stray from float64's by about 1e-5 of their size (a
    position may even fall on the other side of an integer, where the bias's slope changes):
    the kernel is held to 1e-4 of each gradient's largest entry against float64's."""
    torch.manual_seed(0)
    d = 8
    q, k, v = (
        (gate_scale * torch.randn(2, 3, L, d, dtype=dtype)).requires_grad_(True) for _ in range(3)
    )
    table = torch.randn(d, npos, dtype=dtype, requires_grad=True)
    scale = d**-0.5
    out = fused_cope_attention(q, k, v, table, scale)
    grad = torch.randn_like(out)
    ours = (out, *torch.autograd.grad(out, (q, k, v, table), grad))
    exact = [x.detach().double().requires_grad_(True) for x in (q, k, v, table)]
    reference = _torch_attention(*exact, scale, npos)
    expected = (reference, *torch.autograd.grad(reference, exact, grad.double()))
    for name, a, b in zip(["out", "q", "k", "v", "table"], ours, expected):
        assert_close_to_scale(a.double(), b, 1e-11 if dtype == torch.float64 else 1e-4, name)


def test_the_kernel_applies_to_causal_square_cpu_scores_only() -> None:
    q = torch.randn(1, 2, 5, 4)
    built = native.cope_flash() is not None
    assert cope_fused_applies(q, q, q, causal=True) is built
    assert not cope_fused_applies(q, q, q, causal=False)  # the encoder form
    assert not cope_fused_applies(q[:, :, -1:], q, q, causal=True)  # a decoding query
    assert not cope_fused_applies(q.half(), q.half(), q.half(), causal=True)
