"""Helpers every encoding shares: per-distance tables and the Toeplitz expansion."""
from __future__ import annotations

import pytest
import torch

from posbench.encodings.base import PositionalEncoding, Span, toeplitz


@pytest.mark.parametrize("q_len,k_len", [(1, 1), (3, 7), (5, 5), (6, 2)])
def test_toeplitz_values_and_gradient(q_len: int, k_len: int) -> None:
    values = torch.randn(2, q_len + k_len - 1, dtype=torch.float64, requires_grad=True)
    out = toeplitz(values, q_len, k_len)
    for a in range(q_len):
        for b in range(k_len):
            assert torch.equal(out[:, a, b], values[:, a - b + k_len - 1])
    assert torch.autograd.gradcheck(lambda v: toeplitz(v, q_len, k_len), (values,))


def test_distance_tables_grow_by_doubling_and_index_correctly() -> None:
    enc = PositionalEncoding(n_heads=1, d_head=2)
    square = lambda d: d * d  # noqa: E731
    got = enc.distance_lookup("sq", Span(100, 103), Span(0, 103), torch.device("cpu"), square)
    rel = torch.arange(100, 103)[:, None] - torch.arange(0, 103)[None, :]
    assert torch.equal(got, rel * rel)
    builds = enc.table_builds
    enc.distance_values("sq", -120, 127, torch.device("cpu"), square)
    assert enc.table_builds == builds  # capacity 128 already covers it
    assert enc.distance_values("sq", -3, 300, torch.device("cpu"), square).tolist()[0] == 9
    assert enc.table_builds == builds + 1
