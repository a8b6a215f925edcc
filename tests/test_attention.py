"""Attention paths: the flash path for biases (with the kernel's causal masking, blocks of query
rows in the bias gradient) matches SDPA's math path, with and without gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import posbench

from helpers import logits_and_gradients
from posbench.kernels import native
from posbench.kernels.dispatch import biased_attention
from posbench.kernels.probabilities import probabilities_
from posbench.encodings import BandBias, ToeplitzBias


def _mask(kind: str, q_len: int, k_len: int) -> torch.Tensor | None:
    if kind == "none":
        return None
    return torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)


def _math_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dense: torch.Tensor,
    mask: torch.Tensor | None,
    inputs: tuple[torch.Tensor, ...],
    grad: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """SDPA's math path on the dense bias, masked: its output, then the gradients of `inputs`."""
    if mask is not None:
        dense = dense.masked_fill(~mask, float("-inf"))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=0.3)
    return (out, *torch.autograd.grad(out, inputs, grad))


def _assert_close(ours: tuple, reference: tuple, names: list[str]) -> None:
    assert len(ours) == len(reference) == len(names)
    for name, a, b in zip(names, ours, reference):
        assert torch.allclose(a, b, atol=1e-5), name


@pytest.mark.parametrize("bias_shape", [(1, 3), (2, 3), (1, 1), ()])
@pytest.mark.parametrize(
    "mask_kind, q_len, k_len", [("causal", 9, 9), ("causal", 6, 13), ("none", 9, 9)]
)
@pytest.mark.parametrize("bias_grad", [True, False])
def test_biased_attention_matches_sdpa_math(
    bias_shape: tuple[int, ...],
    mask_kind: str,
    q_len: int,
    k_len: int,
    bias_grad: bool,
    monkeypatch,
) -> None:
    monkeypatch.setattr(
        "posbench.kernels.biased_attention.FLASH_MIN_PAIRS", 1
    )  # force the flash path
    monkeypatch.setattr(
        "posbench.kernels.biased_attention.ROW_BLOCK", 4
    )  # several row blocks, a ragged last one
    torch.manual_seed(0)
    q = torch.randn(2, 3, q_len, 8, requires_grad=True)
    k, v = (torch.randn(2, 3, k_len, 8, requires_grad=True) for _ in range(2))
    bias = (10 * torch.randn(*bias_shape, q_len, k_len)).requires_grad_(bias_grad)
    mask = _mask(mask_kind, q_len, k_len)
    out = biased_attention(q, k, v, bias, 0.3, mask)
    inputs = (q, k, v, bias) if bias_grad else (q, k, v)
    grad = torch.randn_like(out)
    reference = _math_path(q, k, v, bias, mask, inputs, grad)
    names = ["out", "q", "k", "v", "bias"][: len(reference)]
    _assert_close((out, *torch.autograd.grad(out, inputs, grad)), reference, names)
    with torch.no_grad():
        assert torch.allclose(biased_attention(q, k, v, bias, 0.3, mask), reference[0], atol=1e-5)


@pytest.mark.parametrize("heads", [3, 1])
@pytest.mark.parametrize(
    "mask_kind, q_len, k_len", [("causal", 11, 11), ("none", 11, 11), ("causal", 5, 11)]
)
def test_toeplitz_bias_gradient_is_summed_per_distance(
    heads: int, mask_kind: str, q_len: int, k_len: int, monkeypatch
) -> None:
    """A ToeplitzBias's values get, from the blocks of query rows, the gradient that SDPA's
    math path gives them through the dense matrix (causal, bidirectional, and a cache's
    rectangle, which takes the dense path)."""
    monkeypatch.setattr("posbench.kernels.biased_attention.FLASH_MIN_PAIRS", 1)
    monkeypatch.setattr("posbench.kernels.biased_attention.ROW_BLOCK", 4)  # a ragged last block
    monkeypatch.setattr(native, "band_flash", lambda: None)  # the torch kernels, not the C++ one
    torch.manual_seed(0)
    q = torch.randn(2, 3, q_len, 8, requires_grad=True)
    k, v = (torch.randn(2, 3, k_len, 8, requires_grad=True) for _ in range(2))
    values = (3 * torch.randn(heads, q_len + k_len - 1)).requires_grad_(True)
    mask = _mask(mask_kind, q_len, k_len)
    bias = ToeplitzBias(values, q_len, k_len)
    out = biased_attention(q, k, v, bias, 0.3, mask)
    grad = torch.randn_like(out)
    reference = _math_path(q, k, v, bias.dense(), mask, (q, k, v, values), grad)
    ours = (out, *torch.autograd.grad(out, (q, k, v, values), grad))
    _assert_close(ours, reference, ["out", "q", "k", "v", "values"])


