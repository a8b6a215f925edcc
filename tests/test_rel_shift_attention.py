"""Attention with a DistanceTableBias (Transformer-XL's position terms, at plain or drawn
positions) or a KeyTableBias (the same terms at drawn positions, by the sin/cos identity)
through the rel-shift kernel: outputs and gradients equal the math path on the dense bias
(float64), over blocks of many sizes, and nothing of size L x L is kept for the backward
pass."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_close_to_scale

from posbench.kernels import native, rel_shift_attention, served
from posbench.bias_kinds import DistanceTableBias, KeyTableBias, Scores
from posbench.kernels.dispatch import UNFUSED_MAX_KEYS, Call, Math, biased_attention
from posbench.kernels.masks import causal_mask

B, H, LQ, d = 2, 3, 200, 8
R = 5  # a KeyTableBias's rank


def _drawn(k_len: int) -> torch.Tensor:
    """Strictly increasing positions for k_len keys, gaps of 1 to 5."""
    return torch.randint(1, 6, (k_len,), generator=torch.Generator().manual_seed(2)).cumsum(0)


def _reach(k_len: int) -> int:
    positions = _drawn(k_len)
    return int(positions[-1] - positions[0]) + 1


KINDS = {
    # kind: (the bias type, a's width, the table's shape for k_len keys, the keys' positions)
    "per distance": (DistanceTableBias, d, lambda k_len: (H, k_len, d), None),
    "per distance, drawn positions": (
        DistanceTableBias,
        d,
        lambda k_len: (H, _reach(k_len) + 3, d),  # rows past the reach unread
        _drawn,
    ),
    "per key": (KeyTableBias, R, lambda k_len: (1, k_len, R), None),  # one table for every head
    "per key and head": (KeyTableBias, R, lambda k_len: (H, k_len, R), None),
}


def _leaves(dtype: torch.dtype, k_len: int, kind: str) -> list[torch.Tensor]:
    _, width, table_shape, _ = KINDS[kind]
    generator = torch.Generator().manual_seed(0)
    shapes = [(B, H, LQ, d), (B, H, k_len, d), (B, H, k_len, d), (B, H, LQ, width)]
    shapes.append(table_shape(k_len))
    return [torch.randn(s, generator=generator, dtype=torch.float64).to(dtype) for s in shapes]


def _bias(kind, k_len, a, table):
    bias_type, _, _, positions = KINDS[kind]
    if positions is None:
        return bias_type(a, table)
    return bias_type(a, table, positions(k_len))


def _attention(kind, q, k, v, a, table):
    mask = causal_mask(q.shape[2], k.shape[2], q.device)
    return biased_attention(q, k, v, _bias(kind, k.shape[2], a, table), 0.3, mask)


def _math_path(kind, q, k, v, a, table):
    logits = 0.3 * q @ k.transpose(-1, -2) + _bias(kind, k.shape[2], a, table).dense()
    logits = logits.masked_fill(~causal_mask(q.shape[2], k.shape[2], q.device), float("-inf"))
    return torch.softmax(logits, -1) @ v


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("memory", [0, 70], ids=["square", "after memory"])
@pytest.mark.parametrize("block_elements", [1 << 20, 6000, 700])
def test_table_bias_attention_equals_the_math_path(
    monkeypatch, block_elements: int, memory: int, kind: str
) -> None:
    """Blocks of one or two rows up to the whole matrix in one block; queries the whole
    sequence or a segment after its memory."""
    monkeypatch.setattr(rel_shift_attention, "BLOCK_ELEMENTS", block_elements)
    ours_in = [t.requires_grad_() for t in _leaves(torch.float32, LQ + memory, kind)]
    reference_in = [t.requires_grad_() for t in _leaves(torch.float64, LQ + memory, kind)]
    out, reference = _attention(kind, *ours_in), _math_path(kind, *reference_in)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ours = (out, *torch.autograd.grad(out, ours_in, grad.float()))
    expected = (reference, *torch.autograd.grad(reference, reference_in, grad))
    for name, a, b in zip(["out", "q", "k", "v", "a", "table"], ours, expected):
        err = (a.double() - b).abs().max().item()
        assert err < 2e-5 * max(1.0, b.abs().max().item()), f"{name}: {err:.2e}"


@pytest.mark.parametrize("kind", list(KINDS))
def test_table_bias_attention_keeps_nothing_of_size_l_squared_for_backward(kind: str) -> None:
    sizes: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.numel())
        return t

    leaves = [t.requires_grad_() for t in _leaves(torch.float32, LQ, kind)]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _attention(kind, *leaves)
    assert sizes and max(sizes) < B * H * LQ * LQ // 4


@pytest.mark.parametrize("kernel", ["C++", "torch"])
def test_a_drawn_table_hands_over_its_per_key_form_where_the_cpp_kernel_does_not_run(
    monkeypatch, kernel: str
) -> None:
    """The table of distances at drawn positions is the cheaper form only inside the C++
    kernel: elsewhere attention runs the per-key form the bias carries, formed on demand."""
    if kernel == "torch":
        monkeypatch.setattr(native, "band_flash", lambda: None)
    elif native.band_flash() is None:
        pytest.skip("posbench's C++ kernel could not be built here")
    q, k, v, a, table = _leaves(torch.float32, LQ, "per distance, drawn positions")
    generator = torch.Generator().manual_seed(3)
    key_form = KeyTableBias(torch.randn(B, H, LQ, R, generator=generator), torch.randn(1, LQ, R))
    formed: list[KeyTableBias] = []

    def by_key() -> KeyTableBias:
        formed.append(key_form)
        return key_form

    bias = DistanceTableBias(a, table, _drawn(LQ), by_key)
    out = biased_attention(q, k, v, bias, 0.3, causal_mask(LQ, LQ, q.device))
    taken = key_form if kernel == "torch" else bias
    assert len(formed) == (1 if kernel == "torch" else 0)
    logits = 0.3 * q @ k.transpose(-1, -2) + taken.dense()
    logits = logits.masked_fill(~causal_mask(LQ, LQ, q.device), float("-inf"))
    assert_close_to_scale(out, torch.softmax(logits, -1) @ v, 2e-5, "out")


@pytest.mark.parametrize(
    "positions, rows, message",
    [
        (torch.tensor([0, 3, 3, 7]), 8, "strictly increasing"),
        (torch.tensor([0, 5, 2, 7]), 8, "strictly increasing"),
        (torch.tensor([0, 2, 5, 9]), 9, "reaching 10 distances got a table of 9"),
    ],
    ids=["repeated", "decreasing", "table too short"],
)
def test_a_drawn_table_refuses_positions_it_cannot_index(
    positions: torch.Tensor, rows: int, message: str
) -> None:
    """The kernels read the table at p_i - p_j: positions out of order or a table short of the
    reach are refused with the fix, never read out of bounds."""
    with pytest.raises(ValueError, match=message):
        DistanceTableBias(torch.zeros(1, H, 4, d), torch.zeros(H, rows, d), positions)


@pytest.mark.parametrize(
    "q_len, k_len, table_len", [(1, 1, 1), (1, 9, 9), (5, 5, 5), (5, 9, 9), (4, 40, 47)]
)
def test_the_shifted_table_is_the_dense_bias_with_the_causal_mask_as_minus_infinity(
    q_len: int, k_len: int, table_len: int
) -> None:
    generator = torch.Generator().manual_seed(7)
    a = torch.randn(B, H, q_len, d, dtype=torch.float64, generator=generator)
    table = torch.randn(H, table_len, d, dtype=torch.float64, generator=generator)
    mask = causal_mask(q_len, k_len, torch.device("cpu"))
    expected = DistanceTableBias(a, table[:, :k_len]).dense().masked_fill(~mask, -torch.inf)
    shifted = rel_shift_attention.causal_table_bias(a, table, k_len)
    assert shifted.shape == (B, H, q_len, k_len)
    future = expected == -torch.inf
    assert torch.equal(shifted == -torch.inf, future)
    assert_close_to_scale(shifted[~future], expected[~future], atol=1e-12)


@pytest.mark.parametrize("k_len", [10, UNFUSED_MAX_KEYS + 4], ids=["short rows", "long rows"])
@pytest.mark.parametrize("grad", [False, True], ids=["no grad", "grad"])
def test_the_math_path_reads_a_plain_distance_table_as_the_dense_bias_does(
    k_len: int, grad: bool
) -> None:
    """Short rows without a gradient go unfused (matmul, softmax, matmul), the rest to torch's
    SDPA: both read the bias as SDPA reads the dense, masked one."""
    generator = torch.Generator().manual_seed(8)
    q_len = 6
    q, k, v = (
        torch.randn(B, H, n, d, dtype=torch.float64, generator=generator)
        for n in (q_len, k_len, k_len)
    )
    a = torch.randn(B, H, q_len, d, dtype=torch.float64, generator=generator)
    table = torch.randn(H, k_len, d, dtype=torch.float64, generator=generator)
    mask = causal_mask(q_len, k_len, torch.device("cpu"))
    bias = DistanceTableBias(a, table)
    call = Call(q, k, v, mask, causal=True, square=False, _scores=Scores(q, k, bias, 0.5))
    dense = bias.dense().masked_fill(~mask, -torch.inf)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=0.5)
    with torch.set_grad_enabled(grad), served.recording() as kernels:
        got = Math().run(call)
    assert_close_to_scale(got, expected, atol=1e-12)
    unfused = k_len <= UNFUSED_MAX_KEYS and not grad
    assert list(kernels) == [served.TORCH_UNFUSED if unfused else served.TORCH_SDPA]
