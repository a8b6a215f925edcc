"""Accuracy at each evaluation length, on the whole sequence and through caches of several
sizes (Transformer-XL style). Teacher-forced argmax: for whole-answer exact match it equals
greedy decoding. Full-context evaluation also decodes greedily (free running), so token
accuracy can be read both ways: teacher-forced token accuracy credits a token read after the
model's first mistake; greedy token accuracy does not. Free running feeds answers back only
where a task's answers are its next inputs (Task.answers_fed_back); elsewhere it equals
teacher forcing, and its rows say so.

Nothing is read twice. A memory reads what the whole sequence's pass reads until it first
drops a token, so each memory's reading continues from the full-context pass (its logits and
its unbounded memory) from that segment on; free-running decoding starts from the same memory
at the first wrong answer fed back (before it, the model has read the true tokens); loss by
position reads the full-context pass at the longest length. Where an encoding is not cache
consistent or draws positions, each reading runs from the start as before."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from posbench.attention import attention_tensor_bytes
from posbench.cache import Cache, MemoryParts
from posbench.experiment.config import EvalConfig
from posbench.encodings.base import PositionalEncoding, Span
from posbench.encodings.positions import seeded_draws
from posbench.model import Decoder
from posbench.tasks.base import IGNORE, Batch, Task

HELD_OUT_SEED = 1_000_003  # the held-out sample per length is the same for every run
#: Randomized positions are drawn once per forward call, shared by the sequences in it (as Ruoss
#: et al.'s code draws them in training); evaluation reads each length in at least this many
#: calls, so its accuracy averages at least this many draws rather than one or two.
POSITION_DRAWS = 32
#: The version of the evaluation protocol, recorded in each run's result.json as
#: "evaluation_protocol" (a run stored without it was evaluated under version 1). It rises
#: whenever evaluation starts scoring some runs differently; outdated_evaluation says which.
EVALUATION_PROTOCOL = 2
VALIDATION_SEED = 2_000_003  # the early-stopping sample: never the evaluation sample


@dataclass
class Measurement:
    """One tidy measurement; value is NaN with a note when it is not applicable."""

    eval_len: int  # the task length evaluated, in the task's own unit
    mem_len: (
        float | None
    )  # None: no cache (the whole sequence at once); math.inf: an unbounded cache
    metric: str
    value: float
    note: str = ""
    position: int | None = None  # loss-by-position rows: the last token position of the bin


def outdated_evaluation(recorded: int, encoding: PositionalEncoding) -> str | None:
    """Why a run evaluated under protocol `recorded` with `encoding` (as its run builds it)
    would score differently today, or None where today's evaluation gives it the same numbers.
    Version 2 reads each length's sample in at least POSITION_DRAWS forward calls where an
    encoding that reads positions draws them at evaluation; version 1 drew once per batch."""
    drawn = encoding.random_positions
    if recorded < 2 and drawn is not None and drawn.at_evaluation and encoding.reads_positions:
        return (
            "evaluated under evaluation protocol 1, one position draw per batch of the sample; "
            f"today's averages at least {POSITION_DRAWS} draws per length"
        )
    return None


def held_out(
    task: Task, length: int, config: EvalConfig, seed: int = HELD_OUT_SEED
) -> Iterator[Batch]:
    """The fixed evaluation sample for `length`, in batches."""
    generator = torch.Generator().manual_seed(seed + length)
    sampled = task.for_evaluation()
    remaining = config.n_samples
    while remaining > 0:
        size = min(config.batch_size, remaining)
        yield sampled.batch(length, size, generator)
        remaining -= size


def default_segment_len(task: Task, config: EvalConfig) -> int:
    """S for the cache sweep: configured, or half the longest training sequence."""
    return config.segment_len or max(1, task.sequence_length(task.train_lengths[1]) // 2)


def mem_lens(task: Task, config: EvalConfig) -> list[float]:
    """The memory lengths M of the cache sweep, from multiples of S (math.inf: unbounded)."""
    segment = default_segment_len(task, config)
    out: list[float] = []
    for factor in config.mem_len_factors:
        m = math.inf if math.isinf(factor) else int(round(factor * segment))
        if m not in out:
            out.append(m)
    return out


#: The parts of a run's time split that evaluation spends (result.json "time_split"): full
#: context includes judging the run; free-running decoding is counted apart from the
#: full-context pass it continues, and the cache sweep's continuations apart from the pass
#: they start from.
FULL_CONTEXT = "evaluation, full context"
CACHES = "evaluation, caches"
FREE_RUNNING = "evaluation, free-running decoding"
BY_POSITION = "evaluation, loss by position"
WHOLE_TEXT = "evaluation, whole text"


class _Clock:
    """Seconds by part of the time split, added to `seconds` (None: not kept)."""

    def __init__(self, seconds: dict[str, float] | None) -> None:
        self.seconds = seconds

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.seconds is not None:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started


def continues_full_context(model: Decoder) -> bool:
    """Whether the cache sweep and free-running decoding may start from the full-context pass:
    a causal model whose encoding is cache consistent (reading a stream in segments through an
    unbounded memory gives the whole stream's logits) and draws no positions (each reading
    would draw its own)."""
    encoding = model.encoding
    return model.config.causal and encoding.cache_consistent and not encoding.draws_positions


def first_dropped(mem_len: float, segment: int) -> float:
    """The first token whose segment reads a memory of `mem_len` that has dropped a token:
    segment k holds min(mem_len, k * segment) earlier tokens, all of them while k * segment
    <= mem_len, so until then it reads what the whole stream's pass reads (math.inf: never)."""
    return math.inf if math.isinf(mem_len) else (int(mem_len) // segment + 1) * segment


def _segments(
    model: Decoder, tokens: torch.Tensor, cache: Cache, start: int, segment: int
) -> list[torch.Tensor]:
    """The logits of tokens[:, start:] (B, T) read in segments through `cache`, which holds
    what came before `start`."""
    return [
        model(tokens[:, s : s + segment], cache=cache)
        for s in range(start, tokens.shape[1], segment)
    ]


@torch.no_grad()
def _logits(
    model: Decoder, tokens: torch.Tensor, segment: int | None, mem_len: float
) -> torch.Tensor:
    if segment is None:
        return model(tokens)
    cache = model.new_cache(mem_len=mem_len, length=tokens.shape[1])
    return torch.cat(_segments(model, tokens, cache, 0, segment), dim=1)


@torch.no_grad()
def continued_logits(
    model: Decoder,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    memory: Cache | MemoryParts,
    segment: int,
    mem_len: float,
) -> torch.Tensor:
    """The logits (B, T, V) of reading `tokens` (B, T) in segments through a memory of
    `mem_len`, continued from the full-context pass over the same tokens (its `logits` and its
    unbounded `memory`): the segments before the memory first drops a token read what that
    pass read, so their logits are its logits and the rest start from its keys and values.
    For a model that continues_full_context."""
    cut = first_dropped(mem_len, segment)
    T = tokens.shape[1]
    if cut >= T:
        return logits
    cut = int(cut)
    cache = memory.resumed(mem_len, cut)
    return torch.cat([logits[:, :cut], *_segments(model, tokens, cache, cut, segment)], dim=1)


@torch.no_grad()
def segments_alone(
    model: Decoder,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    segment: int,
    known: dict[int, torch.Tensor],
) -> torch.Tensor:
    """The logits (B, T, V) of reading `tokens` (B, T) in segments through a memory of 0, for a
    relative encoding: a segment that reads no memory reads only itself, and its positions'
    offset cancels, so each segment is the segment read alone. The first segment's logits are
    the full-context `logits`; a later one's come from `known` (start -> (B, segment, V), the
    segment read alone elsewhere) or are read here, the whole-width ones in one call."""
    B, T = tokens.shape
    starts = range(segment, T, segment)
    missing = [s for s in starts if s + segment <= T and s not in known]
    read = dict(known)
    if missing:
        index = torch.tensor(missing, device=tokens.device)[:, None] + torch.arange(
            segment, device=tokens.device
        )  # (n, S)
        out = model(tokens[:, index].flatten(0, 1)).unflatten(0, (B, len(missing)))  # (B, n, S, V)
        read.update({s: out[:, i] for i, s in enumerate(missing)})
    pieces = [logits[:, :segment]]
    pieces += [read[s] if s in read else model(tokens[:, s:]) for s in starts]
    return torch.cat(pieces, dim=1)


@torch.no_grad()
def greedy_predictions(
    model: Decoder,
    tokens: torch.Tensor,
    answer: torch.Tensor,
    forced: torch.Tensor | None = None,
    memory: Cache | MemoryParts | None = None,
) -> torch.Tensor:
    """Free-running decoding: the model's argmax at every position (B, T), where each answer
    token the model reads is its own earlier prediction rather than the true token (so after
    its first mistake it continues from that mistake). Only for a task whose answers are its
    next inputs (Task.answers_fed_back): the prediction at t is written into the input at
    t + 1. Tokens off the answer are read as given.
    Until a sequence feeds back a wrong answer it reads the true tokens, so its predictions are
    the teacher-forced ones, `forced` (B, T) (the full-context argmax, computed when not
    given); only sequences that feed back a wrong answer are decoded, from the first such
    input on, one token at a time through a memory (resumed from `memory`, the full-context
    pass's unbounded memory of `tokens`, when given) where the encoding is cache consistent,
    else recomputing the prefix at every step. An encoding that draws positions decodes every
    sequence from its first answer through one memory, all its positions from one draw. A
    bidirectional model emits every answer at once from blanks, reading none of its answers:
    its one forward pass is free running."""
    if not model.config.causal:
        return model(tokens).argmax(-1)
    B, T = tokens.shape
    columns = answer.any(dim=0).nonzero()
    if len(columns) == 0:
        return torch.zeros_like(tokens)
    if model.encoding.draws_positions:  # every prediction from the memory's one draw
        rows, start, forced = torch.arange(B, device=tokens.device), int(columns[0]), None
    else:
        if forced is None:
            forced = model(tokens).argmax(-1)  # (B, T)
        fed_wrong = answer[:, :-1] & (forced[:, :-1] != tokens[:, 1:])  # (B, T - 1)
        rows = fed_wrong.any(dim=1).nonzero().flatten()
        if len(rows) == 0:
            return forced
        start = int(fed_wrong[rows].float().argmax(dim=1).min())  # the earliest wrong answer
    inputs = tokens[rows].clone()  # (R, T): the decoded sequences' inputs, true until start
    predictions = torch.zeros_like(inputs)
    cache = None
    if forced is not None:
        predictions[:, : start + 1] = forced[rows, : start + 1]
    if model.encoding.cache_consistent:
        if memory is not None and forced is not None:
            cache = memory.resumed(math.inf, start + 1, rows)
        else:
            cache = model.new_cache(mem_len=math.inf, length=T)
            predictions[:, : start + 1] = model(inputs[:, : start + 1], cache=cache).argmax(-1)
    elif forced is None:
        predictions[:, : start + 1] = model(inputs[:, : start + 1]).argmax(-1)
    for t in range(start + 1, T):
        inputs[:, t] = torch.where(answer[rows, t - 1], predictions[:, t - 1], tokens[rows, t])
        logits = (
            model(inputs[:, t : t + 1], cache=cache)
            if cache is not None
            else model(inputs[:, : t + 1])
        )
        predictions[:, t] = logits[:, -1].argmax(-1)
    if forced is None:
        return predictions
    out = forced.clone()
    out[rows] = predictions
    return out


def chance_hits(
    task: Task, length: int, config: EvalConfig, answers: dict[int, torch.Tensor]
) -> float:
    """Hits of answering, at each answer position, the token most frequent there in an
    independent sample of the same size (the validation sample; ties split evenly), scored on
    `answers` (answer position -> the evaluation sample's answer tokens there): the chance level
    of a constant answer, without the optimism of scoring a sample's majority on itself."""
    reference: dict[int, torch.Tensor] = {}
    for batch in held_out(task, length, config, VALIDATION_SEED):
        answer = batch.targets != IGNORE
        for column in answer.any(dim=0).nonzero().flatten().tolist():
            reference[column] = torch.cat(
                (
                    reference.get(column, torch.zeros(0, dtype=torch.long)),
                    batch.targets[answer[:, column], column],
                )
            )
    hits = 0.0
    for column, tokens in answers.items():
        if column not in reference:
            continue
        counts = torch.bincount(reference[column])
        winners = (counts == counts.max()).nonzero().flatten()
        hits += sum(int((tokens == w).sum()) for w in winners.tolist()) / len(winners)
    return hits


def _forward_calls(model: Decoder, batches: Iterator[Batch], config: EvalConfig) -> Iterator[Batch]:
    """The evaluation sample as the model reads it: the held-out batches as they are, or, for an
    encoding that draws its positions at evaluation, cut so that the sample takes at least
    POSITION_DRAWS forward calls (one draw each). The sample itself is the same either way."""
    if not model.encoding.draws_positions:
        yield from batches
        return
    size = max(1, config.n_samples // POSITION_DRAWS)
    for batch in batches:
        yield from batch.split(size)


def correct_prefix(hit: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Per sequence, how many answer tokens are right before the first wrong one, (B,)."""
    wrong = answer & ~hit
    before = (torch.cumsum(wrong.long(), dim=1) == 0) & answer
    return before.sum(dim=1)


class _Tally:
    """Exact match, teacher-forced token accuracy and loss, summed over the batches of a
    sample read one way (full context, or through one memory)."""

    def __init__(self) -> None:
        self.exact = self.correct = self.answers = self.sequences = 0
        self.loss_sum = 0.0

    def add(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Counts the batch's logits (B, T, V) against its targets (B, T); returns the hits."""
        mask = targets != IGNORE
        hit = (logits.argmax(-1) == targets) & mask
        self.exact += int((hit | ~mask).all(dim=1).sum())
        self.correct += int(hit.sum())
        self.answers += int(mask.sum())
        self.sequences += targets.shape[0]
        self.loss_sum += float(F.cross_entropy(logits[mask], targets[mask], reduction="sum"))
        return hit

    def scores(self) -> dict[str, float]:
        return {
            "exact_match": self.exact / self.sequences,
            "token_accuracy": self.correct / self.answers,
            "loss": self.loss_sum / self.answers,
        }


@torch.no_grad()
def _accuracy(
    model: Decoder,
    task: Task,
    length: int,
    config: EvalConfig,
    device: torch.device | str,
    segment: int | None = None,
    mem_len: float = math.inf,
    seed: int = HELD_OUT_SEED,
    free_running: bool = False,
    by_position: list[dict[str, float]] | None = None,
    seconds: dict[str, float] | None = None,
    memories: dict[float, dict[str, float]] | None = None,
    position_losses: PositionLosses | None = None,
) -> dict[str, float]:
    """Exact match, teacher-forced token accuracy and loss on the held-out sample of `length`;
    with `free_running`, also greedy token accuracy (the model reads its own answers), the mean
    correct-prefix length in answer tokens, and the chance level (always answering each answer
    position's most frequent token of an independent sample: see chance_hits); `by_position`, when
    given, receives one row per answer position (counted from the first answer token) with its
    teacher-forced and greedy accuracy; `seconds` receives the time spent by part of the time
    split. At full context (no `segment`), `memories` (memory length -> {}), when given,
    receives the same scores read in segments of default_segment_len through each memory,
    continued from the full-context pass (the model must continue_full_context), and
    `position_losses` the sample's per-token losses, full context and sliding windows, for
    loss by position. A relative encoding's memory of 0 reads each segment alone, so that
    reading takes the segments the sliding windows begin with from them."""
    clock = _Clock(seconds)
    full, through = _Tally(), {mem: _Tally() for mem in memories or {}}
    greedy = prefix = 0
    counts: dict[int, torch.Tensor] = {}
    position_hits: dict[
        int, list[int]
    ] = {}  # answer column -> [answers, teacher-forced hits, greedy hits]
    cache_segment = default_segment_len(task, config)
    decodes = free_running and task.answers_fed_back  # else free running is teacher forcing
    keeps_memory = segment is None and (
        bool(through) or (decodes and continues_full_context(model))
    )
    joint = keeps_memory and reads_jointly(model, task, config, length)
    kept: list[tuple[Batch, torch.Tensor, torch.Tensor, Cache]] = []

    def follow(
        batch: Batch, logits: torch.Tensor, hit: torch.Tensor, memory: Cache | MemoryParts | None
    ) -> None:
        """The readings that continue from a full-context pass: each memory's, and free
        running, for the sequences of `batch` (its logits (B, T, V), hits (B, T), memory)."""
        nonlocal greedy, prefix
        alone = 0 in through and model.encoding.relative
        heads: dict[int, torch.Tensor] = {}
        if position_losses is not None:
            with clock.part(BY_POSITION):
                heads = position_losses.add(
                    model,
                    batch.tokens,
                    batch.targets,
                    logits,
                    position_losses.windows.sequences_per_call(task, config),
                    cache_segment if alone else 0,
                )
        with clock.part(CACHES):
            for mem, tally in through.items():
                assert memory is not None
                tally.add(
                    segments_alone(model, batch.tokens, logits, cache_segment, heads)
                    if mem == 0 and alone
                    else continued_logits(model, batch.tokens, logits, memory, cache_segment, mem),
                    batch.targets,
                )
        if not free_running:
            return
        mask = batch.targets != IGNORE
        with clock.part(FREE_RUNNING):
            free_hit = (
                (
                    greedy_predictions(model, batch.tokens, mask, logits.argmax(-1), memory)
                    == batch.targets
                )
                & mask
                if decodes
                else hit  # the model never reads its answers: free running is teacher forcing
            )
        greedy += int(free_hit.sum())
        prefix += int(correct_prefix(free_hit, mask).sum())
        for column in mask.any(dim=0).nonzero().flatten().tolist():
            rows = mask[:, column]
            counts[column] = torch.cat(
                (
                    counts.get(column, torch.zeros(0, dtype=torch.long)),
                    batch.targets[rows, column].cpu(),
                )
            )
            tally = position_hits.setdefault(column, [0, 0, 0])
            tally[0] += int(rows.sum())
            tally[1] += int(hit[rows, column].sum())
            tally[2] += int(free_hit[rows, column].sum())

    with seeded_draws(seed + length):  # drawn positions, if any: a function of the sample alone
        for batch in _forward_calls(model, held_out(task, length, config, seed), config):
            batch = batch.to(device)
            with clock.part(FULL_CONTEXT if segment is None else CACHES):
                memory = None
                if keeps_memory:
                    memory = model.new_cache(mem_len=math.inf, length=batch.tokens.shape[1])
                    logits = model(batch.tokens, cache=memory)  # (B, T, V)
                else:
                    logits = _logits(model, batch.tokens, segment, mem_len)  # (B, T, V)
                hit = full.add(logits, batch.targets)
            if joint:
                assert memory is not None
                kept.append((batch, logits, hit, memory))
            else:
                follow(batch, logits, hit, memory)
    if kept:  # the whole sample at once: a memory's segments and decoding's steps run once
        follow(
            Batch(
                torch.cat([b.tokens for b, *_ in kept]), torch.cat([b.targets for b, *_ in kept])
            ),
            torch.cat([logits for _, logits, _, _ in kept]),
            torch.cat([hit for _, _, hit, _ in kept]),
            MemoryParts([memory for *_, memory in kept]),
        )
    scores = full.scores()
    if free_running:
        scores["greedy_token_accuracy"] = greedy / full.answers
        scores["correct_prefix"] = prefix / full.sequences
        scores["chance_token_accuracy"] = chance_hits(task, length, config, counts) / full.answers
        if by_position is not None and position_hits:
            first = min(position_hits)
            by_position += [
                {
                    "eval_len": length,
                    "answer_position": column - first,
                    "answers": n,
                    "token_accuracy": forced / n,
                    "greedy_token_accuracy": free / n,
                }
                for column, (n, forced, free) in sorted(position_hits.items())
            ]
    for mem, tally in through.items():
        assert memories is not None
        memories[mem] = _exact_if_meaningful(task, tally.scores())
    return _exact_if_meaningful(task, scores)


#: The most the readings that continue from the full-context pass keep to take the whole
#: sample at once (every batch's memory and logits).
JOINT_READING_BYTES = 512 * 2**20


def reads_jointly(model: Decoder, task: Task, config: EvalConfig, length: int) -> bool:
    """Whether the readings that continue from the full-context pass at `length` (the memories'
    segments, free-running decoding) take the whole sample at once rather than a batch at a
    time: when keeping every batch's memory and logits fits JOINT_READING_BYTES. Their calls
    are small (a segment, a token), so the fewer the calls, the less the time."""
    size, tokens = model.config, task.sequence_length(length)
    per_sequence = 4 * tokens * (2 * size.d_model * size.n_layers + size.vocab_size)
    return config.n_samples * per_sequence <= JOINT_READING_BYTES


def _exact_if_meaningful(task: Task, scores: dict[str, float]) -> dict[str, float]:
    if not task.exact_match_meaningful:
        del scores["exact_match"]
    return scores


def _not_applicable_rows(
    length: int,
    mem_len: float | None,
    reason: str,
    metrics: tuple[str, ...],
    position: int | None = None,
) -> list[Measurement]:
    """NaN rows with the reason a length cannot be evaluated, one per metric."""
    return [Measurement(length, mem_len, m, float("nan"), reason, position) for m in metrics]


#: What free-running (greedy) decoding adds at each full-context length of a task with answers.
FREE_RUNNING_METRICS = ("greedy_token_accuracy", "correct_prefix", "chance_token_accuracy")
#: The note on free-running rows of a task whose answers are not fed back (Task.answers_fed_back).
NOT_FED_BACK = "answers are not fed back: free running equals teacher forcing"


def _metrics(task: Task, free_running: bool = False) -> tuple[str, ...]:
    if not task.exact_match_meaningful:
        return ("token_accuracy", "loss")
    return ("exact_match", "token_accuracy", "loss") + (
        FREE_RUNNING_METRICS if free_running else ()
    )


def in_distribution_lengths(task: Task) -> list[int]:
    """The evaluation lengths that reports call in distribution (at most the longest training
    length); a task evaluated at none of them uses its shortest, middle and longest training
    length."""
    lo, hi = task.train_lengths
    return [n for n in task.eval_lengths if n <= hi] or sorted({lo, (lo + hi) // 2, hi})


#: One-sided normal quantile for the early-stopping margin (95%).
STOP_CONFIDENCE_Z = 1.645


def validation_exact_match(
    model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu"
) -> tuple[float, float]:
    """Exact match over the lengths the evaluation reports as in distribution, on a sample of
    its own (disjoint from the evaluation sample, as large): the early-stopping signal. Returns
    the mean and its one-sided 95% lower bound (normal approximation over the sequences), so a
    run stops only when the threshold holds with margin and the evaluation sample, which is a
    different draw, meets it too."""
    lengths = in_distribution_lengths(task)
    model.eval()
    scores = [
        _accuracy(model, task, n, config, device, seed=VALIDATION_SEED)["exact_match"]
        for n in lengths
    ]
    mean = sum(scores) / len(scores)
    sequences = config.n_samples * len(lengths)
    return mean, mean - STOP_CONFIDENCE_Z * math.sqrt(mean * (1 - mean) / sequences)


def validation_excess(
    model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu"
) -> float:
    """Held-out loss above the task's floor, averaged over the lengths the evaluation reports as
    in distribution, on the validation sample: the early-stopping signal of a language task."""
    lengths = in_distribution_lengths(task)
    model.eval()
    excess = [
        _accuracy(model, task, n, config, device, seed=VALIDATION_SEED)["loss"] - task.loss_floor(n)
        for n in lengths
    ]
    return sum(excess) / len(excess)


def iter_evaluate(
    model: Decoder,
    task: Task,
    config: EvalConfig,
    device: torch.device | str = "cpu",
    by_position: list[dict[str, float]] | None = None,
    seconds: dict[str, float] | None = None,
) -> Iterator[Measurement]:
    """Every measurement of a trained model, one length at a time (so a failure at a long
    length keeps the shorter ones): at each evaluation length full context, then through
    caches of each memory size where the length is a cache-evaluation length; then (a language
    task) loss by position and (a corpus) the whole held-out text at each length.
    `by_position` receives the full-context accuracy by answer position (see _accuracy);
    `seconds` the time spent by part of the time split (FULL_CONTEXT, CACHES, ...). A
    bidirectional model (a task's encoder form) is evaluated at full context only.
    Nothing is computed twice: where the model continues_full_context, each memory's reading
    starts from the full-context pass where it first differs from it (a memory that never
    drops a token, the unbounded one included, is the full-context reading), free-running
    decoding resumes from that pass's memory, and loss by position reads its full-context
    pass at the longest length."""
    model.eval()
    clock = _Clock(seconds)
    shared = continues_full_context(model)
    segment = default_segment_len(task, config)
    mems = mem_lens(task, config)
    # a cache continues causal attention only: a bidirectional model reads whole sequences
    chosen = task.eval_lengths if config.cache_eval_lengths is None else config.cache_eval_lengths
    cache_lengths = list(chosen) if model.config.causal else []  # [] from the config: none
    longest = max(task.eval_lengths)
    position_losses = PositionLosses.empty(task) if task.per_position and shared else None
    free_running = task.exact_match_meaningful
    floors = task.loss_floors(task.eval_lengths)
    for length in [*task.eval_lengths, *(n for n in cache_lengths if n not in task.eval_lengths)]:
        T = task.sequence_length(length)
        reason = model.encoding.supports(Span(0, T))
        cached = length in cache_lengths
        full_row = length in task.eval_lengths
        if reason:
            if full_row:
                yield from _not_applicable_rows(length, None, reason, _metrics(task, True))
            for mem in mems if cached else ():
                yield from _not_applicable_rows(length, mem, reason, _metrics(task))
            continue
        continued: dict[float, dict[str, float]] = {}
        if cached and shared:
            continued = {mem: {} for mem in mems if first_dropped(mem, segment) < T}
        if full_row or (cached and shared):
            scores = _accuracy(
                model,
                task,
                length,
                config,
                device,
                free_running=free_running and full_row,
                by_position=by_position if full_row else None,
                seconds=seconds,
                memories=continued,
                position_losses=position_losses if length == longest else None,
            )
        for k, v in scores.items() if full_row else ():
            read_back = k in ("greedy_token_accuracy", "correct_prefix")
            note = NOT_FED_BACK if read_back and not task.answers_fed_back else ""
            yield Measurement(length, None, k, v, note)
        floor = floors.get(length)
        if full_row and floor is not None:
            yield Measurement(length, None, "loss_floor", floor)
            yield Measurement(length, None, "excess_loss", scores["loss"] - floor)
        for mem in mems if cached else ():
            if shared:  # a memory that never drops a token reads as the whole sequence
                through = continued.get(mem) or {k: scores[k] for k in _metrics(task)}
            else:
                through = _accuracy(
                    model, task, length, config, device, segment, mem, seconds=seconds
                )
            for k, v in through.items():
                yield Measurement(length, mem, k, v)
    if task.per_position:
        with clock.part(BY_POSITION):
            rows = position_rows(model, task, config, device, position_losses)
        yield from rows
    text = task.evaluation_text()
    if text is not None:
        with clock.part(WHOLE_TEXT):
            rows = text_rows(model, task, text, config, device)
        yield from rows


#: Whole-text loss: the held-out text cut into consecutive windows, every token scored once.
TEXT_METRICS = ("text_loss",)


@torch.no_grad()
def text_rows(
    model: Decoder,
    task: Task,
    text: torch.Tensor,
    config: EvalConfig,
    device: torch.device | str = "cpu",
) -> list[Measurement]:
    """Mean next-token loss over the whole held-out `text` (T,) at each evaluation length n,
    read as Press et al. evaluate: the text cut into consecutive, non-overlapping windows of n
    input tokens (the last one shorter), each window's tokens predicted from the window alone,
    so every token but the text's first is scored exactly once and a token's context is its
    offset in its window. Unlike the held-out sample, nothing is drawn: the number is a
    function of the model and the text. Windows go through the model a batch at a time, the
    batch holding about as many tokens as `config.batch_size` training-length sequences."""
    rows: list[Measurement] = []
    targets_total = len(text) - 1
    tokens_per_call = config.batch_size * task.sequence_length(task.train_lengths[1])
    for length in task.eval_lengths:
        n = task.sequence_length(length)
        reason = model.encoding.supports(Span(0, n))
        if reason:
            rows += _not_applicable_rows(length, None, reason, TEXT_METRICS)
            continue
        full = targets_total // n
        pieces = [(text[: full * n].view(full, n), text[1 : full * n + 1].view(full, n))]
        if full * n < targets_total:  # the shorter last window
            pieces.append((text[full * n : -1][None], text[full * n + 1 :][None]))
        loss_sum = 0.0
        with seeded_draws(HELD_OUT_SEED + length):  # drawn positions: a function of the text
            for inputs, targets in pieces:
                for rows_at in range(0, len(inputs), max(1, tokens_per_call // n)):
                    chunk = slice(rows_at, rows_at + max(1, tokens_per_call // n))
                    logits = model(inputs[chunk].to(device))  # (B, n, V)
                    loss_sum += float(_token_losses(logits, targets[chunk].to(device)).sum())
        rows.append(Measurement(length, None, "text_loss", loss_sum / targets_total))
    return rows


#: Loss-by-position metrics: full context, strided sliding window, and their difference.
POSITION_METRICS = ("lm_loss", "lm_loss_window", "lm_penalty")


@dataclass(frozen=True)
class SlidingWindows:
    """The sliding windows of loss by position over the longest evaluation length E: windows of
    L tokens (L the longest training length) every L/2, the last one ending at E, each scoring
    the tokens no earlier window scored (the first window all of its own)."""

    starts: tuple[int, ...]
    widths: tuple[int, ...]
    firsts: tuple[int, ...]  # the first scored token of each window, counted in the window

    @classmethod
    def of(cls, task: Task) -> SlidingWindows:
        L, E = task.train_lengths[1], max(task.eval_lengths)
        stride = max(1, L // 2)
        starts = list(range(0, max(E - L, 0) + 1, stride))
        if starts[-1] + L < E:
            starts.append(E - L)
        widths = [min(L, E - s) for s in starts]
        firsts = [0] + [max(0, (starts[i - 1] + L) - s) for i, s in enumerate(starts) if i]
        return cls(tuple(starts), tuple(widths), tuple(firsts))

    def sequences_per_call(self, task: Task, config: EvalConfig) -> int:
        """Sequences whose windows go through the model in one call: about as many tokens as
        one evaluation batch of training-length sequences."""
        L = task.train_lengths[1]
        return max(1, config.batch_size * task.sequence_length(L) // (L * len(self.starts)))


@dataclass
class PositionLosses:
    """Per-token losses at the longest evaluation length E summed over its evaluation sample,
    gathered by the full-context evaluation there so that loss by position reads no sequence
    again, or by loss by position from its own reading: the full-context pass's (E,) and the
    sliding windows' (E,), each window's scored tokens. With `zero_from_full`, the window that
    starts at 0 is taken from the full-context pass, which reads the same (a model that
    continues_full_context: causal, no drawn positions, nothing read off the length)."""

    windows: SlidingWindows
    full: torch.Tensor
    window: torch.Tensor
    zero_from_full: bool
    sequences: int = 0

    @classmethod
    def empty(cls, task: Task, zero_from_full: bool = True) -> PositionLosses:
        E = task.sequence_length(max(task.eval_lengths))
        zeros = torch.zeros(E, dtype=torch.float64)
        return cls(SlidingWindows.of(task), zeros, zeros.clone(), zero_from_full)

    def add(
        self,
        model: Decoder,
        tokens: torch.Tensor,
        targets: torch.Tensor,
        logits: torch.Tensor,
        per_call: int,
        keep: int = 0,
    ) -> dict[int, torch.Tensor]:
        """Adds the losses of sequences `tokens` (B, E) whose full-context `logits` (B, E, V)
        are given; returns, with `keep`, each window's first `keep` logits (B, keep, V) by its
        start, for windows that start after 0 and hold that many tokens."""
        self.full += _token_losses(logits, targets).sum(0).cpu()
        self.sequences += tokens.shape[0]
        w = self.windows
        read = [i for i, s in enumerate(w.starts) if s > 0 or not self.zero_from_full]
        losses, heads = _read_windows(
            model,
            tokens,
            targets,
            [w.starts[i] for i in read],
            [w.widths[i] for i in read],
            per_call,
            keep,
        )
        for i, scored in zip(read, losses):
            s, width, first = w.starts[i], w.widths[i], w.firsts[i]
            self.window[s + first : s + width] += scored[first:]
        return heads

    def both(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean full-context and window losses by token, (E,) each."""
        window = self.window.clone()
        if self.zero_from_full:  # the first window starts at 0
            width = self.windows.widths[0]
            window[:width] = self.full[:width]
        return self.full / self.sequences, window / self.sequences


def _read_windows(
    model: Decoder,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    starts: list[int],
    widths: list[int],
    per_call: int,
    keep: int = 0,
) -> tuple[list[torch.Tensor], dict[int, torch.Tensor]]:
    """Each window of `tokens` (B, T) read alone: its per-token losses summed over the
    sequences, one (w,) per window, and, with `keep`, its first `keep` logits (B, keep, V) by
    start where it holds that many. Windows of one width go through the model as one batch of
    sequences, `per_call` sequences' windows a call, except where the encoding draws positions
    (a draw per window)."""
    if not starts:
        return [], {}
    if not model.encoding.draws_positions and len(set(widths)) == 1:
        width = widths[0]
        index = torch.tensor(starts, device=tokens.device)[:, None] + torch.arange(
            width, device=tokens.device
        )  # (n, w)
        losses, heads = [], []
        for part, goal in zip(tokens[:, index].split(per_call), targets[:, index].split(per_call)):
            logits = model(part.flatten(0, 1))  # (b * n, w, V)
            losses.append(_token_losses(logits, goal.flatten(0, 1)).view(part.shape).sum(0))
            if keep and width >= keep:
                heads.append(logits[:, :keep].unflatten(0, part.shape[:2]))  # (b, n, keep, V)
        summed = torch.stack(losses).sum(0).cpu()  # (n, w)
        kept = torch.cat(heads) if heads else None
        return list(summed), {} if kept is None else {s: kept[:, i] for i, s in enumerate(starts)}
    losses, found = [], {}
    for s, w in zip(starts, widths):
        logits = model(tokens[:, s : s + w])  # (B, w, V)
        losses.append(_token_losses(logits, targets[:, s : s + w]).sum(0).cpu())
        if keep and w >= keep:
            found[s] = logits[:, :keep]
    return losses, found


@torch.no_grad()
def position_rows(
    model: Decoder,
    task: Task,
    config: EvalConfig,
    device: torch.device | str = "cpu",
    losses: PositionLosses | None = None,
) -> list[Measurement]:
    """Next-token loss by position at the longest evaluation length E, in bins of L/4 positions
    (L the longest training length; each row's eval_len is E and its position the bin's last
    position, counted in tokens of context). Full context sees every earlier token. The sliding
    window re-reads the sequence in windows of L tokens every L/2 (SlidingWindows), each
    scoring its last L/2 tokens (the first window all of them), with positions restarting in
    every window, so no token is ever seen at a position the model was not trained on; a
    window's sequences are read as one batch, or one window per forward call where the
    encoding draws positions (a draw per window). Both are read from `losses` when the
    full-context evaluation at E gathered them, else from the sample here.
    lm_penalty = full - window at the same tokens: the cost of the positions themselves, with
    whatever position dependence the data has removed."""
    L, E = task.train_lengths[1], max(task.eval_lengths)
    reason = model.encoding.supports(Span(0, E))
    bins = list(range(0, E, max(1, L // 4)))
    if reason:
        return [
            m
            for start in bins
            for m in _not_applicable_rows(
                E, None, reason, POSITION_METRICS, min(start + max(1, L // 4), E)
            )
        ]
    if losses is None:
        losses = PositionLosses.empty(task, zero_from_full=False)
        per_call = losses.windows.sequences_per_call(task, config)
        with seeded_draws(HELD_OUT_SEED + E):  # drawn positions, if any: of the sample alone
            for batch in held_out(task, E, config):
                tokens, targets = batch.tokens.to(device), batch.targets.to(device)  # (B, E)
                losses.add(model, tokens, targets, model(tokens), per_call)
    windows = losses.windows
    scored = torch.zeros(E, dtype=torch.float64)
    for s, w, first in zip(windows.starts, windows.widths, windows.firsts):
        scored[s + first : s + w] += 1  # each window scores what no earlier one did
    assert bool((scored == 1).all()), "every position is scored by exactly one window"
    full, window = losses.both()
    rows: list[Measurement] = []
    width = max(1, L // 4)
    for start in bins:
        stop = min(start + width, E)
        f, w = float(full[start:stop].mean()), float(window[start:stop].mean())
        rows += [
            Measurement(E, None, "lm_loss", f, position=stop),
            Measurement(E, None, "lm_loss_window", w, position=stop),
            Measurement(E, None, "lm_penalty", f - w, position=stop),
        ]
    return rows


def _token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (B, T), 0 where the target is IGNORE."""
    losses = F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="none"
    )
    return losses.view(targets.shape).double()


#: Every metric iter_evaluate yields: a run's evaluation rows, apart from what training and the
#: reachability count add to its measurements.
EVALUATION_METRICS = frozenset(
    ("exact_match", "token_accuracy", "loss", "loss_floor", "excess_loss")
    + FREE_RUNNING_METRICS
    + POSITION_METRICS
    + TEXT_METRICS
)


def evaluate(
    model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu"
) -> list[Measurement]:
    """All of iter_evaluate's measurements as a list."""
    return list(iter_evaluate(model, task, config, device))


def evaluation_memory_bytes(model: Decoder, task: Task, config: EvalConfig, length: int) -> int:
    """A rough upper estimate of the memory evaluating `length` in full context takes: the
    largest attention-side tensor (with a copy: bias and weights) plus one evaluation batch's
    hidden states, projections, feed-forward activations and logits, and the keys and values
    of every layer that the pass keeps for the readings that continue from it."""
    tokens = task.sequence_length(length)
    batch = min(config.batch_size, config.n_samples)
    size = model.config
    d_ff = size.d_ff or 4 * size.d_model
    attention = attention_tensor_bytes(model.encoding, batch, tokens)
    activations = 4 * batch * tokens * (size.vocab_size + d_ff + 6 * size.d_model)
    kept = 4 * batch * tokens * 2 * size.d_model * size.n_layers
    return 2 * attention + activations + kept