@pytest.mark.parametrize(
    "L, W, rows", [(20, 5, 4), (9, 12, 4), (33, 7, 8), (16, 1, 4), (40, 40, 16)]
)
@pytest.mark.parametrize("band_shape", [(2, 3, "L"), (1, 3, 1)])
def test_band_attention_matches_the_dense_bias(
    L: int, W: int, rows: int, band_shape: tuple, monkeypatch
) -> None:
    """Far keys through flash attention, the band densely, merged by log-sum-exp: outputs and
    gradients (q, k, v and the band, broadcast or not) equal SDPA's math path on the dense bias."""
    monkeypatch.setattr("posbench.kernels.biased_attention.FLASH_MIN_PAIRS", 1)
    monkeypatch.setattr("posbench.kernels.band_attention.ROWS", rows)
    monkeypatch.setattr(native, "band_flash", lambda: None)  # the torch band kernel
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, L, 8, requires_grad=True) for _ in range(3))
    band = (3 * torch.randn(*[L if n == "L" else n for n in band_shape], W)).requires_grad_(True)
    bias = BandBias(band, torch.randn(2, 3, L, 1))  # the row constant changes no weight
    mask = _mask("causal", L, L)
    out = biased_attention(q, k, v, bias, 0.3, mask)
    grad = torch.randn_like(out)
    reference = _math_path(q, k, v, bias.dense(L), mask, (q, k, v, band), grad)
    ours = (out, *torch.autograd.grad(out, (q, k, v, band), grad))
    _assert_close(ours, reference, ["out", "q", "k", "v", "band"])
    with torch.no_grad():
        assert torch.allclose(biased_attention(q, k, v, bias, 0.3, mask), reference[0], atol=1e-5)


