"""Which attention kernel served each call: counted per thread while a run records, so a run's
result says what computed its numbers (posbench's C++ kernels or torch's), not only what was
available when it started, and its env.json which backend the dispatcher chose and why each
earlier one refused. The C++ and torch kernels agree to float round-off, not bit for bit."""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import torch

#: The kernels a call can be served by, as results name them.
CPP_BAND = "C++ band kernel"
CPP_COPE = "C++ CoPE kernel"
TORCH_FLASH = "posbench's flash kernel in torch"
TORCH_COPE = "CoPE in torch, blocks of rows"
TORCH_SDPA = "torch scaled_dot_product_attention"
TORCH_UNFUSED = "torch matmul, softmax and matmul"
FLEX = "torch flex_attention"

_local = threading.local()


def note(kernel: str) -> None:
    """Count one attention call served by `kernel` (nothing while no run records, nor inside a
    graph torch.compile traces: a compiled model runs its kernels without Python around them)."""
    if torch.compiler.is_compiling():
        return
    counts = getattr(_local, "counts", None)
    if counts is not None:
        counts[kernel] += 1


class Record(Counter):
    """Attention calls by kernel, and `decisions`: per backend posbench.kernels.dispatch chose,
    how many calls it served and why each earlier backend refused the first of them."""

    def __init__(self) -> None:
        super().__init__()
        self.decisions: dict[str, dict[str, Any]] = {}


def decided(backend: str, refused: dict[str, str]) -> None:
    """Record that `backend` served one call, the earlier backends refusing it for `refused`
    (nothing while no run records, nor inside a graph torch.compile traces)."""
    if torch.compiler.is_compiling():
        return
    record = getattr(_local, "counts", None)
    if record is not None:
        entry = record.decisions.setdefault(backend, {"calls": 0, "refused": dict(refused)})
        entry["calls"] += 1


@contextmanager
def recording() -> Iterator[Record]:
    """Count the attention calls this thread makes inside the block, by kernel, and record the
    dispatcher's choices."""
    outer = getattr(_local, "counts", None)
    _local.counts = Record()
    try:
        yield _local.counts
    finally:
        _local.counts = outer
