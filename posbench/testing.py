"""Conformance kit: checks every encoding and every task must pass. Public, so plugin authors
can run it.

Each ``check_*`` takes an encoding name (built-in or plugin) and its options, builds a tiny
decoder, and raises AssertionError with a precise message when the encoding misbehaves;
``run_task_conformance`` does the same for a task::

    from posbench.testing import run_conformance, run_task_conformance
    run_conformance("my_encoding", my_option=3)
    run_task_conformance("my_task", n_symbols=8)
"""

from __future__ import annotations

import math

import fnmatch

from typing import Any, Callable

import torch
from torch import Tensor

from posbench.kernels.masks import causal_mask
from posbench.encodings import REGISTRY, create_encoding
from posbench.encodings.base import LayerContext, PositionalEncoding, Span
from posbench.encodings.positions import seeded_draws
from posbench.errors import PositionOutOfRangeError
from posbench.model import Decoder, build_model
from posbench.tasks import create_task
from posbench.tasks.base import IGNORE

VOCAB = 13
SEQ_LEN = 24


def tiny_model(encoding: str, seed: int = 0, **options: Any) -> Decoder:
    """A 2-layer, 4-head, d_model=32 decoder, seeded."""
    torch.manual_seed(seed)
    return build_model(
        encoding, vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, encoding_options=options
    )


