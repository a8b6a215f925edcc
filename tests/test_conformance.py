"""Every registered encoding, built-in or plugin, passes every conformance check."""

from __future__ import annotations

import pytest

import posbench
from posbench.testing import CHECKS

ENCODINGS = posbench.list_encodings()
# Non-default options whose code paths need the same guarantees.
VARIANTS = [
    ("txl", {"clamp_len": 5}),
    ("txl", {"share_uv": True, "scale": False}),
    ("t5", {"per_layer": True, "num_buckets": 8, "max_distance": 16}),
    ("t5", {"num_buckets": 4, "max_distance": 6, "randomize_positions": 64}),  # drawn band
    ("deberta", {"position_buckets": 8, "span": 16}),
    ("deberta", {"share_att_key": True, "span": 4}),
    ("deberta", {"span": 4, "randomize_positions": 64}),  # drawn band
    ("deberta", {"span": 12, "position_buckets": 4, "randomize_positions": 64}),
    ("alibi", {"symmetric": True}),
    ("rope", {"base": 500.0, "scaling": "linear", "factor": 2.0}),
    ("rope", {"scaling": "ntk", "factor": 4.0}),
    ("rope", {"scaling": "yarn", "factor": 4.0, "original_length": 8}),
    ("rope", {"scaling": "llama3", "factor": 8.0, "original_length": 16}),
    ("rope", {"scaling": "dynamic", "factor": 2.0, "original_length": 8}),
    ("rope", {"rotary_fraction": 0.25}),
    ("rope", {"keep_frequencies": 0.5}),
    ("learned", {"max_positions": 30}),
    ("fire", {"init_threshold": 4.0}),  # rows past the threshold: per pair, recomputed blocks
]


def test_builtins_are_exactly_the_encodings_posbench_registers() -> None:
    """BUILTINS (the order `posbench list` and reports use) names every encoding a posbench
    module registers, once, and nothing else."""
    from posbench.encodings import BUILTINS, REGISTRY

    own = {
        n for n in REGISTRY.names() if REGISTRY.get(n).__module__.startswith("posbench.encodings.")
    }
    assert len(BUILTINS) == len(set(BUILTINS))
    assert set(BUILTINS) == own


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_conformance(encoding: str, check: str) -> None:
    CHECKS[check](encoding)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize(
    "encoding,options", VARIANTS, ids=[f"{e}-{sorted(o)}" for e, o in VARIANTS]
)
def test_conformance_variants(encoding: str, options: dict, check: str) -> None:
    CHECKS[check](encoding, **options)


def test_a_parameter_without_a_real_gradient_is_caught_not_passed_by_round_off() -> None:
    from pathlib import Path

    from posbench.plugins import load_plugin_dir
    from posbench.testing import check_shapes_and_gradients

    load_plugin_dir(Path("tests/plugins"))
    with pytest.raises(AssertionError, match="parameter encoding.offset has no real gradient"):
        check_shapes_and_gradients("test_row_constant")


def test_a_decoding_path_that_drifts_from_the_whole_is_caught_at_the_attention_logits() -> None:
    """A 10% error in one query's bias moves the tiny model's output logits by less than the
    model-level check resolves when the learned term is small (as learned position terms
    start); the attention-logit comparison sees it."""
    from pathlib import Path

    from posbench.plugins import load_plugin_dir
    from posbench.testing import check_chunked_equals_whole

    load_plugin_dir(Path("tests/plugins"))
    with pytest.raises(AssertionError, match="attention logits of queries 1..1 against the keys"):
        check_chunked_equals_whole("test_decode_drift")


def test_checks_at_the_logits_draw_zero_initialised_parameters_and_keep_the_rest() -> None:
    """CoPE's position embeddings start at zero, which would make its position term vanish
    from every comparison of logits; T5's table starts small but non-zero and is kept."""
    import torch

    from posbench.encodings import create_encoding
    from posbench.testing import logit_encoding

    assert create_encoding("cope", n_heads=4, d_head=8, n_layers=1).pos_emb.abs().max() == 0
    assert logit_encoding("cope").pos_emb.std() > 0.4
    torch.manual_seed(0)
    fresh = create_encoding("t5", n_heads=4, d_head=8, causal=True, n_layers=1)
    assert torch.equal(logit_encoding("t5").state_dict()["tables.0.weight"], fresh.tables[0].weight)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_conformance_with_randomized_positions(encoding: str, check: str) -> None:
    """Randomized positions are an option of every encoding, plugins included: every check
    holds with them too (training and evaluation both draw here)."""
    CHECKS[check](encoding, randomize_positions=64)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("encoding", ["rope", "learned", "t5"])
def test_conformance_with_randomized_positions_evaluated_plain(encoding: str, check: str) -> None:
    CHECKS[check](encoding, randomize_positions=40, eval_positions="plain")


def test_a_relative_declaration_over_absolute_embeddings_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Evaluation reads a relative encoding's memory of 0 as each segment read alone; an
    encoding that adds absolute position embeddings yet declares relative = True would get
    wrong numbers there, and the kit says so."""
    from posbench.encodings import REGISTRY
    from posbench.encodings.sinusoidal import Sinusoidal
    from posbench.testing import check_shift_invariance

    class Mislabelled(Sinusoidal):
        relative = True

    monkeypatch.setitem(REGISTRY._entries, "test_mislabelled", Mislabelled)
    with pytest.raises(AssertionError, match="declares relative = True, but a segment read after"):
        check_shift_invariance("test_mislabelled")
