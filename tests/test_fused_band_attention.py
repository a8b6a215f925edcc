"""posbench's C++ attention kernel (posbench.kernels.native, fused_band_attention): outputs and
gradients equal SDPA's math path on the dense bias, in float64 and float32, for every band
layout the encodings hand it; the build's switch, flags and failure are plain to the user."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close_to_scale, logits_and_gradients

import posbench
from posbench.kernels import native
from posbench.bias_kinds import BandBias, BandProduct
from posbench.kernels.fused_band_attention import (
    causal_band,
    fused_band_attention,
)

needs_kernel = pytest.mark.skipif(
    native.band_flash() is None,
    reason="posbench's C++ kernel could not be built here (no g++ or ninja, or "
    "POSBENCH_NATIVE_KERNELS=0); attention takes its torch kernels instead",
)


def _dense(band: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """bias[b, h, i, j] = band[b, h, i|0, W - 1 - (p_i - p_j)] for 0 <= p_i - p_j < W, else 0."""
    W, L = band.shape[-1], len(positions)
    distance = positions[:, None] - positions[None, :]  # (L, L)
    near = (distance >= 0) & (distance < W)
    column = (W - 1 - distance).clamp(0, max(W - 1, 0))
    rows = band.expand(*band.shape[:2], L, W) if W else band.new_zeros(*band.shape[:2], L, 1)
    values = rows.gather(-1, column.expand(*rows.shape[:2], L, L))
    return values.masked_fill(~near, 0.0)


def _math_path(q, k, v, band, scale, inputs, grad, positions=None):
    """SDPA's math path on the dense causal bias of `band`: output, then the inputs' gradients."""
    L = q.shape[2]
    dense = _dense(band, torch.arange(L) if positions is None else positions)
    dense = dense.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense.to(q.dtype), scale=scale)
    return (out, *torch.autograd.grad(out, inputs, grad))


@needs_kernel
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize(
    "L, band_shape",
    [
        (37, (1, 3, 1, 5)),  # T5: one row shared by the batch, W < L
        (37, (2, 3, 37, 5)),  # DeBERTa: a row per query and batch entry
        (70, (1, 3, 70, 20)),  # a row per query, shared by the batch
        (300, (1, 1, 1, 300)),  # per distance (KERPLE, ALiBi): W = L, one head broadcast
        (129, (1, 3, 1, 1)),  # the diagonal alone
        (20, (1, 3, 1, 50)),  # wider than L: the columns no key reaches are dropped
        (33, (1, 3, 1, 0)),  # no bias (NoPE, RoPE)
    ],
)
def test_the_kernel_matches_the_math_path(
    L: int, band_shape: tuple[int, ...], dtype: torch.dtype, atol: float
) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, L, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    band = (3 * torch.randn(band_shape, dtype=dtype)).requires_grad_(True)
    out = fused_band_attention(q, k, v, band, 0.3)
    grad = torch.randn_like(out)
    inputs = (q, k, v, band) if band.numel() else (q, k, v)
    reference = _math_path(q, k, v, band, 0.3, inputs, grad)
    ours = (out, *torch.autograd.grad(out, inputs, grad))
    for name, a, b in zip(["out", "q", "k", "v", "band"], ours, reference):
        assert_close_to_scale(a, b, atol, name)
    with torch.no_grad():
        torch.testing.assert_close(fused_band_attention(q, k, v, band, 0.3), out)


@needs_kernel
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("L, W", [(37, 5), (300, 20), (130, 1), (16, 16), (200, 64)])
@pytest.mark.parametrize("key_side", [True, False])
def test_a_band_of_products_is_formed_inside_the_kernel(
    L: int, W: int, key_side: bool, dtype: torch.dtype, atol: float
) -> None:
    """DeBERTa's terms past its span: the band entry of key j = i - δ is a[i] . t[δ] +
    c[j] . u[δ] for δ < W, 0 further back (BandProducts as a BandBias's band and key band).
    Outputs and gradients of q, k, v, the factors and the tables equal the math path on the
    dense band, over one block of rows and several, with c the keys themselves (DeBERTa's)."""
    torch.manual_seed(0)
    r = 8
    q, k, v = (torch.randn(2, 3, L, r, dtype=dtype, requires_grad=True) for _ in range(3))
    a = torch.randn(2, 3, L, r, dtype=dtype, requires_grad=True)
    t, u = (torch.randn(3, W, r, dtype=dtype, requires_grad=True) for _ in range(2))
    queries, keys = BandProduct(a, t), BandProduct(k, u) if key_side else None
    no_band = q.new_empty(1, 3, 1, 0)
    out = fused_band_attention(q, k, v, no_band, 0.3, band_products=(queries, keys))
    grad = torch.randn_like(out)
    full = BandBias(queries, torch.zeros(()), key_band=keys).full_band()
    inputs = (q, k, v, a, t, u) if key_side else (q, k, v, a, t)
    reference = _math_path(q, k, v, full, 0.3, inputs, grad)
    ours = (out, *torch.autograd.grad(out, inputs, grad))
    for name, x, y in zip(["out", "q", "k", "v", "a", "t", "u"], ours, reference):
        assert_close_to_scale(x, y, atol, name)


def test_a_band_product_puts_distance_zero_last() -> None:
    """BandProduct's band: column W - 1 - δ holds a . table[δ]."""
    a = torch.tensor([[[[1.0, 10.0]]]])  # (1, 1, 1, 2)
    table = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])  # distances 0, 1, 2
    assert BandProduct(a, table).tensor().flatten().tolist() == [11.0, 10.0, 1.0]


