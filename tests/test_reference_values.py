"""Each encoding against its reference formulation (conventions in docs/encodings/),
using deliberately naive implementations written here: explicit loops and dense tensors."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor
from helpers import assert_close_to_scale, segments_dense

from posbench import create_encoding
from posbench.encodings.alibi import alibi_slopes
from posbench.encodings.base import LayerContext, Span
from posbench.bias_kinds import BandBias, SegmentBias, dense_bias
from posbench.encodings.deberta import log_bucket_position
from posbench.encodings import fire as fire_module
from posbench.encodings.t5 import t5_bucket
from posbench.errors import OptionError
from posbench.testing import attention_logits


def heads(enc):
    return lambda x: x.view(x.shape[0], enc.n_heads, enc.d_head).transpose(0, 1)


def causal_pairs(q_span: Span, k_span: Span):
    """(query index, its position, key index, its position) for every key at or before the
    query, at the spans' plain or drawn positions."""
    for a, i in enumerate(q_span.arange().tolist()):
        for b, j in enumerate(k_span.arange().tolist()):
            if j <= i:
                yield a, i, b, j


# ---- T5 -------------------------------------------------------------------------------------
def test_t5_causal_bucket_vector() -> None:
    n = torch.tensor([0, 1, 15, 16, 17, 24, 32, 64, 127, 1000])
    got = t5_bucket(-n, bidirectional=False, num_buckets=32, max_distance=128)
    assert got.tolist() == [0, 1, 15, 16, 16, 19, 21, 26, 31, 31]
    # future keys (j > i) fall in bucket 0 when causal
    assert t5_bucket(torch.tensor([1, 5, 100]), False, 32, 128).tolist() == [0, 0, 0]


def test_t5_bidirectional_buckets() -> None:
    rel = torch.tensor([-1, 1, -7, 7, -8, 8, -200, 200])
    got = t5_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    # 16 buckets per side, exact below 8, keys after the query offset by 16
    assert got.tolist() == [1, 17, 7, 23, 8, 24, 15, 31]


def test_t5_bias_reads_table_by_bucket() -> None:
    enc = create_encoding("t5", n_heads=3, d_head=4, num_buckets=8, max_distance=16)
    bias = enc.position_bias(
        Span(5, 9), Span(0, 9), LayerContext(0, None, None), torch.device("cpu")
    )
    table = enc.tables[0].weight
    for a, i, b, j in causal_pairs(Span(5, 9), Span(0, 9)):
        bucket = t5_bucket(torch.tensor(j - i), False, 8, 16).item()
        assert torch.equal(bias[:, a, b], table[bucket])


@pytest.mark.parametrize("num_buckets, max_distance", [(8, 16), (32, 128), (32, 50), (6, 7)])
def test_t5_long_causal_bias_is_banded_at_max_distance(num_buckets: int, max_distance: int) -> None:
    """Past max_distance every distance reads the last bucket, so square causal scores get a
    BandBias whose dense form still reads the table by bucket for every pair."""
    distances = torch.arange(max_distance, 20 * max_distance)
    assert (t5_bucket(-distances, False, num_buckets, max_distance) == num_buckets - 1).all()
    enc = create_encoding(
        "t5", n_heads=3, d_head=4, num_buckets=num_buckets, max_distance=max_distance
    )
    span = Span(5, 5 + 3 * max_distance)
    bias = enc.position_bias(span, span, LayerContext(0, None, None), torch.device("cpu"))
    assert isinstance(bias, BandBias) and bias.width <= max_distance
    dense = bias.dense(len(span))[0]
    table = enc.tables[0].weight
    # every pair's bucket from its own j - i, causal pairs only; (x - last) + last rounds in float32
    positions = span.arange()
    offsets = positions[None, :] - positions[:, None]  # (L, L): j - i
    expected = table[t5_bucket(offsets, False, num_buckets, max_distance)].permute(2, 0, 1)
    seen = offsets <= 0  # (L, L)
    assert_close_to_scale(dense[:, seen], expected[:, seen], 1e-6, "causal pairs")


# ---- ALiBi ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "n_heads,expected",
    [
        (8, [2.0 ** -(h + 1) for h in range(8)]),
        (6, [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]),
        (12, [2.0 ** -(h + 1) for h in range(8)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]),
    ],
)
def test_alibi_slopes(n_heads: int, expected: list[float]) -> None:
    assert alibi_slopes(n_heads) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_logits_are_content_minus_slope_times_distance(symmetric: bool) -> None:
    """Logits minus the content term equal -m_h (i - j) (or -m_h |i - j|) up to a constant per
    query row, which softmax ignores (causal ALiBi is folded into q and k)."""
    enc = create_encoding("alibi", n_heads=6, d_head=4, symmetric=symmetric)
    q, k = torch.randn(1, 6, 4, 4), torch.randn(1, 6, 7, 4)
    q_span, k_span = Span(3, 7), Span(0, 7)
    position_part = attention_logits(enc, q, k, q_span, k_span) - (q @ k.transpose(-1, -2)) / 2.0
    slopes = alibi_slopes(6)
    for a, i in enumerate(range(3, 7)):
        for b, j in enumerate(range(0, 7)):
            if j > i and not symmetric:
                continue
            dist = abs(i - j) if symmetric else i - j
            for h in range(6):
                got = position_part[0, h, a, b].item() - (position_part[0, h, a, 0].item())
                assert got == pytest.approx(-slopes[h] * dist + slopes[h] * i, abs=1e-4)


