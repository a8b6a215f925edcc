"""Helpers every encoding shares: per-distance tables and the Toeplitz expansion."""

from __future__ import annotations

import pytest
import torch

import posbench
from posbench.encodings.base import AttentionShape, PositionalEncoding, Span
from posbench.bias_kinds import diagonal_sums, toeplitz


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (3, 7), (5, 5), (6, 2)])
def test_toeplitz_values_and_gradient(q_len: int, k_len: int) -> None:
    values = torch.randn(2, q_len + k_len - 1, dtype=torch.float64, requires_grad=True)
    out = toeplitz(values, q_len, k_len)
    for a in range(q_len):
        for b in range(k_len):
            assert torch.equal(out[:, a, b], values[:, a - b + k_len - 1])
    assert torch.autograd.gradcheck(lambda v: toeplitz(v, q_len, k_len), (values,))


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (3, 7), (10, 4), (11, 11)])
def test_diagonal_sums_add_each_diagonal_over_blocks_of_rows(
    q_len: int, k_len: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Block by block (4 rows, a ragged last block) equals summing each diagonal directly."""
    monkeypatch.setattr("posbench.bias_kinds.DIAGONAL_ROWS", 4)
    matrix = torch.randn(2, 3, q_len, k_len, dtype=torch.float64)
    expected = torch.stack(
        [matrix.diagonal(offset, -2, -1).sum(-1) for offset in range(k_len - 1, -q_len, -1)], -1
    )  # offset b - a from k_len - 1 down: a - b ascending
    assert torch.allclose(diagonal_sums(matrix), expected)


def test_distance_tables_grow_by_doubling_and_index_correctly() -> None:
    enc = PositionalEncoding(AttentionShape(n_heads=1, d_head=2))
    square = lambda d: d * d  # noqa: E731
    got = enc.distance_lookup("sq", Span(100, 103), Span(0, 103), torch.device("cpu"), square)
    rel = torch.arange(100, 103)[:, None] - torch.arange(0, 103)[None, :]
    assert torch.equal(got, rel * rel)
    builds = enc.table_builds
    enc.distance_values("sq", -120, 127, torch.device("cpu"), square)
    assert enc.table_builds == builds  # capacity 128 already covers it
    assert enc.distance_values("sq", -3, 300, torch.device("cpu"), square).tolist()[0] == 9
    assert enc.table_builds == builds + 1


def test_kept_tables_refuse_values_that_depend_on_parameters() -> None:
    enc = PositionalEncoding(AttentionShape(n_heads=1, d_head=2))
    weight = torch.nn.Parameter(torch.ones(()))
    with pytest.raises(
        ValueError, match="table 'learned' depends on parameters and cannot be kept"
    ):
        enc.distance_values("learned", -2, 2, torch.device("cpu"), lambda d: weight * d)
    with pytest.raises(ValueError, match="depends on parameters"):
        enc.position_table("learned", 4, torch.device("cpu"), lambda n: weight * torch.arange(n))


def test_every_encoding_is_built_from_its_attention_shape() -> None:
    shape = AttentionShape(n_heads=2, d_head=8, causal=True, n_layers=3)
    for name in posbench.list_encodings():
        enc = posbench.encodings.REGISTRY.get(name)(shape)
        assert enc.shape == shape and (enc.n_heads, enc.d_head, enc.d_model, enc.n_layers) == (
            2,
            8,
            16,
            3,
        )


@pytest.mark.parametrize("name", ["t5", "alibi", "rope", "txl"])
def test_a_model_built_without_causal_masking_sees_later_tokens(name: str) -> None:
    torch.manual_seed(0)
    causal, bidirectional = (posbench.build_model(name, causal=c) for c in (True, False))
    bidirectional.load_state_dict(causal.state_dict())
    tokens = torch.randint(0, 16, (1, 8))
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % 16
    with torch.no_grad():
        assert torch.equal(
            causal(tokens)[0, 0], causal(changed)[0, 0]
        )  # position 0 cannot see position 7
        assert not torch.allclose(bidirectional(tokens)[0, 0], bidirectional(changed)[0, 0])
    if name == "t5":
        assert bidirectional.encoding.bidirectional and not causal.encoding.bidirectional
    if name == "alibi":
        assert bidirectional.encoding.symmetric and not causal.encoding.symmetric
    with pytest.raises(ValueError, match="a cache continues causal attention"):
        bidirectional(tokens, cache=bidirectional.new_cache())
