"""The encoding registry and the built-in encodings (each registered in its own module)."""
from __future__ import annotations

from posbench.encodings.base import BandBias, LayerContext, PositionalEncoding, Scores, Span
from posbench.registry import Registry


def _load_plugins() -> None:
    from posbench.plugins import load_plugins

    load_plugins()


REGISTRY: Registry[type[PositionalEncoding]] = Registry("encoding", before_lookup=_load_plugins)


def register_encoding(name: str):
    """Class decorator: make an encoding available as `name` everywhere in posbench."""
    return REGISTRY.register(name)


def list_encodings(pattern: str | None = None) -> list[str]:
    """Names of the registered encodings, built-ins and plugins, optionally wildcard-filtered."""
    return REGISTRY.names(pattern)


def create_encoding(
    name: str, n_heads: int, d_head: int, causal: bool = True, n_layers: int = 1, **options: object
) -> PositionalEncoding:
    """Build encoding `name` for attention with `n_heads` heads of size `d_head`."""
    return REGISTRY.create(name, n_heads, d_head, causal, n_layers, **options)  # type: ignore[return-value]


#: The built-in encodings, in the order sweeps and reports show them.
BUILTINS = ("sinusoidal", "learned", "nope", "txl", "t5", "deberta", "alibi", "rope")

# Built-ins register themselves on import; the order here is the order `posbench list` shows.
from posbench.encodings import (  # noqa: E402,F401
    alibi,
    deberta,
    learned,
    nope,
    rope,
    sinusoidal,
    t5,
    txl,
)

__all__ = [
    "BUILTINS",
    "REGISTRY",
    "LayerContext",
    "PositionalEncoding",
    "Scores",
    "Span",
    "create_encoding",
    "list_encodings",
    "register_encoding",
]