@pytest.mark.parametrize(
    "name, options",
    [
        ("t5", {"num_buckets": 8, "max_distance": 8}),
        ("deberta", {"span": 4}),
        ("deberta", {"span": 12, "position_buckets": 4}),
        ("alibi", {}),
        ("kerple_log", {}),  # a learned dense bias: its gradient from the fused backward
        ("kerple_power", {}),
        ("fire", {}),
        ("txl", {}),  # the rel-shift kernel: a bias formed from q and the distance table
        ("txl", {"clamp_len": 32}),
        ("txl", {"randomize_positions": 512}),  # drawn: the per-key table, the same kernel
        ("t5", {"num_buckets": 8, "max_distance": 8, "randomize_positions": 512}),  # drawn
        ("deberta", {"span": 4, "randomize_positions": 512}),
        ("deberta", {"span": 12, "position_buckets": 4, "randomize_positions": 512}),
    ],
)
def test_fast_attention_paths_match_the_math_path_in_a_layer(
    name: str, options: dict, monkeypatch
) -> None:
    """A whole layer at L=160 (posbench's C++ kernel for a band or per-distance bias, the flash
    kernel, the rel-shift kernel) gives the output and gradients of SDPA's math path on the
    dense bias."""
    from posbench.experiment.config import EncodingSpec
    from posbench.experiment.profiling import AttentionUnderTest

    torch.manual_seed(0)
    layer = AttentionUnderTest(EncodingSpec(name, options), n_heads=2, d_head=8)
    with torch.no_grad():
        for p in layer.encoding.parameters():
            p.normal_(std=0.5)  # position terms large enough to matter
    x = torch.randn(2, 160, 16)

    def run() -> tuple[torch.Tensor, ...]:
        torch.manual_seed(1)  # the same drawn positions, where the encoding draws them
        x_grad = x.clone().requires_grad_(True)
        out = layer(x_grad)
        params = [p for p in layer.parameters()]
        grads = torch.autograd.grad(out, [x_grad, *params], torch.ones_like(out), allow_unused=True)
        return (out, *[g for g in grads if g is not None])

    fast = run()
    monkeypatch.setattr(
        "posbench.kernels.biased_attention.FLASH_MIN_PAIRS", 10**9
    )  # math path, dense bias
    monkeypatch.setattr(native, "band_flash", lambda: None)
    reference = run()
    assert len(fast) == len(reference)
    for a, b in zip(fast, reference):
        assert torch.allclose(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("encoding", posbench.list_encodings())
def test_without_the_private_flash_ops_every_encoding_trains_and_matches(
    encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch may drop or change the private CPU flash ops: attention then takes the public
    math path, with the same outputs and gradients."""
    from posbench.kernels import flash_ops

    with_flash, grads_flash = logits_and_gradients(encoding)
    monkeypatch.setattr(flash_ops, "available", lambda: False)
    monkeypatch.setattr(flash_ops, "forward", None)  # any call would now fail loudly
    monkeypatch.setattr(flash_ops, "backward", None)
    without, grads_without = logits_and_gradients(encoding)
    torch.testing.assert_close(without, with_flash, atol=2e-5, rtol=1e-4)
    for name, grad in grads_flash.items():
        torch.testing.assert_close(grads_without[name], grad, atol=2e-5, rtol=2e-4, msg=name)


def test_the_memory_estimate_never_allocates_what_it_estimates() -> None:
    """A configuration asking for length 10^8 is refused with a sentence; estimating it must not
    build the encodings' tables for 10^8 positions (that once took 23.7 GB and the OOM killer)."""
    import subprocess
    import sys

    probe = (
        "import resource; from posbench.attention import attention_tensor_bytes;"
        "from posbench.encodings import BUILTINS, create_encoding;"
        "sizes = [attention_tensor_bytes(create_encoding(n, n_heads=2, d_head=8), 128, 10**8)"
        " for n in BUILTINS];"
        "print(min(sizes), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    smallest, peak_kib = map(int, done.stdout.split())
    assert smallest >= 4 * 128 * 2 * 10**8  # at least one (B, H, L, d) tensor's worth
    assert peak_kib < 2 * 2**20, f"estimating took {peak_kib / 2**20:.1f} GiB"


def test_probabilities_are_exp_with_nothing_subnormal() -> None:
    """Underflowing exps and tiny weights become exactly 0; every other entry is exp itself."""
    scores = torch.tensor([float("-inf"), -1000.0, -87.5, -70.0, -60.0, -10.0, 0.0])
    expected = torch.exp(scores).masked_fill(scores < -69.0, 0.0)  # exp(-69) ~ 1.0e-30
    probs = probabilities_(scores.clone())
    assert torch.equal(probs, expected)
    tiny = torch.finfo(torch.float32).tiny
    assert not ((probs > 0) & (probs < tiny)).any()


def test_band_attention_keeps_masked_probabilities_exactly_zero(monkeypatch) -> None:
    """The band kernel's kept probabilities, which its backward pass multiplies, are 0 outside
    the band instead of exp(-87) (whose products are subnormal), and none is subnormal."""
    monkeypatch.setattr("posbench.kernels.biased_attention.FLASH_MIN_PAIRS", 1)
    monkeypatch.setattr(native, "band_flash", lambda: None)  # the torch band kernel
    torch.manual_seed(0)
    L, W = 40, 6
    q, k, v = (torch.randn(2, 3, L, 8, requires_grad=True) for _ in range(3))
    bias = BandBias(torch.randn(1, 3, 1, W), torch.zeros(1, 3, 1, 1))
    out = biased_attention(q, k, v, bias, 0.3, _mask("causal", L, L))
    kept = out.grad_fn.saved_tensors[6:]  # (B * H, rows, rows + W - 1) per block of rows
    assert kept
    for block in kept:
        rows = block.shape[1]
        column = torch.arange(block.shape[2])
        row = torch.arange(rows)[:, None]
        outside = (column < row) | (column >= row + W)  # keys outside each row's band
        assert (block[:, outside] == 0).all()
        assert not ((block > 0) & (block < torch.finfo(torch.float32).tiny)).any()
