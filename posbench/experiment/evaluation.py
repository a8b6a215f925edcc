"""Accuracy at each evaluation length, on the whole sequence and through caches of several
sizes (Transformer-XL style). Teacher-forced argmax: for whole-answer exact match it equals
greedy decoding. Full-context evaluation also decodes greedily (free running), so token
accuracy can be read both ways: teacher-forced token accuracy credits a token read after the
model's first mistake; greedy token accuracy does not. Free running feeds answers back only
where a task's answers are its next inputs (Task.answers_fed_back); elsewhere it equals
teacher forcing, and its rows say so."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F

from posbench.attention import attention_tensor_bytes
from posbench.experiment.config import EvalConfig
from posbench.encodings.base import Span
from posbench.encodings.positions import seeded_draws
from posbench.model import Decoder
from posbench.tasks.base import IGNORE, Batch, Task

HELD_OUT_SEED = 1_000_003  # the held-out sample per length is the same for every run
#: Randomized positions are drawn once per forward call, shared by the sequences in it (as Ruoss
#: et al.'s code draws them in training); evaluation reads each length in at least this many
#: calls, so its accuracy averages at least this many draws rather than one or two.
POSITION_DRAWS = 32
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


@torch.no_grad()
def _logits(
    model: Decoder, tokens: torch.Tensor, segment: int | None, mem_len: float
) -> torch.Tensor:
    if segment is None:
        return model(tokens)
    cache = model.new_cache(mem_len=mem_len, length=tokens.shape[1])
    return torch.cat(
        [
            model(tokens[:, s : s + segment], cache=cache)
            for s in range(0, tokens.shape[1], segment)
        ],
        dim=1,
    )


@torch.no_grad()
def greedy_predictions(model: Decoder, tokens: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """Free-running decoding: the model's argmax at every position (B, T), where each answer
    token the model reads is its own earlier prediction rather than the true token (so after
    its first mistake it continues from that mistake). Only for a task whose answers are its
    next inputs (Task.answers_fed_back): the prediction at t is written into the input at
    t + 1. Tokens off the answer are read as given.
    Decodes one token at a time through an unbounded cache when the encoding is cache
    consistent, else recomputes the prefix at every step. A bidirectional model emits every
    answer at once from blanks, reading none of its answers: its one forward pass is free
    running."""
    if not model.config.causal:
        return model(tokens).argmax(-1)
    B, T = tokens.shape
    columns = answer.any(dim=0).nonzero()
    predictions = torch.zeros_like(tokens)
    if len(columns) == 0:
        return predictions
    first = int(columns[0])  # logits here predict the first answer token
    inputs = tokens.clone()
    if model.encoding.cache_consistent:
        cache = model.new_cache(mem_len=math.inf, length=T)
        logits = model(inputs[:, : first + 1], cache=cache)  # (B, first + 1, V)
        predictions[:, : first + 1] = logits.argmax(-1)
        for t in range(first, T - 1):
            inputs[:, t + 1] = torch.where(answer[:, t], predictions[:, t], tokens[:, t + 1])
            predictions[:, t + 1] = model(inputs[:, t + 1 : t + 2], cache=cache)[:, -1].argmax(-1)
        return predictions
    predictions[:, : first + 1] = model(inputs[:, : first + 1]).argmax(-1)
    for t in range(first, T):
        if t > first:
            predictions[:, t] = model(inputs[:, : t + 1])[:, -1].argmax(-1)
        if t + 1 < T:
            inputs[:, t + 1] = torch.where(answer[:, t], predictions[:, t], tokens[:, t + 1])
    return predictions


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
    decoding: dict[str, float] | None = None,
) -> dict[str, float]:
    """Exact match, teacher-forced token accuracy and loss on the held-out sample of `length`;
    with `free_running`, also greedy token accuracy (the model reads its own answers), the mean
    correct-prefix length in answer tokens, and the chance level (always answering each answer
    position's most frequent token of an independent sample: see chance_hits); `by_position`, when
    given, receives one row per answer position (counted from the first answer token) with its
    teacher-forced and greedy accuracy; `decoding`'s one entry receives the seconds spent on
    free-running decoding."""
    exact = correct = answers = sequences = greedy = prefix = 0
    loss_sum = 0.0
    counts: dict[int, torch.Tensor] = {}
    position_hits: dict[
        int, list[int]
    ] = {}  # answer column -> [answers, teacher-forced hits, greedy hits]
    with seeded_draws(seed + length):  # drawn positions, if any: a function of the sample alone
        for batch in _forward_calls(model, held_out(task, length, config, seed), config):
            batch = batch.to(device)
            logits = _logits(model, batch.tokens, segment, mem_len)  # (B, T, V)
            mask = batch.targets != IGNORE
            hit = (logits.argmax(-1) == batch.targets) & mask
            exact += int((hit | ~mask).all(dim=1).sum())
            correct += int(hit.sum())
            answers += int(mask.sum())
            sequences += batch.tokens.shape[0]
            loss_sum += float(F.cross_entropy(logits[mask], batch.targets[mask], reduction="sum"))
            if free_running:
                started = time.perf_counter()
                free_hit = (
                    (greedy_predictions(model, batch.tokens, mask) == batch.targets) & mask
                    if task.answers_fed_back
                    else hit  # the model never reads its answers: free running is teacher forcing
                )
                if decoding is not None:
                    (part,) = decoding
                    decoding[part] += time.perf_counter() - started
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
    scores = {
        "exact_match": exact / sequences,
        "token_accuracy": correct / answers,
        "loss": loss_sum / answers,
    }
    if free_running:
        scores["greedy_token_accuracy"] = greedy / answers
        scores["correct_prefix"] = prefix / sequences
        scores["chance_token_accuracy"] = chance_hits(task, length, config, counts) / answers
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
    decoding: dict[str, float] | None = None,
) -> Iterator[Measurement]:
    """Every measurement of a trained model, one length at a time (so a failure at a long
    length keeps the shorter ones): full context at each evaluation length, then through
    caches of each memory size at the cache-evaluation lengths, then (a language task) loss by
    position and (a corpus) the whole held-out text at each length. `by_position` receives the
    full-context accuracy by answer position (see _accuracy); `decoding`'s one entry receives
    the seconds spent on free-running decoding. A bidirectional model (a task's encoder form) is
    evaluated at full context only."""
    model.eval()
    for length in task.eval_lengths:
        reason = model.encoding.supports(Span(0, task.sequence_length(length)))
        if reason:
            yield from _not_applicable_rows(length, None, reason, _metrics(task, free_running=True))
            continue
        scores = _accuracy(
            model,
            task,
            length,
            config,
            device,
            free_running=task.exact_match_meaningful,
            by_position=by_position,
            decoding=decoding,
        )
        for k, v in scores.items():
            read_back = k in ("greedy_token_accuracy", "correct_prefix")
            note = NOT_FED_BACK if read_back and not task.answers_fed_back else ""
            yield Measurement(length, None, k, v, note)
        floor = task.loss_floor(length)
        if floor is not None:
            yield Measurement(length, None, "loss_floor", floor)
            yield Measurement(length, None, "excess_loss", scores["loss"] - floor)
    segment = default_segment_len(task, config)
    # a cache continues causal attention only: a bidirectional model reads whole sequences
    chosen = task.eval_lengths if config.cache_eval_lengths is None else config.cache_eval_lengths
    cache_lengths = chosen if model.config.causal else ()  # () from the config: no cache reads
    for length in cache_lengths:
        reason = model.encoding.supports(Span(0, task.sequence_length(length)))
        for mem_len in mem_lens(task, config):
            if reason:
                yield from _not_applicable_rows(length, mem_len, reason, _metrics(task))
                continue
            acc = _accuracy(model, task, length, config, device, segment, mem_len)
            for k, v in acc.items():
                yield Measurement(length, mem_len, k, v)
    if task.per_position:
        yield from position_rows(model, task, config, device)
    text = task.evaluation_text()
    if text is not None:
        yield from text_rows(model, task, text, config, device)


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


@torch.no_grad()
def position_rows(
    model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu"
) -> list[Measurement]:
    """Next-token loss by position at the longest evaluation length E, in bins of L/4 positions
    (L the longest training length; each row's eval_len is E and its position the bin's last
    position, counted in tokens of context). Full context sees every earlier token. The sliding
    window re-reads the sequence
    in windows of L tokens every L/2, each scoring its last L/2 tokens (the first window all
    of them), with positions restarting in every window, so no token is ever seen at a
    position the model was not trained on. lm_penalty = full - window at the same tokens: the
    cost of the positions themselves, with whatever position dependence the data has removed."""
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
    stride = max(1, L // 2)
    starts = list(range(0, max(E - L, 0) + 1, stride))
    if starts[-1] + L < E:
        starts.append(E - L)
    full = torch.zeros(E, dtype=torch.float64)
    window = torch.zeros(E, dtype=torch.float64)
    count = 0
    with seeded_draws(HELD_OUT_SEED + E):  # drawn positions, if any: a function of the sample alone
        for batch in held_out(task, E, config):
            tokens, targets = batch.tokens.to(device), batch.targets.to(device)  # (B, E)
            full += _token_losses(model(tokens), targets).sum(0).cpu()
            scored = torch.zeros(E, dtype=torch.float64)
            for i, s in enumerate(starts):
                w = min(L, E - s)
                losses = (
                    _token_losses(model(tokens[:, s : s + w]), targets[:, s : s + w]).sum(0).cpu()
                )  # (w,)
                first = (
                    0 if i == 0 else max(0, (starts[i - 1] + L) - s)
                )  # score what no earlier window scored
                window[s + first : s + w] += losses[first:]
                scored[s + first : s + w] += 1
            assert bool((scored == 1).all()), "every position is scored by exactly one window"
            count += tokens.shape[0]
    full, window = full / count, window / count
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


def evaluate(
    model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu"
) -> list[Measurement]:
    """All of iter_evaluate's measurements as a list."""
    return list(iter_evaluate(model, task, config, device))


def evaluation_memory_bytes(model: Decoder, task: Task, config: EvalConfig, length: int) -> int:
    """A rough upper estimate of the memory evaluating `length` in full context takes: the
    largest attention-side tensor (with a copy: bias and weights) plus one evaluation batch's
    hidden states, projections, feed-forward activations and logits."""
    tokens = task.sequence_length(length)
    batch = min(config.batch_size, config.n_samples)
    size = model.config
    d_ff = size.d_ff or 4 * size.d_model
    attention = attention_tensor_bytes(model.encoding, batch, tokens)
    activations = 4 * batch * tokens * (size.vocab_size + d_ff + 6 * size.d_model)
    return 2 * attention + activations