# ---- RoPE -----------------------------------------------------------------------------------
def rotation_matrix(p: int, d: int, base: float) -> torch.Tensor:
    """Block rotation on pairs (k, k + d/2) by angle p * base^(-2k/d), in float64."""
    m = torch.zeros(d, d, dtype=torch.float64)
    for k in range(d // 2):
        theta = p * base ** (-2 * k / d)
        c, s = math.cos(theta), math.sin(theta)
        m[k, k], m[k, k + d // 2] = c, -s
        m[k + d // 2, k], m[k + d // 2, k + d // 2] = s, c
    return m


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_rope_matches_rotation_matrices(base: float) -> None:
    enc = create_encoding("rope", n_heads=2, d_head=8, base=base)
    span = Span(17, 23)
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    ctx = LayerContext(0, heads(enc), heads(enc))
    q_rot, k_rot = enc.rotate(q, k, span, ctx)
    for t, p in enumerate(range(span.start, span.stop)):
        m = rotation_matrix(p, 8, base)
        expected_q = (m @ q[0, :, t].double().T).T
        expected_k = (m @ k[0, :, t].double().T).T
        assert torch.allclose(q_rot[0, :, t].double(), expected_q, atol=1e-5)
        assert torch.allclose(k_rot[0, :, t].double(), expected_k, atol=1e-5)


def test_rope_logits_depend_on_offset_only() -> None:
    enc = create_encoding("rope", n_heads=1, d_head=8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    got = attention_logits(enc, q, k, Span(9, 10), Span(4, 5))
    expected = (
        q[0, 0, 0].double()
        @ rotation_matrix(9, 8, 1e4).T
        @ rotation_matrix(4, 8, 1e4)
        @ k[0, 0, 0].double()
    )
    assert got.item() == pytest.approx(expected.item() / math.sqrt(8), abs=1e-5)


# ---- sinusoidal -----------------------------------------------------------------------------
def test_sinusoidal_table() -> None:
    enc = create_encoding("sinusoidal", n_heads=2, d_head=4)
    table = enc.table(Span(0, 50), torch.device("cpu"))
    for p in (0, 1, 7, 49):
        for i in range(8):
            angle = p / 10000 ** (2 * (i // 2) / 8)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert table[p, i].item() == pytest.approx(expected, abs=1e-6)


def test_sinusoidal_amplitude_scales_the_table_and_only_the_table() -> None:
    plain = create_encoding("sinusoidal", n_heads=2, d_head=4)
    small = create_encoding("sinusoidal", n_heads=2, d_head=4, amplitude=0.02)
    span = Span(0, 20)
    torch.testing.assert_close(small.table(span, "cpu"), 0.02 * plain.table(span, "cpu"))
    x = torch.randn(1, 20, 8)
    torch.testing.assert_close(small.embed(x, span) - x, 0.02 * (plain.embed(x, span) - x))


def test_sinusoidal_restart_variant_resets_positions() -> None:
    enc = create_encoding("sinusoidal", n_heads=2, d_head=4, restart_per_segment=True)
    x = torch.zeros(1, 3, 8)
    assert torch.equal(enc.embed(x, Span(10, 13)), enc.embed(x, Span(0, 3)))


# ---- Transformer-XL -------------------------------------------------------------------------
def naive_txl(enc, q, k, q_span: Span, k_span: Span, layer: int = 0) -> torch.Tensor:
    """The four terms by explicit loops: (a) q.k (b) q.W_kR R (c) u.k_j (d) v.W_kR R."""
    B, H, Lq, d = q.shape
    D = enc.d_model
    w = enc.w_kr[layer].weight.double()  # (D, D)
    u, v = (
        enc.u[0 if enc.share_uv else layer].double(),
        enc.v[0 if enc.share_uv else layer].double(),
    )
    out = torch.full((B, H, Lq, k.shape[2]), float("nan"), dtype=torch.float64)
    scale = 1 / math.sqrt(d) if enc.scale else 1.0
    for a, i, b, j in causal_pairs(q_span, k_span):
        dist = i - j if enc.clamp_len is None else min(i - j, enc.clamp_len)
        freqs = [dist / 10000 ** (2 * t / D) for t in range(D // 2)]
        r = torch.tensor(
            [math.sin(f) for f in freqs] + [math.cos(f) for f in freqs], dtype=torch.float64
        )
        wr = (w @ r).view(H, d)
        for bb in range(B):
            for h in range(H):
                qi, kj = q[bb, h, a].double(), k[bb, h, b].double()
                term_a = qi @ kj
                term_b = qi @ wr[h]
                term_c = u[h] @ kj
                term_d = v[h] @ wr[h]
                out[bb, h, a, b] = (term_a + term_b + term_c + term_d) * scale
    return out


@pytest.mark.parametrize("memory", [0, 5, 300])
@pytest.mark.parametrize("options", [{}, {"clamp_len": 3}, {"scale": False, "share_uv": True}])
def test_txl_matches_naive_four_terms(memory: int, options: dict) -> None:
    torch.manual_seed(0)
    enc = create_encoding("txl", n_heads=2, d_head=4, n_layers=2, **options)
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(std=0.5)
    q_span, k_span = Span(memory, memory + 4), Span(0, memory + 4)
    q, k = torch.randn(2, 2, 4, 4), torch.randn(2, 2, memory + 4, 4)
    got = attention_logits(enc, q, k, q_span, k_span, layer=1).double()
    expected = naive_txl(enc, q, k, q_span, k_span, layer=1)
    valid = ~expected.isnan()
    assert torch.allclose(got[valid], expected[valid], atol=1e-5)


@pytest.mark.parametrize(
    "table_cheaper, options, memory, form",
    [
        (True, {}, 0, "DistanceTableBias"),  # square scores: the table of distances
        (False, {}, 0, "KeyTableBias"),  # the sin/cos identity, d_model wide
        (True, {}, 5, "KeyTableBias"),  # after a memory: the identity
        (True, {"clamp_len": 3}, 0, "DistanceTableBias"),
        (False, {"clamp_len": 3}, 0, "Tensor"),  # no identity: a dense gather
        (True, {"clamp_len": 3}, 5, "Tensor"),
    ],
)
def test_txl_matches_naive_four_terms_at_drawn_positions(
    monkeypatch: pytest.MonkeyPatch, table_cheaper: bool, options: dict, memory: int, form: str
) -> None:
    """At drawn positions terms (b) + (d) take the form that costs least where it applies:
    every form gives the four terms at p_i - p_j."""
    from posbench.encodings import txl as txl_module

    monkeypatch.setattr(txl_module, "DRAWN_TABLE_WORK_RATIO", 1e9 if table_cheaper else 0.0)
    torch.manual_seed(0)
    enc = create_encoding("txl", n_heads=2, d_head=4, n_layers=2, **options)
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(std=0.5)
    positions = torch.randint(1, 6, (memory + 6,)).cumsum(0) + 7  # gaps of 1 to 5
    q_span = Span(memory, memory + 6, positions[memory:])
    k_span = Span(0, memory + 6, positions)
    q, k = torch.randn(2, 2, 6, 4), torch.randn(2, 2, memory + 6, 4)
    bias = enc.score(q, k, q_span, k_span, LayerContext(1, lambda t: t, lambda t: t)).bias
    assert type(bias).__name__ == form
    got = attention_logits(enc, q, k, q_span, k_span, layer=1).double()
    expected = naive_txl(enc, q, k, q_span, k_span, layer=1)
    valid = ~expected.isnan()
    assert torch.allclose(got[valid], expected[valid], atol=1e-5)
    if form == "DistanceTableBias":  # its per-key form, for kernels other than the C++ one
        assert (bias.by_key is None) == ("clamp_len" in options)  # clamp_len: no identity
        if bias.by_key is not None:
            table_form, key_form = bias.dense(), bias.by_key().dense()
            assert torch.allclose(key_form[valid], table_form[valid], atol=1e-5)


def test_txl_term_c_varies_with_key_not_query() -> None:
    """u.k_j: with q = 0 and W_kR = 0, logits differ across keys and agree across queries."""
    enc = create_encoding("txl", n_heads=1, d_head=4)
    with torch.no_grad():
        enc.w_kr[0].weight.zero_()
        enc.u.normal_()
    q, k = torch.zeros(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    logits = attention_logits(enc, q, k, Span(0, 3), Span(0, 3))[0, 0]
    assert torch.allclose(logits[0], logits[2]) and not torch.allclose(logits[2, 0], logits[2, 1])


# ---- DeBERTa --------------------------------------------------------------------------------
def naive_deberta(
    enc, q, k, q_span: Span, k_span: Span, layer: int, proj_q, proj_k
) -> torch.Tensor:
    """Three terms by explicit loops: Qc.Kc + Qc.Kr[δ] + Kc.Qr[δ], over sqrt(3d)."""
    B, H, Lq, d = q.shape
    p = enc.rel_embeddings.weight.double()
    if enc.share_att_key:
        kr_all, qr_all = proj_k(p), proj_q(p)  # (H, 2k, d)
    else:
        kr_all = torch.nn.functional.linear(
            p, enc.pos_key_proj[layer].weight.double(), enc.pos_key_proj[layer].bias.double()
        )
        qr_all = torch.nn.functional.linear(
            p, enc.pos_query_proj[layer].weight.double(), enc.pos_query_proj[layer].bias.double()
        )
        kr_all, qr_all = (
            kr_all.view(-1, H, d).transpose(0, 1),
            qr_all.view(-1, H, d).transpose(0, 1),
        )
    k_span_len = enc.att_span
    out = torch.full((B, H, Lq, k.shape[2]), float("nan"), dtype=torch.float64)
    for a, i, b, j in causal_pairs(q_span, k_span):
        rel = i - j
        if enc.position_buckets > 0:
            rel = hf_log_bucket(rel, enc.position_buckets, enc.span)
        delta = min(max(rel + k_span_len, 0), 2 * k_span_len - 1)
        for bb in range(B):
            for h in range(H):
                qi, kj = q[bb, h, a].double(), k[bb, h, b].double()
                out[bb, h, a, b] = (
                    qi @ kj + qi @ kr_all[h, delta] + kj @ qr_all[h, delta]
                ) / math.sqrt(3 * d)
    return out


def hf_log_bucket(rel: int, bucket_size: int, max_position: int) -> int:
    mid = bucket_size // 2
    if -mid < rel < mid:
        return rel
    abs_pos = abs(rel)
    if abs_pos <= mid:
        return rel
    log_pos = (
        math.ceil(math.log(abs_pos / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    )
    return int(log_pos * (1 if rel > 0 else -1))


def test_deberta_log_buckets_match_hf_formula() -> None:
    rel = torch.arange(-300, 301)
    got = log_bucket_position(rel, 32, 128)
    assert got.tolist() == [hf_log_bucket(int(r), 32, 128) for r in rel]


@pytest.mark.parametrize("memory", [0, 6])
@pytest.mark.parametrize(
    "options",
    [
        {"span": 3},
        {"span": 64},
        {"span": 12, "position_buckets": 4},
        {"span": 3, "share_att_key": True},
    ],
)
def test_deberta_matches_naive_three_terms(memory: int, options: dict) -> None:
    torch.manual_seed(0)
    enc = create_encoding("deberta", n_heads=2, d_head=4, n_layers=2, **options).double()
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(std=0.5)
    w_q, w_k = torch.randn(8, 8, dtype=torch.float64), torch.randn(8, 8, dtype=torch.float64)
    proj_q = lambda x: (x @ w_q.T).view(-1, 2, 4).transpose(0, 1)  # noqa: E731
    proj_k = lambda x: (x @ w_k.T).view(-1, 2, 4).transpose(0, 1)  # noqa: E731
    q_span, k_span = Span(memory, memory + 7), Span(0, memory + 7)
    q, k = (
        torch.randn(2, 2, 7, 4, dtype=torch.float64),
        torch.randn(2, 2, memory + 7, 4, dtype=torch.float64),
    )
    got = enc.score(q, k, q_span, k_span, LayerContext(1, proj_q, proj_k)).logits()
    expected = naive_deberta(enc, q, k, q_span, k_span, 1, proj_q, proj_k)
    valid = ~expected.isnan()
    assert torch.allclose(got[valid], expected[valid], atol=1e-9)


# ---- RoPE context-extension scalings against Hugging Face's modeling_rope_utils -------------
def _hf_inv_freq(
    kind: str, dim: int, base: float, factor: float, max_pos: int, seq_len: int | None = None
):
    """The formulas of transformers' ROPE_INIT_FUNCTIONS (default, linear, ntk, dynamic, yarn,
    llama3 with low 1, high 4), restated here in float32 as that file computes them."""

    def default(b: float) -> torch.Tensor:
        return 1.0 / (b ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

    if kind == "none":
        return default(base), 1.0
    if kind == "linear":
        return default(base) / factor, 1.0
    if kind == "ntk":
        return default(base * factor ** (dim / (dim - 2))), 1.0
    if kind == "dynamic":
        seq = seq_len if seq_len is not None and seq_len > max_pos else max_pos
        return default(base * ((factor * seq / max_pos) - (factor - 1)) ** (dim / (dim - 2))), 1.0
    if kind == "yarn":

        def correction(rotations: float) -> float:
            return (dim * math.log(max_pos / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = max(math.floor(correction(32)), 0), min(math.ceil(correction(1)), dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        extrapolation = 1 - ramp
        inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
        return inv, 0.1 * math.log(factor) + 1.0
    assert kind == "llama3"
    inv = default(base)
    low_wavelen, high_wavelen = max_pos / 1.0, max_pos / 4.0
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (max_pos / wavelen - 1.0) / (4.0 - 1.0)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


@pytest.mark.parametrize("kind", ["none", "linear", "ntk", "dynamic", "yarn", "llama3"])
@pytest.mark.parametrize("dim", [8, 16, 64, 128])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 8.0])
def test_rope_scalings_match_hugging_face(kind: str, dim: int, factor: float) -> None:
    from posbench.encodings.rope import rope_frequencies

    for base, max_pos in ((10000.0, 64), (500000.0, 8192)):
        for seq_len in (None, 3 * max_pos) if kind == "dynamic" else (None,):
            ours, attention = rope_frequencies(dim, base, kind, factor, max_pos, seq_len)
            theirs, their_attention = _hf_inv_freq(kind, dim, base, factor, max_pos, seq_len)
            assert torch.allclose(ours.float(), theirs, rtol=1e-5, atol=0), (
                kind,
                dim,
                factor,
                base,
            )
            assert attention == pytest.approx(their_attention)


def test_rope_scaling_reaches_the_rotation_and_the_logits() -> None:
    yarn = create_encoding(
        "rope", n_heads=1, d_head=16, scaling="yarn", factor=4.0, original_length=32
    )
    plain = create_encoding("rope", n_heads=1, d_head=16)
    q = torch.randn(1, 1, 5, 16)
    (qy, _), (qp, _) = yarn.rotate(q, q, Span(0, 5), None), plain.rotate(q, q, Span(0, 5), None)
    attention = 0.1 * math.log(4.0) + 1.0
    assert torch.allclose(
        qy[..., 0, :], attention * q[..., 0, :], atol=1e-6
    )  # position 0: no rotation, scaled
    assert not torch.allclose(qy / attention, qp, atol=1e-4)  # frequencies changed
    dynamic = create_encoding(
        "rope", n_heads=1, d_head=16, scaling="dynamic", factor=2.0, original_length=8
    )
    short, _ = dynamic.rotate(q, q, Span(0, 5), None)
    assert torch.allclose(short, qp, atol=1e-6)  # within original_length: the plain rotation
    with pytest.raises(OptionError, match="scaling 'yarn' needs original_length"):
        create_encoding("rope", n_heads=1, d_head=16, scaling="yarn", factor=4.0)


# ---- KERPLE against chijames/KERPLE's kernels ------------------------------------------------
def _kerple_reference(kind: str, a: torch.Tensor, p: torch.Tensor, L: int) -> torch.Tensor:
    """The reference's forward: diff = tril(i - j), a and p clamped to >= 0.01 (p <= 2 for
    power)."""
    diff = torch.tril(torch.arange(L).view(L, 1).repeat(1, L) + torch.arange(0, -L, -1)).float()
    a, p = a.clamp(min=1e-2)[:, None, None], p.clamp(min=1e-2)[:, None, None]
    if kind == "kerple_log":
        return -p * torch.log(1 + a * diff)
    return -(diff.pow(p.clamp(max=2))) * a


@pytest.mark.parametrize("kind", ["kerple_log", "kerple_power"])
def test_kerple_bias_matches_the_reference(kind: str) -> None:
    torch.manual_seed(3)
    enc = create_encoding(kind, n_heads=4, d_head=8)
    with torch.no_grad():
        enc.a.copy_(torch.tensor([0.5, 0.001, 0.9, 0.2]))  # one below the clamp
        enc.p.copy_(torch.tensor([1.5, 0.3, 2.7, 0.005]))  # one above 2, one below the clamp
    bias = dense_bias(
        enc.position_bias(Span(0, 9), Span(0, 9), LayerContext(0, None, None), torch.device("cpu")),
        9,
    )
    expected = _kerple_reference(kind, enc.a.detach(), enc.p.detach(), 9)
    mask = torch.ones(9, 9, dtype=torch.bool).tril()
    assert torch.allclose(bias[:, mask], expected[:, mask], atol=1e-6)
    # through a cache: the last 3 queries against all 9 keys read the same rows
    tail = dense_bias(
        enc.position_bias(Span(6, 9), Span(0, 9), LayerContext(0, None, None), torch.device("cpu")),
        3,
    )
    assert torch.allclose(tail[:, mask[6:]], expected[:, 6:][:, mask[6:]], atol=1e-6)


def test_kerple_initialisation_follows_the_reference() -> None:
    torch.manual_seed(0)
    enc = create_encoding("kerple_log", n_heads=64, d_head=4).requires_grad_(False)
    assert (
        0 <= float(enc.a.min())
        and float(enc.a.max()) <= 1
        and 0 <= float(enc.p.min())
        and float(enc.p.max()) <= 2
    )
    assert float(enc.p.mean()) == pytest.approx(1.0, abs=0.25)  # U(0, 2)


def hugging_face_partial_rotary(
    q: Tensor, positions: Tensor, d_head: int, fraction: float
) -> Tensor:
    """Hugging Face's partial rotary: frequencies over dim = int(d * fraction) dimensions (one per
    started pair), half-split rotation of the first 2 * len(inv_freq) dimensions."""
    dim = int(d_head * fraction)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = positions.double()[:, None] * inv_freq  # (L, len(inv_freq))
    cos, sin = (
        torch.cat((angles.cos(), angles.cos()), -1),
        torch.cat((angles.sin(), angles.sin()), -1),
    )
    r = cos.shape[-1]
    x = q[..., :r]
    half = r // 2
    turned = x * cos.float() + torch.cat((-x[..., half:], x[..., :half]), -1) * sin.float()
    return torch.cat((turned, q[..., r:]), -1)


@pytest.mark.parametrize(
    ("d_head", "fraction"), [(16, 0.25), (64, 0.3), (64, 0.5), (32, 0.4), (16, 0.2), (8, 1.0)]
)
def test_partial_rotary_follows_hugging_face(d_head: int, fraction: float) -> None:
    # (64, 0.3): int(19.2) = 19 dimensions, an odd count: 10 frequencies over exponent / 19, and
    # 20 dimensions rotate, as Hugging Face does.
    torch.manual_seed(0)
    q = torch.randn(1, 2, 6, d_head)
    partial = create_encoding("rope", n_heads=2, d_head=d_head, rotary_fraction=fraction)
    got, _ = partial.rotate(q, q, Span(3, 9), None)
    expected = hugging_face_partial_rotary(q, torch.arange(3, 9), d_head, fraction)
    assert torch.allclose(got, expected, atol=1e-5)


def test_odd_partial_rotary_rotates_one_more_dimension_than_it_names() -> None:
    enc = create_encoding("rope", n_heads=1, d_head=64, rotary_fraction=0.3)
    inv_freq, _ = enc.frequencies()
    assert (enc.frequency_dim, enc.rotary_dim, len(inv_freq)) == (19, 20, 10)
    assert float(inv_freq[1]) == pytest.approx(10000.0 ** (-2 / 19), rel=1e-12)


@pytest.mark.parametrize("d_head", [8, 16, 32, 64])
@pytest.mark.parametrize("keep", [0.0, 0.1, 0.25, 0.3, 0.45, 0.5, 0.6, 0.7, 0.75, 0.9, 1.0])
def test_p_rope_keeps_what_hugging_face_proportional_rope_keeps(d_head: int, keep: float) -> None:
    # Hugging Face's "proportional" rope: int(p * head_dim // 2) highest frequencies of
    # base^(-2k / head_dim), the rest 0 (d = 16, p = 0.45 keeps 3 of 8, rounded down).
    rope_angles = int(keep * d_head // 2)
    rotated = 1.0 / (10000.0 ** (torch.arange(0, 2 * rope_angles, 2, dtype=torch.float64) / d_head))
    expected = torch.cat((rotated, torch.zeros(d_head // 2 - rope_angles, dtype=torch.float64)))
    got, _ = create_encoding("rope", n_heads=1, d_head=d_head, keep_frequencies=keep).frequencies()
    assert torch.equal(got, expected)


def test_p_rope_passes_the_dropped_pairs_through() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 2, 6, 16)
    p_rope = create_encoding("rope", n_heads=2, d_head=16, keep_frequencies=0.5)
    turned, _ = p_rope.rotate(q, q, Span(5, 11), None)
    dropped = [4, 5, 6, 7, 12, 13, 14, 15]  # pairs (k, k + 8) for k = 4..7 do not rotate
    assert torch.allclose(turned[..., dropped], q[..., dropped])


@pytest.mark.parametrize(
    ("d_head", "options", "named"),
    [
        (16, {"rotary_fraction": 0.125, "scaling": "ntk", "factor": 2.0}, "more than 2 rotated"),
        (
            64,
            {"rotary_fraction": 0.3, "scaling": "yarn", "factor": 2.0, "original_length": 64},
            "even number of rotated dimensions",
        ),
    ],
)
def test_rope_refuses_scalings_its_rotated_width_cannot_carry(
    d_head: int, options: dict, named: str
) -> None:
    with pytest.raises(OptionError, match=named):
        create_encoding("rope", n_heads=1, d_head=d_head, **options)


# ---- Sandwich against NeMo, xPos against torchscale ------------------------------------------
def test_sandwich_matches_nemo() -> None:
    H, d, L = 4, 16, 10
    enc = create_encoding("sandwich", n_heads=H, d_head=d)
    bias = enc.position_bias(
        Span(0, L), Span(0, L), LayerContext(0, None, None), torch.device("cpu")
    )
    # NeMo: relative_position = tril(|i - j|), inv_freq = 1 / 10000^(2 arange(1, d/2 + 1) / d),
    # bias = sum cos(r inv_freq) repeated per head, (bias - d/2) / (arange(1, H + 1) * 8 / H)
    rel = torch.tril((torch.arange(L)[:, None] - torch.arange(L)[None, :]).abs())
    inv_freq = 1.0 / (10000 ** (2 * torch.arange(1, d / 2 + 1) / d))
    summed = torch.sum((rel[:, :, None].repeat(1, 1, len(inv_freq)) * inv_freq).cos(), axis=2)
    expected = (summed.repeat(H, 1, 1) - d / 2) / (torch.arange(1, H + 1)[:, None, None] * 8 / H)
    mask = torch.ones(L, L, dtype=torch.bool).tril()
    assert torch.allclose(bias[:, mask], expected[:, mask].float(), atol=1e-5)
    assert torch.allclose(bias.diagonal(dim1=1, dim2=2), torch.zeros(H, L), atol=1e-5)


def test_xpos_logits_match_torchscale() -> None:
    torch.manual_seed(0)
    d, L, gamma = 8, 12, 16.0
    enc = create_encoding("xpos", n_heads=1, d_head=d, scale_base=gamma)
    q, k = torch.randn(1, 1, L, d), torch.randn(1, 1, L, d)
    q2, k2 = enc.rotate(q, k, Span(0, L), None)
    ours = q2 @ k2.transpose(-1, -2)

    def torchscale(x: torch.Tensor, downscale: bool) -> torch.Tensor:  # x (L, d), offset 0
        zeta = (torch.arange(0, d, 2) + 0.4 * d) / (1.4 * d)
        min_pos = -L // 2
        scale = zeta ** (torch.arange(min_pos, L + min_pos, 1).float() / gamma)[:, None]  # (L, d/2)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d // 2) / (d // 2)))
        angles = torch.arange(0, L).float()[:, None] * inv_freq
        sin, cos = angles.sin(), angles.cos()
        if downscale:
            scale = 1 / scale
        sin, cos = (t.repeat_interleave(2, dim=-1) for t in (sin * scale, cos * scale))
        rotated = torch.stack((-x[:, 1::2], x[:, ::2]), dim=-1).flatten(-2)
        return x * cos + rotated * sin

    theirs = torchscale(q[0, 0], False) @ torchscale(k[0, 0], True).T
    assert torch.allclose(ours[0, 0], theirs, atol=1e-5)
    # through a cache: queries 8..11 against keys rotated when they were written give the
    # same logits
    q_late, _ = enc.rotate(q[..., 8:, :], k[..., 8:, :], Span(8, L), None)
    assert torch.allclose(q_late @ k2.transpose(-1, -2), ours[..., 8:, :], atol=1e-5)


# ---- FIRE against mcleish7/arithmetic's FIRE module --------------------------------------------
@pytest.mark.parametrize("threshold", [512.0, 5.0])
def test_fire_matches_the_reference(threshold: float) -> None:
    torch.manual_seed(0)
    enc = create_encoding("fire", n_heads=3, d_head=4, init_threshold=threshold)
    L = 12
    bias = enc.position_bias(
        Span(0, L), Span(0, L), LayerContext(0, None, None), torch.device("cpu")
    )
    # the reference's forward for seq_length L (positions 0..L-1, no random positions)
    positions = torch.arange(L).float()
    rel = positions[:, None] - positions[None, :]
    normaliser = torch.max(positions, torch.abs(enc.threshold_multiplier * enc.init_threshold))[
        :, None
    ]
    rel = torch.log(torch.abs(enc.c * rel) + 1)
    normaliser = torch.log(torch.abs(enc.c * normaliser) + 1)
    expected = enc.mlp((rel / (normaliser + 1e-6)).unsqueeze(-1)).permute(2, 0, 1)
    assert isinstance(bias, SegmentBias)  # square scores: segments for the kernel
    assert torch.allclose(bias.dense(), expected, atol=1e-5)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    assert torch.allclose(segments_dense(bias)[:, causal], expected[:, causal], atol=1e-5)
    # through a cache: the last 4 query rows alone
    tail = enc.position_bias(
        Span(8, L), Span(0, L), LayerContext(0, None, None), torch.device("cpu")
    )
    assert torch.allclose(tail, expected[:, 8:], atol=1e-5)


def test_fire_running_sums_keep_float32_accuracy() -> None:
    """In float32 the rows past the default threshold, running sums along 700 keys, stay within
    a few float32 roundings of the per-pair MLP in float64 (as close as the MLP run in float32)."""
    torch.manual_seed(0)
    enc = create_encoding("fire", n_heads=4, d_head=32)
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.normal_()
    span = Span(0, 700)
    bias = enc.position_bias(span, span, LayerContext(0, None, None), torch.device("cpu"))
    exact = _fire_per_pair(copy.deepcopy(enc).double(), span.arange(), span.arange())
    per_pair_float32 = _fire_per_pair(enc, span.arange(), span.arange()).double()
    causal = torch.ones(700, 700, dtype=torch.bool).tril()
    for fast, pairs in [(bias.dense(), slice(None)), (segments_dense(bias), causal)]:
        error = (fast.double() - exact)[:, pairs].abs().max()
        assert error <= 4 * (per_pair_float32 - exact).abs().max() + 1e-6
        assert error <= 1e-5 * exact.abs().max()


# ---- CoPE against the paper's reference module ------------------------------------------------
def test_cope_matches_the_papers_reference() -> None:
    torch.manual_seed(0)
    H, d, L, npos = 2, 8, 10, 6
    enc = create_encoding("cope", n_heads=H, d_head=d, n_layers=2, npos_max=npos)
    with torch.no_grad():
        enc.pos_emb.normal_()
    q, k = torch.randn(1, H, L, d), torch.randn(1, H, L, d)
    ctx = LayerContext(1, None, None)
    logits = enc.score(q, k, Span(0, L), Span(0, L), ctx).logits()
    # the reference: attn_logits = q k^T / sqrt(d) + log(mask); gates = sigmoid(attn_logits);
    # pos = reverse cumsum, clamp to npos - 1; interpolate q @ pos_emb at floor and ceil
    mask = torch.ones(L, L).tril()
    attn = q @ k.transpose(-1, -2) / math.sqrt(d) + mask.log()
    pos = torch.sigmoid(attn).flip(-1).cumsum(dim=-1).flip(-1).clamp(max=npos - 1)
    ints = q @ enc.pos_emb[1][None]
    w = pos - pos.floor()
    expected = (
        attn
        + ints.gather(-1, pos.ceil().long()) * w
        + ints.gather(-1, pos.floor().long()) * (1 - w)
    )
    seen = mask.bool()
    assert torch.allclose(logits[..., seen], expected[..., seen], atol=1e-5)


def _fire_per_pair(enc, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """FIRE's formula run through its MLP at every (query, key) pair: the math path."""
    threshold = torch.abs(enc.threshold_multiplier * enc.init_threshold)
    rows = q_positions.to(enc.c.dtype)
    relative = torch.log(torch.abs(enc.c * (rows[:, None] - k_positions.to(enc.c.dtype))) + 1)
    normaliser = torch.log(torch.abs(enc.c * torch.maximum(rows, threshold)) + 1)[:, None]
    return enc.mlp((relative / (normaliser + enc.eps))[..., None]).permute(2, 0, 1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "q_span, k_span",
    [
        (Span(0, 40), Span(0, 40)),
        (Span(30, 40), Span(0, 40)),  # through a cache
        (
            Span(
                0,
                24,
                torch.tensor(
                    sorted(
                        torch.randperm(300, generator=torch.Generator().manual_seed(4))[
                            :24
                        ].tolist()
                    )
                ),
            ),
            None,
        ),  # drawn positions
    ],
)
@pytest.mark.parametrize("c", [0.3, -0.2])
def test_fire_past_its_threshold_equals_the_mlp_per_pair(
    causal, q_span, k_span, c, monkeypatch
) -> None:
    """Rows past the threshold, summed along the keys from the hidden units' switching keys in
    blocks of 7 rows, give the MLP's values and gradients at every pair (float64, random
    weights of both signs, a positive and a negative c)."""
    monkeypatch.setattr(fire_module, "FIRE_ROWS", 7)
    k_span = k_span or q_span
    torch.manual_seed(0)
    enc = create_encoding("fire", n_heads=3, d_head=4, causal=causal, init_threshold=6.0)
    enc = enc.double()
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.normal_()
        enc.c.fill_(c)
    ctx = LayerContext(0, None, None)
    weights = torch.randn(3, len(q_span), len(k_span), dtype=torch.float64)
    params = [p for p in enc.parameters()]

    def run(bias: torch.Tensor) -> list[torch.Tensor]:
        return [bias, *torch.autograd.grad((bias * weights).sum(), params, allow_unused=True)]

    bias = enc.position_bias(q_span, k_span, ctx, torch.device("cpu"))
    fast = run(dense_bias(bias, len(q_span)))
    slow = run(_fire_per_pair(enc, q_span.arange(), k_span.arange()))
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    if isinstance(bias, SegmentBias):  # square scores: the segments give the causal pairs
        weights = weights.tril()
        by_segments = run(segments_dense(bias))
        by_pairs = run(_fire_per_pair(enc, q_span.arange(), k_span.arange()).tril())
        for a, b in zip(by_segments, by_pairs):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_fire_gives_segments_for_square_scores_only() -> None:
    enc = create_encoding("fire", n_heads=2, d_head=4)
    ctx, cpu = LayerContext(0, None, None), torch.device("cpu")
    assert isinstance(enc.position_bias(Span(3, 20), Span(3, 20), ctx, cpu), SegmentBias)
    assert isinstance(enc.position_bias(Span(8, 20), Span(0, 20), ctx, cpu), torch.Tensor)
    drawn = Span(0, 4, torch.tensor([0, 3, 5, 9]))
    assert isinstance(enc.position_bias(drawn, drawn, ctx, cpu), SegmentBias)
    other = Span(0, 4, torch.tensor([0, 3, 6, 9]))
    assert isinstance(enc.position_bias(drawn, other, ctx, cpu), torch.Tensor)
