"""The score-term probe, its health rules, and attention mass by distance."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn
from torch.nn.functional import softplus

import posbench
from posbench.encodings.base import PositionalEncoding
from posbench.experiment.diagnostics import (
    attention_by_distance,
    health_flags,
    layer_queries_and_keys,
    term_rows,
)
from posbench.kernels.masks import causal_mask


def _stats(values: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    seen = values.expand(2, 2, *mask.shape)[..., mask]
    return float(seen.mean()), float(seen.std())


def test_transformer_xl_terms_equal_an_explicit_four_term_computation() -> None:
    torch.manual_seed(0)
    model = posbench.build_model("txl", vocab_size=11, d_model=16, n_layers=2, n_heads=2)
    tokens = torch.randint(0, 11, (2, 7))
    rows = pd.DataFrame(term_rows(model, tokens, step=3))
    enc, d, L = model.encoding, 8, 7
    mask = causal_mask(L, L, torch.device("cpu"))
    with torch.no_grad():
        for layer, q, k, span, ctx in layer_queries_and_keys(model, tokens):
            rel = (
                (torch.arange(L)[:, None] - torch.arange(L)[None, :]).clamp(min=0).double()
            )  # (L, L)
            inv_freq = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)  # d_model 16
            angles = rel[..., None] * inv_freq  # (L, L, 8)
            R = torch.cat((angles.sin(), angles.cos()), dim=-1).float()  # (L, L, 16): [sin | cos]
            WR = (R @ enc.w_kr[layer].weight.T).view(L, L, 2, d)  # (L, L, H, d)
            u, v = enc.u[layer], enc.v[layer]
            explicit = {
                "a content": q @ k.transpose(-1, -2) / math.sqrt(d),
                "b content-position": torch.einsum("bhid,ijhd->bhij", q, WR) / math.sqrt(d),
                "c content bias": torch.einsum("hd,bhjd->bhj", u, k)[:, :, None, :].expand(
                    2, 2, L, L
                )
                / math.sqrt(d),
                "d position bias": torch.einsum("hd,ijhd->hij", v, WR)[None].expand(2, 2, L, L)
                / math.sqrt(d),
            }
            total = enc.score(q, k, span, span, ctx).logits()
            assert torch.allclose(sum(explicit.values())[..., mask], total[..., mask], atol=1e-5)
            for name, values in explicit.items():
                row = rows[(rows["layer"] == layer) & (rows["term"] == name)].iloc[0]
                mean, std = _stats(values, mask)
                assert row["mean"] == pytest.approx(mean, abs=1e-6) and row["std"] == pytest.approx(
                    std, rel=1e-4
                )
                assert row["learns"] and row["step"] == 3


@pytest.mark.parametrize("name", posbench.list_encodings())
def test_every_encodings_terms_sum_to_its_logits(name: str) -> None:
    torch.manual_seed(0)
    model = posbench.build_model(name, vocab_size=11, d_model=16, n_layers=1, n_heads=2)
    tokens = torch.randint(0, 11, (2, 9))
    mask = causal_mask(9, 9, torch.device("cpu"))
    with torch.no_grad():
        for _, q, k, span, ctx in layer_queries_and_keys(model, tokens):
            terms = model.encoding.score_terms(q, k, span, span, ctx)
            total = model.encoding.score(q, k, span, span, ctx).logits()
            assert torch.allclose(
                sum(terms.values()).expand_as(total)[..., mask], total[..., mask], atol=1e-5
            )
    rows = term_rows(model, tokens, step=0)
    assert all(0 <= r["mass_moved"] <= 1 for r in rows)


class Detached(PositionalEncoding):
    """A broken position term: a learned slope whose gradient is cut."""

    relative = True

    def __init__(self, shape) -> None:
        super().__init__(shape)
        self.raw_slope = nn.Parameter(torch.zeros(shape.n_heads))

    def position_bias(self, q_span, k_span, layer, device):
        distance = self.relative_positions(q_span, k_span, device).abs().float()
        return -softplus(self.raw_slope).detach()[:, None, None] * distance  # the bug: .detach()


class Silent(Detached):
    """A position term that is exactly zero."""

    def position_bias(self, q_span, k_span, layer, device):
        return (
            0.0
            * self.raw_slope[:, None, None]
            * self.relative_positions(q_span, k_span, device).float()
        )


def _model_with(encoding: PositionalEncoding) -> posbench.Decoder:
    config = posbench.ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2)
    return posbench.Decoder(config, encoding)


def test_health_rules_flag_a_detached_position_term_and_a_zero_one() -> None:
    shape = posbench.AttentionShape(n_heads=2, d_head=8)
    tokens = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(0))
    broken = pd.DataFrame(term_rows(_model_with(Detached(shape)), tokens, step=1))
    flags = health_flags(broken, "detached", has_parameters=True)
    assert (
        "detached layer 0: term 'position' receives no gradient at step 1 although the encoding "
        "has "
        "trainable parameters: its gradient flow is broken"
    ) in flags
    zero = health_flags(
        pd.DataFrame(term_rows(_model_with(Silent(shape)), tokens, step=1)), "silent", True
    )
    assert zero == [
        "silent layer 0: term 'position' is all zero at step 1: its gradient flow is broken"
    ]
    healthy = pd.DataFrame(
        term_rows(
            posbench.build_model("t5", vocab_size=11, d_model=16, n_layers=1, n_heads=2), tokens, 1
        )
    )
    assert health_flags(healthy, "t5", has_parameters=True) == []


def test_health_rules_flag_a_term_orders_of_magnitude_below_the_rest() -> None:
    rows = pd.DataFrame(
        [
            {
                "step": 200,
                "layer": 1,
                "term": "a content",
                "mean": 0.0,
                "std": 3.0,
                "mass_moved": 0.5,
                "learns": True,
            },
            {
                "step": 200,
                "layer": 1,
                "term": "d position bias",
                "mean": 0.0,
                "std": 0.01,
                "mass_moved": 0.0,
                "learns": True,
            },
        ]
    )
    assert health_flags(rows, "txl", True) == [
        "txl layer 1: term 'd position bias' is 300x below 'a content' at step 200: check its "
        "projection's init or the learning rate"
    ]


def test_attention_mass_by_distance_sums_to_one_and_follows_the_bias() -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 11, (2, 12))
    for name in ("nope", "alibi", "rope"):
        mass = attention_by_distance(
            posbench.build_model(name, vocab_size=11, d_model=16, n_layers=1, n_heads=2), tokens
        )
        assert mass.shape == (12,) and float(mass.sum()) == pytest.approx(1.0, abs=1e-5)
    uniform = attention_by_distance(
        posbench.build_model(
            "nope", vocab_size=11, d_model=16, n_layers=1, n_heads=2, encoding_options={}
        ),
        tokens,
    )
    # an untrained NoPE model attends almost uniformly: mass at d = mean over queries of
    # 1/(i+1) for i >= d
    expected = torch.tensor([sum(1 / (i + 1) for i in range(d, 12)) / 12 for d in range(12)])
    assert torch.allclose(uniform, expected, atol=0.01)
    steep = posbench.build_model("alibi", vocab_size=11, d_model=16, n_layers=1, n_heads=2)
    steep.encoding.slopes.fill_(50.0)  # a bias so steep that every query sees only itself
    assert float(attention_by_distance(steep, tokens)[0]) == pytest.approx(1.0, abs=1e-3)
