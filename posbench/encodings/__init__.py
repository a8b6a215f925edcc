"""The encoding registry and the built-in encodings (each registered in its own module)."""

from __future__ import annotations

import inspect
from typing import Mapping

from posbench.encodings.base import (
    AttentionShape,
    IndexedTable,
    LayerContext,
    PositionalEncoding,
    Span,
)
from posbench.encodings.positions import RandomPositions, random_positions_from
from posbench.errors import OptionError
from posbench.registry import check_options
from posbench.bias_kinds import (
    BandBias,
    DistanceTableBias,
    KeyTableBias,
    RowBlockBias,
    Scores,
    SegmentBias,
    ToeplitzBias,
)
from posbench.encodings.registry import REGISTRY, register_encoding


def list_encodings(pattern: str | None = None) -> list[str]:
    """Names of the registered encodings, built-ins and plugins, optionally wildcard-filtered."""
    return REGISTRY.names(pattern)


#: Options every encoding accepts (randomized positions), handled here, not by its constructor.
SHARED_OPTIONS = tuple(inspect.signature(random_positions_from).parameters)


def check_encoding_options(
    name: str, options: Mapping[str, object], what: str
) -> RandomPositions | None:
    """Raise OptionError for an option encoding `name` does not accept or a value out of its
    declared range, its own options and the shared ones alike; returns the randomized
    positions the shared options ask for (None: plain positions)."""
    check_options(REGISTRY.get(name), dict(options), what, shared=SHARED_OPTIONS)
    shared = {k: v for k, v in options.items() if k in SHARED_OPTIONS}
    check_options(random_positions_from, shared, what)
    return random_positions_from(**shared)  # type: ignore[arg-type]


def create_encoding(
    name: str, n_heads: int, d_head: int, causal: bool = True, n_layers: int = 1, **options: object
) -> PositionalEncoding:
    """Build encoding `name` for attention with `n_heads` heads of size `d_head`; the shared
    options (``randomize_positions``, ``eval_positions``) apply to any encoding."""
    what = f"encoding {name!r}"
    drawn = check_encoding_options(name, options, what)
    own = {k: v for k, v in options.items() if k not in SHARED_OPTIONS}
    encoding: PositionalEncoding = REGISTRY.create(
        name, AttentionShape(n_heads, d_head, causal, n_layers), **own
    )  # type: ignore[assignment]
    if drawn is not None:
        if encoding.max_positions is not None and drawn.max_position > encoding.max_positions:
            raise OptionError(
                f"{what} represents positions 0..{encoding.max_positions - 1} only, but "
                "randomize_positions = "
                f"{drawn.max_position} draws up to {drawn.max_position - 1}; lower it or raise "
                "max_positions."
            )
        encoding.random_positions = drawn
    return encoding


#: The built-in encodings, in the order sweeps and reports show them.
BUILTINS = (
    "sinusoidal",
    "learned",
    "nope",
    "txl",
    "t5",
    "deberta",
    "alibi",
    "rope",
    "kerple_log",
    "kerple_power",
    "sandwich",
    "xpos",
    "fire",
    "cope",
)

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
    "SHARED_OPTIONS",
    "RandomPositions",
    "check_encoding_options",
    "REGISTRY",
    "AttentionShape",
    "IndexedTable",
    "LayerContext",
    "PositionalEncoding",
    "Scores",
    "Span",
    "create_encoding",
    "list_encodings",
    "register_encoding",
]
