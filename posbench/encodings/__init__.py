"""The encoding registry and the built-in encodings (each registered in its own module)."""
from __future__ import annotations

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.kernels.bias_types import BandBias, Scores
from posbench.encodings.registry import REGISTRY, register_encoding


def list_encodings(pattern: str | None = None) -> list[str]:
    """Names of the registered encodings, built-ins and plugins, optionally wildcard-filtered."""
    return REGISTRY.names(pattern)


def create_encoding(
    name: str, n_heads: int, d_head: int, causal: bool = True, n_layers: int = 1, **options: object
) -> PositionalEncoding:
    """Build encoding `name` for attention with `n_heads` heads of size `d_head`."""
    return REGISTRY.create(name, AttentionShape(n_heads, d_head, causal, n_layers), **options)  # type: ignore[return-value]


#: The built-in encodings, in the order sweeps and reports show them.
BUILTINS = ("sinusoidal", "learned", "nope", "txl", "t5", "deberta", "alibi", "rope", "kerple_log", "kerple_power",
            "sandwich", "xpos", "fire", "cope")

# Built-ins register themselves on import; the order here is the order `posbench list` shows.
from posbench.encodings import (  # noqa: E402,F401
    alibi,
    cope,
    deberta,
    fire,
    kerple,
    learned,
    nope,
    rope,
    sandwich,
    sinusoidal,
    t5,
    txl,
    xpos,
)

__all__ = [
    "BUILTINS",
    "REGISTRY",
    "AttentionShape",
    "LayerContext",
    "PositionalEncoding",
    "Scores",
    "Span",
    "create_encoding",
    "list_encodings",
    "register_encoding",
]
