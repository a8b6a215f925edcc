"""Attention with a bias formed a block of query rows at a time (CoPE): outputs and gradients
equal SDPA's math path on the whole dense bias, in float64, over many blocks, causal and not,
through a cache and at drawn positions; and no (B, H, L, L) tensor is kept for backward."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from posbench.encodings import create_encoding
from posbench.encodings.base import LayerContext
from posbench.encodings.positions import Span
from posbench.kernels import row_block_attention as blocked
from posbench.bias_kinds import RowBlockBias, dense_bias
from posbench.kernels.dispatch import biased_attention
from posbench.kernels.masks import causal_mask


def _cope(causal: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    enc = create_encoding("cope", n_heads=2, d_head=8, n_layers=1, npos_max=12, causal=causal)
    enc = enc.double()
    with torch.no_grad():
        enc.pos_emb.normal_()  # the zero initialisation would hide the position term
    return enc


CASES = {
    "causal": (True, Span(0, 40), Span(0, 40)),
    "through a cache": (True, Span(30, 40), Span(0, 40)),
    "bidirectional": (False, Span(0, 40), Span(0, 40)),
    "drawn positions": (
        True,
        Span(
            0,
            40,
            torch.sort(torch.randperm(500, generator=torch.Generator().manual_seed(3))[:40]).values,
        ),
        None,
    ),
}


@pytest.mark.parametrize("own_attention", [True, False], ids=["cope's own", "generic blocks"])
@pytest.mark.parametrize("case", CASES)
def test_blocks_equal_the_math_path_on_the_dense_bias(
    case: str, own_attention: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    causal, q_span, k_span = CASES[case]
    k_span = k_span or q_span
    enc = _cope(causal)
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, len(q_span), 8, dtype=torch.float64, generator=generator)
    k, v = torch.randn(2, 2, 2, len(k_span), 8, dtype=torch.float64, generator=generator)
    mask = causal_mask(len(q_span), len(k_span), q.device) if causal else None
    ctx = LayerContext(0, None, None)
    # blocks of 3 rows against 40 keys; causal blocks take more rows while they see fewer keys
    monkeypatch.setattr(blocked, "BLOCK_ELEMENTS", 2 * 2 * 40 * 3)

    def run(dense: bool) -> tuple[torch.Tensor, ...]:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        scores = enc.score(leaves[0], leaves[1], q_span, k_span, ctx)
        assert isinstance(scores.bias, RowBlockBias)
        if not own_attention:  # a plugin's RowBlockBias: checkpointed blocks through autograd
            scores = dataclasses.replace(scores, bias=dataclasses.replace(scores.bias, attend=None))
        if dense:
            bias = dense_bias(scores.bias, len(q_span))
            if mask is not None:
                bias = bias.masked_fill(~mask, float("-inf"))
            out = F.scaled_dot_product_attention(
                scores.q, scores.k, leaves[2], attn_mask=bias, scale=scores.scale
            )
        else:
            out = biased_attention(scores.q, scores.k, leaves[2], scores.bias, scores.scale, mask)
        grads = torch.autograd.grad(out, [*leaves, enc.pos_emb], torch.cos(out))
        return (out, *grads)

    for fast, reference in zip(run(dense=False), run(dense=True)):
        torch.testing.assert_close(fast, reference, atol=1e-10, rtol=1e-10)


def test_no_square_tensor_is_kept_for_the_backward_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """What autograd saves grows with L (at most L x block rows), not L x L."""
    enc = _cope(True).float()
    L = 512
    monkeypatch.setattr(blocked, "BLOCK_ELEMENTS", 2 * L * 16)  # blocks of 16 rows
    q, k, v = (torch.randn(1, 2, L, 8, requires_grad=True) for _ in range(3))
    saved: list[int] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        scores = enc.score(q, k, Span(0, L), Span(0, L), LayerContext(0, None, None))
        out = biased_attention(q, k, v, scores.bias, scores.scale, causal_mask(L, L, q.device))
    assert out.shape == (1, 2, L, 8)
    # CoPE's own attention keeps q, k, v, its table and the output; nothing of L x L
    assert saved and max(saved) <= 16 * L, max(saved)  # dense: 2 x L x L each


@pytest.mark.parametrize("square_causal", [True, False])
@pytest.mark.parametrize("limit", [1, 7 * 4, 40 * 4, 2**20])
def test_row_blocks_cover_every_row_once_within_the_block_size(
    square_causal: bool, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks tile the query rows in order, each within BLOCK_ELEMENTS (B * H * rows * keys)
    unless it is a single row, and a causal block reads exactly the keys its rows see."""
    monkeypatch.setattr(blocked, "BLOCK_ELEMENTS", limit)
    L = 37
    q = torch.zeros(2, 2, L, 4)
    mask = causal_mask(L, L, q.device) if square_causal else None
    next_row = 0
    for r0, r1, keys, block_mask in blocked.row_blocks(q, L, mask):
        assert r0 == next_row and r1 > r0
        assert keys == (r1 if square_causal else L)
        assert 4 * (r1 - r0) * keys <= limit or r1 - r0 == 1
        if square_causal:
            assert torch.equal(block_mask, mask[r0:r1, :keys])
        next_row = r1
    assert next_row == L


def test_cope_positions_never_increase_along_the_keys() -> None:
    """The backward pass sums per integer position over a prefix of each row: positions must
    not increase along the keys, in float32, even where gates are near 0 and 1 alike."""
    from posbench.bias_kinds import contextual_position_bias, own_keys

    generator = torch.Generator().manual_seed(0)
    R, K, npos = 64, 300, 40
    q = torch.randn(2, 3, R, 8, generator=generator)
    content = 30 * torch.randn(2, 3, R, K, generator=generator)  # gates saturate both ways
    content[..., ::7] = 1e-3 * torch.randn(2, 3, R, (K + 6) // 7, generator=generator)
    table = torch.randn(8, npos, generator=generator)
    for own in (own_keys(0, R, R, K, q.device), None):  # the queries: the last R keys
        parts = contextual_position_bias(q, content, table, own, npos, for_backward=True)
        positions = parts["index"] + parts["weight"]  # exact: weight is the fractional part
        assert (positions.diff(dim=-1) <= 0).all()
        assert parts["index"].min() >= 0 and parts["index"].max() <= npos - 1