def _tokens(batch: int = 2, length: int = SEQ_LEN, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


#: A gradient this far below the largest one, in float64, is round-off of a true zero.
ZERO_GRADIENT = 1e-10


def check_shapes_and_gradients(encoding: str, **options: Any) -> None:
    """Logits are (B, L, V) and finite; every parameter gets a finite gradient that is truly
    non-zero: measured in float64 against the largest gradient, so round-off cannot pass for
    one. Parameters an encoding declares in ``gradient_free`` (with the reason in its
    docstring) must instead get none."""
    model = tiny_model(encoding, **options)
    tokens = _tokens()
    logits = model(tokens)
    assert logits.shape == (2, SEQ_LEN, VOCAB), f"{encoding}: logits shape {tuple(logits.shape)}"
    assert torch.isfinite(logits).all(), f"{encoding}: non-finite logits"
    model = model.double()
    model(tokens).logsumexp(-1).mean().backward()
    grads = {name: param.grad for name, param in model.named_parameters()}
    largest = max(float(g.abs().max()) for g in grads.values() if g is not None)
    gradient_free = getattr(model.encoding, "gradient_free", ())
    for name, grad in grads.items():
        assert grad is not None, f"{encoding}: parameter {name} received no gradient"
        assert torch.isfinite(grad).all(), f"{encoding}: non-finite gradient in {name}"
        size = float(grad.abs().max())
        if any(
            fnmatch.fnmatchcase(name.removeprefix("encoding."), pattern)
            for pattern in gradient_free
        ):
            assert size <= ZERO_GRADIENT * largest, (
                f"{encoding}: {name} is declared gradient-free but gets {size:.3g}"
            )
        else:
            assert size > ZERO_GRADIENT * largest, (
                f"{encoding}: parameter {name} has no real gradient ({size:.3g} against "
                f"{largest:.3g}); "
                "fix its gradient flow or declare it in gradient_free with the reason"
            )


def check_causality(encoding: str, **options: Any) -> None:
    """Changing tokens after position t leaves the logits up to t unchanged."""
    model = tiny_model(encoding, **options).eval()
    tokens = _tokens()
    changed = tokens.clone()
    cut = SEQ_LEN // 2
    changed[:, cut:] = (changed[:, cut:] + 1) % VOCAB
    with torch.no_grad(), seeded_draws(0):
        a = model(tokens)
    with torch.no_grad(), seeded_draws(0):  # drawn positions, if any: the same for both
        b = model(changed)
    diff = (a[:, :cut] - b[:, :cut]).abs().max().item()
    assert diff < 1e-6, f"{encoding}: future tokens changed earlier logits by {diff:.2e}"


def check_chunked_equals_whole(
    encoding: str, chunk_sizes: tuple[int, ...] = (1, 5, 8), **options: Any
) -> None:
    """A sequence fed in chunks through an unbounded cache gives the logits of the whole, and
    so do the attention logits of each chunk's queries against the keys before them; an
    encoding that declares ``cache_consistent = False`` must really differ (a declaration
    that is not needed hides a check). Drawn positions are drawn once for the stream, whole
    or chunked alike."""
    _check_chunked_scores(encoding, chunk_sizes, **options)
    model = tiny_model(encoding, **options).eval()
    tokens = _tokens()
    consistent = getattr(model.encoding, "cache_consistent", True)
    with torch.no_grad():
        with seeded_draws(0):
            whole = model(tokens)
        for size in chunk_sizes:
            with seeded_draws(0):
                cache = model.new_cache(mem_len=math.inf, length=SEQ_LEN)
            parts = [model(tokens[:, s : s + size], cache=cache) for s in range(0, SEQ_LEN, size)]
            chunked = torch.cat(parts, dim=1)
            err = (chunked - whole).abs().max().item()
            if consistent:
                assert err < 1e-5, (
                    f"{encoding}: chunks of {size} differ from the whole by {err:.2e}"
                )
            assert cache.seen == SEQ_LEN, f"{encoding}: cache counted {cache.seen} positions"
    if not consistent:  # the declared difference must be real, at the rotation itself
        enc, size = model.encoding, 8
        q, k = torch.randn(
            2, 1, enc.n_heads, SEQ_LEN, enc.d_head, generator=torch.Generator().manual_seed(2)
        )
        whole_q, whole_k = enc.rotate(q, k, Span(0, SEQ_LEN), None)
        parts = [
            enc.rotate(q[..., s : s + size, :], k[..., s : s + size, :], Span(s, s + size), None)
            for s in range(0, SEQ_LEN, size)
        ]
        chunked_k = torch.cat([part[1] for part in parts], dim=-2)
        gap = (
            (
                parts[-1][0] @ chunked_k.transpose(-1, -2)
                - whole_q[..., -size:, :] @ whole_k.transpose(-1, -2)
            )
            .abs()
            .max()
        )
        assert gap > 1e-3, (
            f"{encoding}: declares cache_consistent = False but its chunked scores equal the whole"
        )


def logit_encoding(encoding: str, **options: Any) -> PositionalEncoding:
    """The encoding the checks at the attention logits read: 4 heads of 8, causal, one layer,
    seeded, in eval mode. A parameter initialised to all zeros (CoPE's position embeddings, as
    in its paper) would make its term vanish and pass every comparison uncomputed, so such
    parameters are drawn from N(0, 0.5^2); the others keep their initialisation."""
    torch.manual_seed(0)
    enc = create_encoding(encoding, n_heads=4, d_head=8, causal=True, n_layers=1, **options)
    with torch.no_grad():
        for parameter in enc.parameters():
            if parameter.is_floating_point() and not parameter.any():
                parameter.normal_(std=0.5)
    return enc.eval()


def _check_chunked_scores(encoding: str, chunk_sizes: tuple[int, ...], **options: Any) -> None:
    """Each chunk's queries against the keys before them (one token: the decoding path) give
    the rows of the whole's attention logits. At the tiny model's initial weights an
    encoding's learned position terms move its output logits by as little as 1e-7, below what
    the model-level comparison can see; at the logits they are of order one."""
    enc = logit_encoding(encoding, **options)
    if not enc.cache_consistent:
        return
    enc.random_positions = None  # plain spans: drawn positions have their own check
    P = min(SEQ_LEN, enc.max_positions or SEQ_LEN)
    q, k = torch.randn(2, 2, 4, P, 8, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        whole = attention_logits(enc, q, k, Span(0, P), Span(0, P))  # (B, H, P, P)
        tolerance = 1e-5 * max(1.0, whole.abs().max().item())
        for size in chunk_sizes:
            for s in range(0, P, size):
                e = min(s + size, P)
                part = attention_logits(enc, q[..., s:e, :], k[..., :e, :], Span(s, e), Span(0, e))
                seen = causal_mask(e - s, e, torch.device("cpu"))  # (e - s, e)
                err = (part - whole[..., s:e, :e])[..., seen].abs().max().item()
                assert err <= tolerance, (
                    f"{encoding}: the attention logits of queries {s}..{e - 1} against the keys "
                    f"before them differ from the whole's by {err:.2e}"
                )


def attention_logits(
    enc: PositionalEncoding,
    q: torch.Tensor,
    k: torch.Tensor,
    q_span: Span,
    k_span: Span,
    layer: int = 0,
) -> torch.Tensor:
    """Dense pre-mask logits (B, H, Lq, Lk) of one layer for given queries and keys, through
    the encoding's rotate and score hooks (keys rotated at their own positions)."""
    identity = LayerContext(layer, _split_heads(enc), _split_heads(enc))
    q_rot, _ = enc.rotate(q, q, q_span, identity)
    _, k_rot = enc.rotate(k, k, k_span, identity)
    return enc.score(q_rot, k_rot, q_span, k_span, identity).logits()


def _split_heads(enc: PositionalEncoding) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: x.view(x.shape[0], enc.n_heads, enc.d_head).transpose(0, 1)


def check_shift_invariance(encoding: str, shift: int = 37, **options: Any) -> None:
    """For relative encodings: attention is unchanged when all positions shift together.
    Logits are compared up to a constant per query row (softmax ignores it; causal ALiBi
    folded into q and k relies on exactly that). A whole model then reads a segment through an
    empty memory (mem_len 0, after earlier tokens) as it reads the segment alone: evaluation
    reads a memory of 0 that way."""
    enc = logit_encoding(encoding, **options)
    if not enc.relative:
        return
    model = tiny_model(encoding, **options).eval()
    if model.config.causal and not model.encoding.draws_positions:
        tokens, cut = _tokens(), SEQ_LEN // 3
        with torch.no_grad():
            cache = model.new_cache(mem_len=0, length=SEQ_LEN)
            model(tokens[:, :cut], cache=cache)
            after_memory, alone = model(tokens[:, cut:], cache=cache), model(tokens[:, cut:])
        gap = (after_memory - alone).abs().max().item()
        assert gap <= 1e-5 * max(1.0, alone.abs().max().item()), (
            f"{encoding}: declares relative = True, but a segment read after {cut} tokens through "
            f"an empty memory differs from the segment read alone by {gap:.2e}"
        )
    q, k = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 10, 8)
    with torch.no_grad():
        base = attention_logits(enc, q, k, Span(4, 10), Span(0, 10))
        moved = attention_logits(enc, q, k, Span(4 + shift, 10 + shift), Span(shift, 10 + shift))
    mask = causal_mask(6, 10, torch.device("cpu"))  # the 6 queries are the last of 10 positions
    base, moved = (x.masked_fill(~mask, float("-inf")).log_softmax(-1) for x in (base, moved))
    err = (base - moved)[..., mask].abs().max().item()
    assert err < 1e-4, (
        f"{encoding}: shifting all positions by {shift} changed the logits by {err:.2e}"
    )


def check_max_positions(encoding: str, **options: Any) -> None:
    """An encoding with a largest position (or randomized positions, with their most tokens
    per stream) says so clearly past it, before any computation."""
    model = tiny_model(encoding, **options)
    enc = model.encoding
    limit = (
        enc.random_positions.max_position if enc.random_positions is not None else enc.max_positions
    )
    if limit is None:
        return
    ok = torch.zeros(1, limit, dtype=torch.long)
    model(ok)
    assert model.encoding.supports(Span(0, limit + 1)) is not None
    try:
        model(torch.zeros(1, limit + 1, dtype=torch.long))
    except PositionOutOfRangeError as err:
        assert str(limit - 1) in str(err), f"{encoding}: error does not name the limit: {err}"
    else:
        raise AssertionError(f"{encoding}: no error past max_positions={limit}")
    try:  # drawn positions refuse when the cache is made for the stream; others on the way
        cache = model.new_cache(mem_len=0, length=limit + 1)
        model(torch.zeros(1, limit, dtype=torch.long), cache=cache)
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    except PositionOutOfRangeError:
        pass
    else:
        raise AssertionError(f"{encoding}: a cached continuation past max_positions did not raise")


def check_explicit_positions(encoding: str, **options: Any) -> None:
    """Spans that carry their positions (randomized positions) read the same encoding: given
    start..stop-1 explicitly they give exactly the plain span's embeddings and logits (the
    general paths against the fast ones), and at drawn positions p those of all positions
    0..P-1 at rows and columns p, for encodings whose logits are pairwise."""
    enc = logit_encoding(encoding, **options)
    enc.random_positions = None  # the spans below say their positions themselves
    P = min(30, enc.max_positions or 30)  # positions 0..P-1, within what the encoding represents
    n = min(10, P // 2)
    s = min(5, P - n)  # queries s..s+n-1 against keys 0..s+n-1
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 2, 4, P, 8, generator=generator)
    x = torch.randn(2, P, enc.d_model, generator=generator)
    with torch.no_grad():
        plain = attention_logits(
            enc, q[..., s : s + n, :], k[..., : s + n, :], Span(s, s + n), Span(0, s + n)
        )
        explicit = attention_logits(
            enc,
            q[..., s : s + n, :],
            k[..., : s + n, :],
            Span(s, s + n, torch.arange(s, s + n)),
            Span(0, s + n, torch.arange(s + n)),
        )
        seen = causal_mask(n, s + n, torch.device("cpu"))  # future keys' logits are masked
        err = (plain - explicit)[..., seen].abs().max().item()
        assert err < 1e-5, (
            f"{encoding}: explicit positions start..stop-1 change the logits by {err:.2e}"
        )
        err = (
            (enc.embed(x, Span(0, P)) - enc.embed(x, Span(0, P, torch.arange(P))))
            .abs()
            .max()
            .item()
        )
        assert err < 1e-6, (
            f"{encoding}: explicit positions 0..P-1 change the embeddings by {err:.2e}"
        )
    _check_explicit_gradients(enc, q[..., s : s + n, :], k[..., : s + n, :], x, s, n, generator)
    with torch.no_grad():
        if not enc.pairwise:
            return
        drawn = torch.cat(
            (
                torch.randperm(P - 1, generator=generator)[: n - 1].sort().values,
                torch.tensor([P - 1]),
            )
        )
        full = attention_logits(enc, q, k, Span(0, P), Span(0, P))  # (B, H, P, P)
        at_drawn = attention_logits(
            enc, q[..., drawn, :], k[..., drawn, :], Span(0, n, drawn), Span(0, n, drawn)
        )
        mask = causal_mask(n, n, torch.device("cpu"))
        expected = full[..., drawn[:, None], drawn[None, :]]
        err = (expected - at_drawn)[..., mask].abs().max().item()
        assert err < 1e-4, (
            f"{encoding}: logits at drawn positions differ from all positions' by {err:.2e}"
        )
        err = (
            (enc.embed(x, Span(0, P))[:, drawn] - enc.embed(x[:, drawn], Span(0, n, drawn)))
            .abs()
            .max()
            .item()
        )
        assert err < 1e-6, (
            f"{encoding}: embeddings at drawn positions differ from all positions' by {err:.2e}"
        )


def _check_explicit_gradients(
    enc: PositionalEncoding,
    q: Tensor,
    k: Tensor,
    x: Tensor,
    s: int,
    n: int,
    generator: torch.Generator,
) -> None:
    """The encoding's parameters get the same gradient through the general paths (explicit
    positions) as through the fast ones (plain spans), logits and embeddings, for the same
    upstream gradients (none at future keys, whose logits attention masks)."""
    params = [p for p in enc.parameters() if p.requires_grad]
    if not params:
        return
    P = x.shape[1]
    upstream: list[Tensor] = []
    grads = []
    for explicit in (False, True):
        q_span = Span(s, s + n, torch.arange(s, s + n) if explicit else None)
        k_span = Span(0, s + n, torch.arange(s + n) if explicit else None)
        enc.zero_grad(set_to_none=True)
        outputs = (
            attention_logits(enc, q, k, q_span, k_span),
            enc.embed(x, Span(0, P, torch.arange(P) if explicit else None)),
        )
        if not upstream:
            upstream = [torch.randn(out.shape, generator=generator) for out in outputs]
            upstream[0] *= causal_mask(n, s + n, torch.device("cpu"))  # future keys are masked
        total = sum((out * up).sum() for out, up in zip(outputs, upstream) if out.requires_grad)
        if isinstance(total, Tensor):  # else no output of this path depends on the parameters
            total.backward()
        grads.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
    enc.zero_grad(set_to_none=True)
    err = max((a - b).abs().max().item() for a, b in zip(*grads))
    scale = max(a.abs().max().item() for a in grads[0]) or 1.0
    assert err <= 1e-4 * max(1.0, scale), (
        f"{enc.name}: the fast path's parameter gradients differ from the general path's "
        f"by {err:.2e}"
    )


def check_determinism(encoding: str, **options: Any) -> None:
    """The same seed gives the same parameters and outputs."""
    tokens = _tokens()
    with torch.no_grad():
        a = tiny_model(encoding, seed=3, **options)(tokens)
        b = tiny_model(encoding, seed=3, **options)(tokens)
    assert torch.equal(a, b), f"{encoding}: same seed, different outputs"


CHECKS: dict[str, Callable[..., None]] = {
    "shapes_and_gradients": check_shapes_and_gradients,
    "causality": check_causality,
    "chunked_equals_whole": check_chunked_equals_whole,
    "shift_invariance": check_shift_invariance,
    "max_positions": check_max_positions,
    "explicit_positions": check_explicit_positions,
    "determinism": check_determinism,
}


def run_conformance(encoding: str, **options: Any) -> None:
    """Run every check on `encoding`; raises AssertionError on the first failure."""
    REGISTRY.get(encoding)
    for check in CHECKS.values():
        check(encoding, **options)


def check_task_batches(task_name: str, **options: Any) -> None:
    """A task's batches at its shortest and a longer length: inputs (B, sequence_length), tokens
    and scored targets inside the vocabulary, at least one answer per sequence, and the same
    seed giving the same batch while another seed does not."""
    task = create_task(task_name, **options)
    for length in sorted({max(task.min_length, 1), max(task.min_length, 6)}):
        batch = task.batch(length, 5, torch.Generator().manual_seed(0))
        expected = (5, task.sequence_length(length))
        assert batch.tokens.shape == expected, (
            f"task {task_name!r}: inputs at length {length} are {tuple(batch.tokens.shape)}, "
            f"sequence_length says {expected}"
        )
        assert batch.targets.shape == batch.tokens.shape, f"task {task_name!r}: targets' shape"
        scored = batch.targets[batch.targets != IGNORE]
        for what, values in (("input", batch.tokens), ("answer", scored)):
            assert values.numel() and 0 <= int(values.min()) <= int(values.max()) < (
                task.vocab_size
            ), f"task {task_name!r}: an {what} token lies outside 0..vocab_size-1 at {length}"
        assert bool((batch.targets != IGNORE).any(dim=1).all()), (
            f"task {task_name!r}: a sequence at length {length} has no answer to score"
        )
        again = task.batch(length, 5, torch.Generator().manual_seed(0))
        other = task.batch(length, 5, torch.Generator().manual_seed(1))
        assert torch.equal(batch.tokens, again.tokens) and torch.equal(
            batch.targets, again.targets
        ), f"task {task_name!r}: the same seed gave different batches (use only the generator)"
        assert not torch.equal(batch.tokens, other.tokens) or length == task.min_length, (
            f"task {task_name!r}: two seeds gave the same inputs at length {length}"
        )


def check_answers_fed_back(task_name: str, **options: Any) -> None:
    """A causal task declares ``answers_fed_back`` as its batches show it: True exactly when every
    scored answer before the last position is the next input token, so free-running decoding
    may write the model's answer there without corrupting the input."""
    task = create_task(task_name, **options)
    if not task.causal:
        return  # an encoder emits every answer at once: nothing is fed back
    length = max(task.min_length, 6)
    batch = task.batch(length, 16, torch.Generator().manual_seed(2))
    answer = batch.targets[:, :-1] != IGNORE  # (B, T - 1): answers that have a next input
    if not bool(answer.any()):
        return
    next_inputs = batch.tokens[:, 1:]
    is_next = bool((batch.targets[:, :-1][answer] == next_inputs[answer]).all())
    assert task.answers_fed_back == is_next, (
        f"task {task_name!r} declares answers_fed_back = {task.answers_fed_back}, but its "
        + (
            "answers are its next input tokens: set answers_fed_back = True so free-running "
            "decoding reads the model's own answers"
            if is_next
            else "answers are not always the next input token: set answers_fed_back = False, or "
            "free-running decoding overwrites the input with the model's answers"
        )
    )


def check_loss_floors(task_name: str, **options: Any) -> None:
    """``loss_floors`` (evaluation's one call for every length) gives, for each length asked, in
    order, the floor ``loss_floor`` gives for that length alone (None where the task knows none),
    at the task's two shortest evaluation lengths."""
    lengths = sorted(create_task(task_name, **options).eval_lengths)[:2]
    together = create_task(task_name, **options).loss_floors(lengths)
    alone = {n: create_task(task_name, **options).loss_floor(n) for n in lengths}
    assert list(together) == lengths, (
        f"task {task_name!r}: loss_floors({lengths}) answered for {list(together)}; return one "
        "floor per length asked, in order"
    )
    for n in lengths:
        a, b = together[n], alone[n]
        assert (a is None) == (b is None) and (a is None or math.isclose(a, b, rel_tol=1e-9)), (
            f"task {task_name!r}: loss_floors gives {a} at length {n}, loss_floor gives {b}; a "
            "task that overrides one of them must give the same floors from both"
        )


TASK_CHECKS: dict[str, Callable[..., None]] = {
    "batches": check_task_batches,
    "answers_fed_back": check_answers_fed_back,
    "loss_floors": check_loss_floors,
}


def run_task_conformance(task_name: str, **options: Any) -> None:
    """Run every task check on `task_name`; raises AssertionError on the first failure."""
    for check in TASK_CHECKS.values():
        check(task_name, **options)
