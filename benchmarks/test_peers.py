"""posbench's attention layer against the same encoding in peer libraries, same shapes, same
run: x-transformers (rotary, ALiBi, T5 relative bias) and Hugging Face transformers (T5Attention,
DeBERTa-v2 DisentangledSelfAttention). Install them with `pip install -e '.[peers]'`; a peer that
is not installed is skipped with a message. Goal: posbench faster (ratio < 1)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from posbench.experiment.config import EncodingSpec
from posbench.experiment.profiling import BenchConfig, _layer

B, H, D_HEAD, L = 8, 4, 32, 1024
D_MODEL = H * D_HEAD
CONFIG = BenchConfig(
    batch_size=B, n_heads=H, d_head=D_HEAD, threads=torch.get_num_threads(), min_run_time=0.5
)


def need(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason=f"peer '{module}' is not installed: pip install -e '.[peers]'",
    )


def causal_additive_mask() -> torch.Tensor:
    return torch.zeros(L, L).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))[
        None, None
    ]


def x_transformers_layer(**flags):
    from x_transformers import Decoder

    flash = not flags.get("rel_pos_bias")  # x-transformers refuses flash with T5's bias
    return Decoder(
        dim=D_MODEL,
        depth=1,
        heads=H,
        attn_dim_head=D_HEAD,
        custom_layers=("a",),
        attn_flash=flash,
        **flags,
    )


def hf_t5():
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(
        d_model=D_MODEL,
        d_kv=D_HEAD,
        num_heads=H,
        is_decoder=True,
        dropout_rate=0.0,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
    )
    attention = T5Attention(config, has_relative_attention_bias=True)
    mask = causal_additive_mask()
    return lambda x: attention(x, mask=mask)[0]


def hf_deberta():
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

    config = DebertaV2Config(
        hidden_size=D_MODEL,
        num_attention_heads=H,
        relative_attention=True,
        pos_att_type=["c2p", "p2c"],
        max_relative_positions=64,
        position_buckets=0,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )
    attention = DisentangledSelfAttention(config)
    rel_embeddings = torch.nn.Parameter(torch.randn(2 * 64, D_MODEL) * 0.02)
    mask = torch.ones(L, L, dtype=torch.bool).tril()[None, None].expand(B, 1, L, L)
    return lambda x: attention(x, mask, rel_embeddings=rel_embeddings)[0]


PEERS = [
    pytest.param(
        "rope",
        lambda: x_transformers_layer(rotary_pos_emb=True),
        marks=need("x_transformers"),
        id="x-transformers-rotary",
    ),
    pytest.param(
        "alibi",
        lambda: x_transformers_layer(alibi_pos_bias=True),
        marks=need("x_transformers"),
        id="x-transformers-alibi",
    ),
    pytest.param(
        "t5",
        lambda: x_transformers_layer(rel_pos_bias=True),
        marks=need("x_transformers"),
        id="x-transformers-t5",
    ),
    pytest.param("t5", hf_t5, marks=need("transformers"), id="hf-T5Attention"),
    pytest.param("deberta", hf_deberta, marks=need("transformers"), id="hf-DeBERTa-v2"),
]


@pytest.mark.parametrize("encoding,make_peer", PEERS)
def test_posbench_against_peer(
    benchmark, record_goal, interleaved_ratio, request, encoding: str, make_peer
) -> None:
    torch.manual_seed(0)
    peer = make_peer()
    ours = _layer(EncodingSpec(encoding), CONFIG)
    x = torch.randn(B, L, D_MODEL)
    out = peer(x)
    assert out.shape == (B, L, D_MODEL)

    def ours_step() -> None:
        ours(x).sum().backward()

    def peer_step() -> None:
        peer(x).sum().backward()

    ratio = interleaved_ratio(ours_step, peer_step, CONFIG)
    record_goal(f"posbench {encoding} / {request.node.callspec.id}, fwd+bwd L={L}", ratio, 1.0)
    benchmark.pedantic(ours_step, rounds=3, iterations=1)
