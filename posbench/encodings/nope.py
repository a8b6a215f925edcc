"""NoPE: no positional signal; causal masking alone (Kazemnejad et al. 2023)."""

from __future__ import annotations

from posbench.encodings.registry import register_encoding
from posbench.encodings.base import PositionalEncoding


@register_encoding("nope")
class NoPE(PositionalEncoding):
    """No positional encoding: attention sees order only through the causal mask."""

    relative = True
    reads_positions = False
