"""Attention paths: the flash path for biases (with the kernel's causal masking, blocks of query
rows in the bias gradient) matches SDPA's math path, with and without gradients."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posbench.biased_attention import biased_attention
from posbench.encodings import BandedBias


def _mask(kind: str, q_len: int, k_len: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)


@pytest.mark.parametrize("bias_shape", [(1, 3), (2, 3), (1, 1), ()])
@pytest.mark.parametrize("mask_kind, q_len, k_len", [("causal", 9, 9), ("causal", 6, 13), ("none", 9, 9)])
@pytest.mark.parametrize("bias_grad", [True, False])
def test_biased_attention_matches_sdpa_math(bias_shape: tuple[int, ...], mask_kind: str, q_len: int, k_len: int,
                                            bias_grad: bool, monkeypatch) -> None:
    monkeypatch.setattr("posbench.biased_attention.FLASH_MIN_PAIRS", 1)  # force the flash path
    monkeypatch.setattr("posbench.biased_attention.ROW_BLOCK", 4)  # several row blocks, a ragged last one
    torch.manual_seed(0)
    q = torch.randn(2, 3, q_len, 8, requires_grad=True)
    k, v = (torch.randn(2, 3, k_len, 8, requires_grad=True) for _ in range(2))
    bias = (10 * torch.randn(*bias_shape, q_len, k_len)).requires_grad_(bias_grad)
    mask = _mask(mask_kind, q_len, k_len)
    out = biased_attention(q, k, v, bias, 0.3, mask)
    inputs = (q, k, v, bias) if bias_grad else (q, k, v)
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, inputs, grad)
    reference_bias = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        reference_out = F.scaled_dot_product_attention(q, k, v, attn_mask=reference_bias, scale=0.3)
    reference = torch.autograd.grad(reference_out, inputs, grad)
    assert torch.allclose(out, reference_out, atol=1e-5)
    for name, a, b in zip("qkvb", ours, reference):
        assert torch.allclose(a, b, atol=1e-5), name
    with torch.no_grad():
        assert torch.allclose(biased_attention(q, k, v, bias, 0.3, mask), reference_out, atol=1e-5)


@pytest.mark.parametrize("q_len, k_len, band", [(9, 9, 3), (6, 13, 4), (9, 9, 8), (20, 20, 1)])
def test_banded_bias_gradient_matches_dense(q_len: int, k_len: int, band: int, monkeypatch) -> None:
    """A BandedBias's gradient, formed inside the band only (d far = -sum(d near)), equals
    the gradient through the dense Toeplitz matrix."""
    monkeypatch.setattr("posbench.biased_attention.FLASH_MIN_PAIRS", 1)
    monkeypatch.setattr("posbench.biased_attention.ROW_BLOCK", 4)
    torch.manual_seed(0)
    lo = (k_len - q_len) - (k_len - 1)  # queries are the last q_len positions
    q = torch.randn(2, 3, q_len, 8, requires_grad=True)
    k, v = (torch.randn(2, 3, k_len, 8, requires_grad=True) for _ in range(2))
    near = torch.randn(3, band - lo, requires_grad=True)
    far = torch.randn(3, requires_grad=True)
    bias = BandedBias(near, far, lo, band, q_len, k_len)
    mask = _mask("causal", q_len, k_len)
    out = biased_attention(q, k, v, bias, 0.3, mask)
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v, near, far), grad)
    dense = bias.dense().masked_fill(~mask, float("-inf"))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        reference_out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=0.3)
    reference = torch.autograd.grad(reference_out, (q, k, v, near, far), grad)
    assert torch.allclose(out, reference_out, atol=1e-5)
    for name, a, b in zip(["q", "k", "v", "near", "far"], ours, reference):
        assert torch.allclose(a, b, atol=1e-5), name
