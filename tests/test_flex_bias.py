"""The flex_attention path for biases of (head, i - j) alone: every encoding that declares a
per-distance bias gives exactly its dense bias through it, at plain and drawn positions and
through a cache; the score_mod gives the math path's outputs and gradients; the layer gives
the same output through flex_attention's eager implementation; the compiled CUDA path and the
CUDA bench run where a GPU is present."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import posbench
from posbench import create_encoding
from posbench.encodings.base import LayerContext, Span
from posbench.bias_kinds import dense_bias, toeplitz
from posbench.kernels.flex_bias import (
    MIN_HEAD_DIM,
    dense_score_mod,
    distance_score_mod,
    flex_available,
    flex_distance_attention,
)
from posbench.kernels.masks import causal_mask

CONTEXT = LayerContext(0, None, None)  # type: ignore[arg-type]
OPTIONS = {"t5": {"num_buckets": 8, "max_distance": 6}}  # a band at these lengths too
NO_CUDA = "no CUDA device here: the compiled flex path and the CUDA bench need a GPU"


def _encoding(name: str, d_head: int = 8):
    torch.manual_seed(0)
    enc = create_encoding(name, n_heads=2, d_head=d_head, **OPTIONS.get(name, {})).eval()
    with torch.no_grad():
        for parameter in enc.parameters():
            parameter.normal_(std=0.5)
    return enc


def _with_distance_bias() -> list[str]:
    names = []
    for name in posbench.list_encodings():
        enc = create_encoding(name, n_heads=2, d_head=8, **OPTIONS.get(name, {}))
        if enc.distance_bias(0, 1, CONTEXT, torch.device("cpu")) is not None:
            names.append(name)
    return names


DISTANCE_BIASED = _with_distance_bias()
DRAWN = torch.tensor([0, 2, 3, 7, 11, 12, 19, 25, 26, 31, 40, 44])
SPANS = {  # (queries, keys): a square stream, a continuation through a cache, drawn positions
    "square": (Span(0, 12), Span(0, 12)),
    "cached": (Span(5, 12), Span(0, 12)),
    "drawn": (Span(0, 12, DRAWN), Span(0, 12, DRAWN)),
}


def test_the_per_distance_encodings_are_the_ones_expected() -> None:
    assert {"alibi", "t5", "kerple_log", "kerple_power", "sandwich"} <= set(DISTANCE_BIASED)
    assert not {"nope", "rope", "txl", "deberta", "fire", "cope"} & set(DISTANCE_BIASED)


def _values_at(
    enc, q_span: Span, k_span: Span, device: torch.device = torch.device("cpu")
) -> tuple[torch.Tensor, int]:
    lo, hi = q_span.first - k_span.last, q_span.last - k_span.first
    return enc.distance_bias(lo, hi, CONTEXT, device), lo


@pytest.mark.parametrize("where", SPANS)
@pytest.mark.parametrize("name", DISTANCE_BIASED)
def test_the_per_distance_bias_is_the_dense_bias(name: str, where: str) -> None:
    enc = _encoding(name)
    q_span, k_span = SPANS[where]
    values, lo = _values_at(enc, q_span, k_span)
    with torch.no_grad():
        dense = dense_bias(enc.position_bias(q_span, k_span, CONTEXT, torch.device("cpu")), 12)
        dense = dense.reshape(dense.shape[-3:])  # (H, Lq, Lk); a BandBias's is (1, H, Lq, Lk)
        relative = q_span.arange()[:, None] - k_span.arange()[None, :]  # (Lq, Lk)
        from_table = values[:, relative - lo]  # (H, Lq, Lk)
    mask = causal_mask(len(q_span), len(k_span), torch.device("cpu"))
    assert torch.allclose(from_table[:, mask], dense.expand_as(from_table)[:, mask], atol=1e-6)
    if q_span.contiguous:
        assert torch.equal(toeplitz(values, len(q_span), len(k_span)), from_table)


def _math_path(enc, q, k, v, q_span: Span, k_span: Span) -> torch.Tensor:
    bias = dense_bias(enc.position_bias(q_span, k_span, CONTEXT, q.device), len(q_span))
    mask = causal_mask(len(q_span), len(k_span), q.device)
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    return torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("where", SPANS)
@pytest.mark.parametrize("name", DISTANCE_BIASED)
def test_the_score_mod_gives_the_math_path_outputs_and_gradients(name: str, where: str) -> None:
    enc = _encoding(name)
    q_span, k_span = SPANS[where]
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, len(q_span), 8, generator=generator, requires_grad=True)
    k, v = (torch.randn(2, 2, 12, 8, generator=generator, requires_grad=True) for _ in range(2))
    inputs = [q, k, v, *[p for p in enc.parameters() if p.requires_grad]]
    grad = torch.randn(2, 2, len(q_span), 8, generator=generator)

    values, lo = _values_at(enc, q_span, k_span)
    score_mod = distance_score_mod(values, lo, q_span.arange(), k_span.arange())
    logits = dense_score_mod(score_mod, q @ k.transpose(-1, -2) / math.sqrt(8))
    mask = causal_mask(len(q_span), 12, torch.device("cpu"))
    ours = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ v
    reference = _math_path(enc, q, k, v, q_span, k_span)
    assert torch.allclose(ours, reference, atol=1e-5)
    got = torch.autograd.grad(ours, inputs, grad, allow_unused=True)
    expected = torch.autograd.grad(reference, inputs, grad, allow_unused=True)
    for a, b in zip(got, expected):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # flex_attention itself, eager (it has no backward on the CPU)
        flex = flex_distance_attention(
            *(t.detach() for t in (q, k, v, values)),
            lo,
            q_span.arange(),
            k_span.arange(),
            1 / math.sqrt(8),
            True,
        )
    assert torch.allclose(flex, reference, atol=1e-5)


@pytest.mark.parametrize("name", DISTANCE_BIASED)
def test_a_layer_through_flex_gives_the_output_of_the_usual_path(name: str, monkeypatch) -> None:
    """The attention layer's flex branch (taken on CUDA) run on the CPU through flex's eager
    implementation: the same output as the SDPA / biased-attention path."""
    from posbench.experiment.config import EncodingSpec
    from posbench.experiment.profiling import AttentionUnderTest

    torch.manual_seed(0)
    layer = AttentionUnderTest(EncodingSpec(name, OPTIONS.get(name, {})), n_heads=2, d_head=8)
    layer.eval()
    x = torch.randn(2, 40, 16)
    with torch.no_grad():
        usual = layer(x)
        monkeypatch.setattr(
            "posbench.kernels.dispatch.flex_available", lambda device, head_dim: True
        )
        flex = layer(x)
    assert torch.allclose(flex, usual, atol=1e-5)


def test_a_flex_path_that_fails_falls_back_once_with_a_warning(monkeypatch) -> None:
    from posbench.experiment.config import EncodingSpec
    from posbench.experiment.profiling import AttentionUnderTest
    from posbench.kernels import flex_bias

    monkeypatch.setattr(flex_bias, "_broken", [])
    monkeypatch.setattr(  # as on CUDA, until flex fails
        "posbench.kernels.dispatch.flex_available", lambda device, head_dim: not flex_bias._broken
    )

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no compiler for this device")

    monkeypatch.setattr("posbench.kernels.dispatch.flex_distance_attention", broken)
    torch.manual_seed(0)
    layer = AttentionUnderTest(EncodingSpec("alibi", {}), n_heads=2, d_head=8).eval()
    x = torch.randn(1, 20, 16)
    with pytest.warns(RuntimeWarning, match="no compiler for this device"):
        first = layer(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = layer(x)  # the usual path, without a second warning
    assert torch.allclose(first, second)


def test_flex_serves_cuda_heads_of_its_minimum_width_only() -> None:
    cuda = torch.device("cuda")
    assert not flex_available(cuda, MIN_HEAD_DIM - 1)
    assert flex_available(cuda, MIN_HEAD_DIM)
    assert not flex_available(torch.device("cpu"), MIN_HEAD_DIM)


def test_the_compiled_flex_may_hold_more_variants_than_torchs_default() -> None:
    from torch._dynamo import config

    from posbench.kernels.flex_bias import RECOMPILE_LIMIT, _recompile_limit

    before = config.recompile_limit
    with _recompile_limit():
        assert config.recompile_limit == max(before, RECOMPILE_LIMIT) > 8
    assert config.recompile_limit == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
@pytest.mark.parametrize("name", DISTANCE_BIASED)
def test_the_compiled_cuda_path_matches_the_math_path(name: str) -> None:
    d = MIN_HEAD_DIM
    enc = _encoding(name, d).cuda()
    q_span, k_span = Span(0, 256), Span(0, 256)
    q, k, v = (torch.randn(2, 2, 256, d, device="cuda", requires_grad=True) for _ in range(3))
    inputs = [q, k, v, *[p for p in enc.parameters() if p.requires_grad]]
    values, lo = _values_at(enc, q_span, k_span, q.device)
    positions = q_span.arange(q.device)
    out = flex_distance_attention(q, k, v, values, lo, positions, positions, d**-0.5, True)
    reference = _math_path(enc, q, k, v, q_span, k_span)
    assert torch.allclose(out, reference, atol=1e-4)
    grads = torch.autograd.grad(out.sum(), inputs, allow_unused=True)
    expected = torch.autograd.grad(reference.sum(), inputs, allow_unused=True)
    for a, b in zip(grads, expected):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_the_cuda_bench_reports_ratios_to_sdpa_without_a_bias(tmp_path) -> None:
    from helpers import invoke

    result = invoke(
        "bench",
        "--device",
        "cuda",
        "--encodings",
        "nope,t5,alibi,kerple_log",
        "--seq-lens",
        "512,1024",
        "--mem-lens",
        "0",
        "--window-lens",
        "8",
        "--out",
        str(tmp_path / "bench"),
    )
    assert result.exit_code == 0, result.output
    assert "t5" in result.output and "x" in result.output
