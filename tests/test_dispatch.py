"""The one choice of attention kernel: an ordered list of backends, each saying why it refuses
a call; the first that serves runs it, and the choice with its reasons is recorded."""

from __future__ import annotations

import pytest
import torch
from helpers import small_model

from posbench.kernels import dispatch, native, served


def _decisions(model, tokens: torch.Tensor) -> dict:
    with served.recording() as record, torch.no_grad():
        model(tokens)
    return record.decisions


def _only(decisions: dict) -> tuple[str, dict[str, str]]:
    assert len(decisions) == 1, decisions
    ((backend, entry),) = decisions.items()
    return backend, entry["refused"]


def test_the_backends_are_tried_in_order_and_each_refusal_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(native, "built", lambda kernel: False)  # as where g++ is missing
    tokens = torch.randint(0, 11, (2, 160), generator=torch.Generator().manual_seed(0))
    backend, refused = _only(_decisions(small_model("alibi").eval(), tokens))
    assert backend == "posbench's blocked torch kernels"
    assert list(refused) == [b.name for b in dispatch.BACKENDS[:3]]
    assert "CUDA" in refused["torch flex_attention"]
    assert "not built here" in refused["C++ kernel, per-distance bias"]
    assert "not built here" in refused["C++ kernel"]
    # in float64 the CPU flash kernel refuses too: torch's SDPA serves it
    backend, refused = _only(_decisions(small_model("alibi").double().eval(), tokens))
    assert backend == "torch scaled_dot_product_attention"
    assert refused["posbench's blocked torch kernels"] == "needs the CPU and float32"


@pytest.mark.skipif(not native.built("band_flash"), reason="the C++ kernel is not built here")
def test_the_cpp_kernel_serves_causal_square_attention_and_a_cache_goes_elsewhere() -> None:
    tokens = torch.randint(0, 11, (2, 160), generator=torch.Generator().manual_seed(0))
    model = small_model("alibi").eval()
    backend, refused = _only(_decisions(model, tokens))
    assert backend == "C++ kernel, per-distance bias" and list(refused) == ["torch flex_attention"]
    backend, refused = _only(_decisions(small_model("nope").eval(), tokens))
    assert backend == "C++ kernel"
    assert refused["C++ kernel, per-distance bias"].startswith("the bias is not a function")
    cache = model.new_cache()
    with served.recording() as record, torch.no_grad():
        # the first segment reads an empty memory: square attention, the C++ kernel's; the
        # second reads a memory: another backend's
        for segment in torch.cat((tokens, tokens), dim=1).split(160, dim=1):
            model(segment, cache=cache)
    assert record.decisions["C++ kernel, per-distance bias"]["calls"] == 2  # one per layer
    reasons = [entry["refused"] for entry in record.decisions.values()]
    assert any(
        r.get("C++ kernel, per-distance bias", "").startswith("not causal square") for r in reasons
    ), record.decisions


def test_no_encoding_of_the_registry_names_a_kernel() -> None:
    """The encodings describe their scores; every kernel is the dispatcher's to choose."""
    import posbench.encodings as encodings
    from pathlib import Path

    folder = Path(encodings.__file__).parent
    for path in folder.glob("*.py"):
        text = path.read_text()
        assert "posbench.kernels" not in text, path.name
        assert "device.type" not in text, path.name


@pytest.mark.parametrize("options", [{}, {"clamp_len": 20}])
def test_off_the_cpu_txl_takes_its_unblocked_form_with_the_same_output(
    options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no kernel reads Transformer-XL's blocked tables (CUDA), torch's SDPA serves its
    fallback: q and k widened (or, with clamp_len, a gathered bias), the same output."""
    tokens = torch.randint(0, 11, (2, 48), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    import posbench

    model = (
        posbench.build_model(
            "txl", vocab_size=11, d_model=32, n_layers=2, n_heads=4, encoding_options=options
        )
        .double()
        .eval()
    )
    with torch.no_grad():
        blocked = model(tokens)
        monkeypatch.setattr(dispatch, "reads_blocked", lambda q: False)
        monkeypatch.setattr(native, "built", lambda kernel: False)
        with served.recording() as record:
            unblocked = model(tokens)
    assert set(record.decisions) == {"torch scaled_dot_product_attention"}
    torch.testing.assert_close(unblocked, blocked, rtol=1e-9, atol=1e-9)
