"""torch.compile takes posbench's models whole: the C++ kernels are torch operators
(posbench::band_attention, posbench::cope_attention, each with its backward and its shapes for
tracing), so a model that uses them compiles into one graph (fullgraph: any graph break fails)
and gives the eager model's outputs and gradients (FIRE's rows too: its segments have a shape
fixed by its width, wherever its learned threshold falls)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend

import posbench
from posbench.encodings import REGISTRY
from posbench.kernels import native, served

from helpers import assert_close_to_scale

#: Long enough that every encoding's attention goes to a C++ kernel where it is built.
LENGTH = 128
#: Encodings whose forward pass reads a shape off a tensor's value, and why (none today).
DATA_DEPENDENT: dict[str, str] = {}
OPERATORS = {"posbench.band_attention.default", "posbench.cope_attention.default"}


def _compiled_graph_targets(model: torch.nn.Module, tokens: torch.Tensor) -> tuple:
    """The compiled model's output, its parameters' gradients and the operators in its graph."""
    targets: set[str] = set()

    def recording(graph: torch.fx.GraphModule, inputs: list) -> object:
        targets.update(str(n.target) for n in graph.graph.nodes if n.op == "call_function")
        return lookup_backend("aot_eager")(graph, inputs)  # traces the backward pass too

    torch._dynamo.reset()
    out = torch.compile(model, fullgraph=True, backend=recording)(tokens)
    out.sum().backward()
    return out, [p.grad for p in model.parameters() if p.grad is not None], targets


@pytest.mark.skipif(not native.built("band_flash"), reason="no C++ kernel can be built here")
@pytest.mark.parametrize("name", REGISTRY.names())
def test_a_model_compiles_whole_with_the_kernels_as_operators(name: str) -> None:
    if name in DATA_DEPENDENT:
        pytest.xfail(DATA_DEPENDENT[name])
    model = posbench.build_model(name, vocab_size=11, d_model=32, n_layers=1, n_heads=4)
    tokens = torch.randint(0, 11, (2, LENGTH))
    with served.recording() as counts:
        eager = model(tokens)
    eager.sum().backward()
    expected = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    out, gradients, targets = _compiled_graph_targets(model, tokens)
    assert_close_to_scale(out, eager, 1e-5, "logits")
    for got, want in zip(gradients, expected, strict=True):
        assert_close_to_scale(got, want, 1e-5, "gradient")
    native_calls = counts[served.CPP_BAND] + counts[served.CPP_COPE]
    assert bool(targets & OPERATORS) == bool(native_calls), (targets & OPERATORS, dict(counts))
