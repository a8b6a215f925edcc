"""Attention paths: the flash path for biases that need a gradient matches SDPA's math path."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posbench.biased_attention import biased_attention


@pytest.mark.parametrize("bias_shape", [(1, 3, 9, 9), (2, 3, 9, 9), (9, 9)])
def test_biased_attention_matches_sdpa_with_gradients(bias_shape: tuple[int, ...], monkeypatch) -> None:
    monkeypatch.setattr("posbench.biased_attention.FLASH_MIN_PAIRS", 1)  # force the flash path
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, requires_grad=True) for _ in range(3))
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    bias = torch.randn(*bias_shape).masked_fill(~causal, float("-inf")).requires_grad_(True)
    out = biased_attention(q, k, v, bias, 0.3)
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v, bias), grad)
    reference_out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    reference = torch.autograd.grad(reference_out, (q, k, v, bias), grad)
    assert torch.allclose(out, reference_out, atol=1e-5)
    for a, b in zip(ours, reference):
        assert torch.allclose(a.nan_to_num(), b.nan_to_num(), atol=1e-5)
