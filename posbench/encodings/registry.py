"""The encoding registry: built-ins register themselves on import, plugins through
`register_encoding` (kept apart from the package's __init__ so no module imports its own
package)."""

from __future__ import annotations

from typing import Callable, TypeVar

from posbench.encodings.base import PositionalEncoding
from posbench.registry import Registry

E = TypeVar("E", bound=type)

REGISTRY: Registry[type[PositionalEncoding]] = Registry("encoding", PositionalEncoding)


def register_encoding(name: str) -> Callable[[E], E]:
    """Class decorator: make an encoding available as `name` everywhere in posbench."""
    return REGISTRY.register(name)  # type: ignore[return-value]