@needs_kernel
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize(
    "L, bias_shape",
    [
        (37, (2, 3, 37, 37)),  # a bias per batch entry
        (150, (1, 3, 150, 150)),  # FIRE's: per head, shared by the batch (blocks of rows)
        (20, (1, 1, 20, 20)),  # one matrix broadcast over the heads
        (9, (9, 9)),  # no batch or head dimensions
    ],
)
def test_a_dense_bias_is_read_by_key(
    L: int, bias_shape: tuple[int, ...], dtype: torch.dtype, atol: float
) -> None:
    """A dense bias is added at [b, h, i, j] for the keys j <= i, the rest ignored (it may hold
    anything there), and its gradient is dS at those pairs and 0 above the diagonal."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, L, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    bias = (3 * torch.randn(bias_shape, dtype=dtype)).requires_grad_(True)
    dense = bias if bias.dim() == 4 else bias[None, None]
    out = fused_band_attention(q, k, v, dense, 0.3, by_key=True)
    grad = torch.randn_like(out)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        masked = bias.masked_fill(~causal, float("-inf"))
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=masked, scale=0.3)
    inputs = (q, k, v, bias)
    expected = (reference, *torch.autograd.grad(reference, inputs, grad))
    ours = (out, *torch.autograd.grad(out, inputs, grad))
    for name, x, y in zip(["out", "q", "k", "v", "bias"], ours, expected):
        assert_close_to_scale(x, y, atol, name)
    assert not ours[-1][..., ~causal].any()


@needs_kernel
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("W", [200, 30, 1])
@pytest.mark.parametrize("rows", [1, "L"])
def test_drawn_positions_read_the_band_at_their_distances(
    W: int, rows: int | str, dtype: torch.dtype, atol: float
) -> None:
    """At drawn positions p (strictly increasing, gaps of 1 to 5) key j of query i reads column
    W - 1 - (p_i - p_j), 0 from W positions back: outputs and gradients, the band's included."""
    torch.manual_seed(0)
    L = 45
    positions = torch.randint(1, 6, (L,)).cumsum(0)
    q, k, v = (torch.randn(2, 3, L, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    band = torch.randn(1, 3, L if rows == "L" else 1, W, dtype=dtype, requires_grad=True)
    out = fused_band_attention(q, k, v, band, 0.3, positions)
    grad = torch.randn_like(out)
    reference = _math_path(q, k, v, band, 0.3, (q, k, v, band), grad, positions)
    ours = (out, *torch.autograd.grad(out, (q, k, v, band), grad))
    for name, a, b in zip(["out", "q", "k", "v", "band"], ours, reference):
        assert_close_to_scale(a, b, atol, name)


@needs_kernel
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("reading", ["by distance", "by key", "by distance at drawn positions"])
@pytest.mark.parametrize("table_heads", [3, 1])
@pytest.mark.parametrize("L", [70, 300], ids=["one block", "three blocks"])
def test_a_table_bias_matches_the_math_path(
    L: int, reading: str, table_heads: int, dtype: torch.dtype, atol: float
) -> None:
    """Transformer-XL's terms: a[i] . table[p_i - p_j] (by distance, at plain or drawn positions
    p) or a[i] . table[j] (by key), with a band beside them (read at the same positions):
    outputs and gradients of q, k, v, a, the table and the band."""
    torch.manual_seed(0)
    r, by_distance = 6, reading != "by key"
    drawn = reading.endswith("drawn positions")
    p = torch.randint(1, 6, (L,)).cumsum(0) if drawn else torch.arange(L)  # gaps of 1 to 5
    reach = int(p[-1] - p[0]) + 1 if drawn else L  # the table rows read
    q, k, v = (torch.randn(2, 3, L, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    a = torch.randn(2, 3, L, r, dtype=dtype, requires_grad=True)
    table = torch.randn(
        table_heads, reach + 5, r, dtype=dtype, requires_grad=True
    )  # rows past the reach unread
    band = torch.randn(1, 3, 1, 9, dtype=dtype, requires_grad=True)
    positions = p if drawn else None
    out = fused_band_attention(q, k, v, band, 0.3, positions, (a, table, by_distance))
    grad = torch.randn_like(out)
    index = (p[:, None] - p[None, :]).clamp(min=0) if by_distance else torch.arange(L).expand(L, L)
    rows = table.expand(3, -1, r)[:, index]  # (H, L, L, r)
    table_dense = torch.einsum("bhir,hijr->bhij", a, rows)
    dense = table_dense + _dense(band, p)
    dense = dense.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=0.3)
    inputs = (q, k, v, a, table, band)
    expected = (reference, *torch.autograd.grad(reference, inputs, grad))
    ours = (out, *torch.autograd.grad(out, inputs, grad))
    for name, x, y in zip(["out", "q", "k", "v", "a", "table", "band"], ours, expected):
        assert_close_to_scale(x, y, atol, name)


@needs_kernel
def test_the_kernel_refuses_positions_out_of_order() -> None:
    """A band or table read at p_i - p_j needs strictly increasing positions: the kernel checks
    them rather than index outside the table."""
    q, k, v = (torch.randn(1, 3, 4, 8) for _ in range(3))
    a, table = torch.randn(1, 3, 4, 6), torch.randn(3, 10, 6)
    with pytest.raises(RuntimeError, match="strictly increasing"):
        fused_band_attention(
            q, k, v, q.new_empty(1, 3, 1, 0), 0.3, torch.tensor([0, 4, 2, 9]), (a, table, True)
        )


@needs_kernel
def test_huge_penalties_weigh_nothing() -> None:
    """A penalty of -1e4 (its exp underflows) gives its keys weight 0, not NaN, in the output
    and the gradients, with a band that needs no gradient (ALiBi's)."""
    torch.manual_seed(0)
    L = 50
    q, k, v = (torch.randn(1, 2, L, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    band = torch.zeros(1, 2, 1, L, dtype=torch.float64)
    band[..., : L - 3] = -1e4  # every key more than 2 back
    out = fused_band_attention(q, k, v, band, 0.3)
    grad = torch.randn_like(out)
    reference = _math_path(q, k, v, band, 0.3, (q, k, v), grad)
    ours = (out, *torch.autograd.grad(out, (q, k, v), grad))
    for a, b in zip(ours, reference):
        assert torch.isfinite(a).all()
        assert_close_to_scale(a, b, 1e-12)
    recent = torch.softmax(
        (q @ k.transpose(-1, -2) * 0.3)[..., -1, -3:], -1
    )  # the last query sees its last three keys only
    torch.testing.assert_close(out[..., -1:, :], recent[..., None, :] @ v[..., -3:, :])


def test_causal_band_puts_distance_zero_last() -> None:
    """A ToeplitzBias's values, i - j ascending from -(L - 1), become the band whose column
    L - 1 - δ holds distance δ."""
    L = 4
    values = torch.arange(2 * L - 1, dtype=torch.float64)[None]  # value = (i - j) + L - 1
    band = causal_band(values, L, L)
    assert band.shape == (1, 1, 1, L)
    assert band.flatten().tolist() == [6.0, 5.0, 4.0, 3.0]  # distances 3, 2, 1, 0


def test_the_switch_turns_the_kernel_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native.SWITCH, "0")
    native.band_flash.cache_clear()
    try:
        assert native.band_flash() is None
    finally:
        monkeypatch.delenv(native.SWITCH)
        native.band_flash.cache_clear()


def test_a_failed_build_says_why_and_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    def no_compiler(**_: object) -> None:
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    native.band_flash.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert native.band_flash() is None
    finally:
        native.band_flash.cache_clear()
    (warning,) = caught
    text = str(warning.message)
    assert "Ninja is required" in text and "To build it, install g++ and ninja" in text
    assert f"{native.SWITCH}=0" in text


def test_compile_flags_follow_torchs_cpu_capability() -> None:
    assert "-DCPU_CAPABILITY_AVX512" in native.compile_flags("AVX512")
    assert "-mavx2" in native.compile_flags("AVX2")
    portable = native.compile_flags("NEON")
    assert "-DCPU_CAPABILITY=DEFAULT" in portable
    assert not any(flag.startswith("-m") for flag in portable)
    assert torch.__version__.split("+")[0].replace(".", "_") in native.extension_name()


@needs_kernel
@pytest.mark.parametrize(
    "encoding, options",
    [(name, {}) for name in posbench.list_encodings()]
    + [("fire", {"init_threshold": 50.0})],  # most rows past FIRE's threshold: not Toeplitz
)
def test_every_encoding_matches_without_the_kernel(
    encoding: str, options: dict[str, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tiny model at L = 160 gives the same logits and gradients with the C++ kernel as with
    attention's torch kernels (what runs where it cannot be built)."""
    fused, fused_grads = logits_and_gradients(encoding, **options)
    monkeypatch.setattr(native, "band_flash", lambda: None)
    monkeypatch.setattr(native, "cope_flash", lambda: None)
    torch_kernels, torch_grads = logits_and_gradients(encoding, **options)
    torch.testing.assert_close(fused, torch_kernels, atol=2e-5, rtol=1e-4)
    assert fused_grads.keys() == torch_grads.keys()
    for name, grad in torch_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, atol=2e-5, rtol=2e-4, msg=name)


@needs_kernel
@pytest.mark.parametrize(
    "encoding, L, uses_kernel",
    [
        ("nope", 32, False),  # no bias, short: torch's kernels are faster there
        ("alibi", 32, False),  # a fixed bias, short
        ("t5", 32, True),  # a learned bias: the kernel at any length
        ("nope", 160, True),  # 160^2 pairs, past NATIVE_MIN_PAIRS
        ("alibi", 160, True),
    ],
)
def test_short_attention_without_a_learned_bias_takes_the_torch_kernels(
    encoding: str, L: int, uses_kernel: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from posbench.testing import tiny_model

    built, calls = native.band_flash(), []

    class Counting:
        def forward(self, *args):
            calls.append(args[0].shape)
            return built.forward(*args)

        def backward(self, *args):
            return built.backward(*args)

    monkeypatch.setattr(native, "band_flash", lambda: Counting())
    tokens = torch.randint(0, 8, (2, L), generator=torch.Generator().manual_seed(0))
    tiny_model(encoding)(tokens).sum().backward()
    assert bool(calls) is uses_kernel, calls


@pytest.mark.parametrize(
    "value, on",
    [("0", False), ("false", False), ("OFF", False), ("no", False), ("1", True), ("yes", True)],
)
def test_the_kernel_switch_reads_words_as_well_as_digits(monkeypatch, value: str, on: bool) -> None:
    """POSBENCH_NATIVE_KERNELS=false once read as on: only "0" turned the kernels off."""
    from posbench.kernels import native

    monkeypatch.setenv(native.SWITCH, value)
    assert native.enabled() is on


def test_an_unknown_kernel_switch_value_is_one_sentence(monkeypatch) -> None:
    from posbench.errors import ConfigError
    from posbench.kernels import native

    monkeypatch.setenv(native.SWITCH, "maybe")
    with pytest.raises(ConfigError, match="neither on .* nor off .*; set it to one of them"):
        native.enabled()


@needs_kernel
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("heads, threads", [(2, 1), (2, 2), (3, 2)])  # by head, by task
@pytest.mark.parametrize("c", [0.4, -0.2])
@pytest.mark.parametrize("drawn", [False, True])
def test_segments_match_the_math_path_on_their_dense_bias(
    heads: int, threads: int, c: float, drawn: bool, dtype: torch.dtype, atol: float
) -> None:
    """FIRE's SegmentBias formed inside the kernel's rows gives SDPA's outputs and gradients
    (q, k, v and every FIRE parameter) on the dense bias the encoding forms for the same
    pairs: rows below and past the threshold, units switching inside the rows, random weights
    of both signs, a head count that shares out over the threads and one that does not, at
    plain and at drawn positions (distances up to four times the length)."""
    from posbench.encodings.base import LayerContext, Span

    torch.manual_seed(0)
    L = 90
    fire = posbench.create_encoding("fire", n_heads=heads, d_head=8, init_threshold=30.0)
    fire = fire.to(dtype)
    with torch.no_grad():
        for p in fire.mlp.parameters():
            p.normal_()
        fire.c.fill_(c)
    q, k, v = (torch.randn(2, heads, L, 8, dtype=dtype, requires_grad=True) for _ in range(3))
    params = [p for name, p in fire.named_parameters() if name != "mlp.2.bias"]
    drawn_positions = torch.randperm(4 * L, generator=torch.Generator().manual_seed(1))[:L]
    span = Span(0, L, drawn_positions.sort().values if drawn else None)
    context = LayerContext(0, None, None)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        segments = fire.position_bias(span, span, context, torch.device("cpu"))
        no_band = q.new_empty(1, heads, 1, 0)
        out = fused_band_attention(q, k, v, no_band, 0.3, span.positions, segments=segments)
        grad = torch.randn_like(out)
        ours = (out, *torch.autograd.grad(out, (q, k, v, *params), grad))
    finally:
        torch.set_num_threads(previous)
    dense = segments.dense().masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), -torch.inf)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=0.3)
    reference = (expected, *torch.autograd.grad(expected, (q, k, v, *params), grad))
    names = ["out", "q", "k", "v"] + [n for n, _ in fire.named_parameters() if n != "mlp.2.bias"]
    for name, a, b in zip(names, ours, reference, strict=True):
        assert_close_to_scale(a, b, atol, name)
