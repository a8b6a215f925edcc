"""The Transformer-XL memory: what it holds, the positions it reports, and stop-gradient."""

from __future__ import annotations

import math

import pytest
import torch

import posbench
from posbench.cache import Cache
from posbench.encodings.base import Span


def test_memory_length_is_a_whole_number_or_inf() -> None:
    """None means "no cache" everywhere in posbench, so a cache refuses it (and fractions)."""
    for bad in (None, -1, 2.5):
        with pytest.raises(ValueError, match="math.inf for a memory that keeps every position"):
            Cache(n_layers=1, mem_len=bad)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("mem_len", [math.inf, 0, 3, 8])
def test_memory_holds_the_newest_positions(grad: bool, mem_len: float) -> None:
    cache = Cache(n_layers=1, mem_len=mem_len)
    seen = 0
    for n in (5, 1, 1, 4, 2):
        k = torch.arange(seen, seen + n, dtype=torch.float32).view(1, 1, n, 1).requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            k_all, _, span = cache.extend(0, k, k.detach().clone())
        held_before = span.stop - n - span.start
        assert span == Span(seen - held_before, seen + n)
        assert k_all[0, 0, :, 0].tolist() == list(
            range(span.start, span.stop)
        )  # keys are their positions
        cache.advance(n)
        seen += n
        expected_held = min(mem_len, seen)
        assert cache.held() == expected_held
        assert k_all.requires_grad == grad


def test_stop_gradient_at_the_memory() -> None:
    torch.manual_seed(0)
    model = posbench.build_model("txl", vocab_size=7, d_model=16, n_layers=2, n_heads=2)
    cache = model.new_cache(mem_len=4)
    model(torch.randint(0, 7, (2, 4)), cache=cache)
    first = model.blocks[0].attn.qkv.weight
    out = model(torch.randint(0, 7, (2, 4)), cache=cache)
    out.sum().backward()  # succeeds although the first segment's graph is gone
    assert first.grad is not None and cache.seen == 8


def test_mem_len_zero_keeps_counting_positions() -> None:
    model = posbench.build_model(
        "learned",
        vocab_size=7,
        d_model=16,
        n_layers=1,
        n_heads=2,
        encoding_options={"max_positions": 6},
    )
    cache = model.new_cache(mem_len=0)
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long), cache=cache)
        assert cache.held() == 0 and cache.seen == 4
        with pytest.raises(posbench.PosbenchError, match="0..5"):
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("mem_len", [0, 3, 5, 7, math.inf])
@pytest.mark.parametrize("encoding", ["rope", "txl", "alibi"])
def test_a_memory_resumed_from_one_pass_holds_what_reading_in_segments_holds(
    encoding: str, mem_len: float
) -> None:
    """Until a memory first drops a token, reading in segments and reading the whole stream
    in one pass give the same keys and values: the memory resumed from the one pass holds
    exactly what the segments' memory holds there, of every sequence or of some."""
    from posbench.experiment.evaluation import first_dropped

    torch.manual_seed(0)
    model = posbench.build_model(encoding, 11, 16, 2, 2).double().eval()
    tokens = torch.randint(0, 11, (3, 24), generator=torch.Generator().manual_seed(1))
    segment = 5
    cut = int(min(first_dropped(mem_len, segment), 20))
    whole = model.new_cache()
    with torch.no_grad():
        model(tokens, cache=whole)
        read = model.new_cache(mem_len)
        for start in range(0, cut, segment):
            model(tokens[:, start : start + segment], cache=read)
    rows = torch.tensor([2, 0])
    for resumed, which in (
        (whole.resumed(mem_len, cut), slice(None)),
        (whole.resumed(mem_len, cut, rows), rows),
    ):
        assert resumed.seen == read.seen == cut
        for layer in range(2):
            assert resumed.held(layer) == read.held(layer)
            for mine, theirs in ((resumed._keys, read._keys), (resumed._values, read._values)):
                torch.testing.assert_close(mine[layer].view(), theirs[layer].view()[which])


def test_only_an_unbounded_memory_that_has_read_far_enough_resumes() -> None:
    model = posbench.build_model("rope", 11, 16, 1, 2).eval()
    tokens = torch.randint(0, 11, (2, 8))
    bounded, whole = model.new_cache(4), model.new_cache()
    with torch.no_grad():
        model(tokens, cache=bounded)
        model(tokens, cache=whole)
    with pytest.raises(ValueError, match="unbounded one that has read at least 8"):
        bounded.resumed(2, 8)
    with pytest.raises(ValueError, match="has read 8"):
        whole.resumed(2, 9)
