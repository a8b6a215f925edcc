"""Accuracy at each evaluation length, on the whole sequence and through caches of several
sizes (Transformer-XL style). Teacher-forced argmax: for whole-answer exact match it equals
greedy decoding."""
from __future__ import annotations

import math
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
VALIDATION_SEED = 2_000_003  # the early-stopping sample: never the evaluation sample


@dataclass
class Measurement:
    """One tidy measurement; value is NaN with a note when it is not applicable."""

    eval_len: int
    mem_len: float | None  # None: full context; math.inf: an unbounded cache
    metric: str
    value: float
    note: str = ""


def held_out(task: Task, length: int, config: EvalConfig, seed: int = HELD_OUT_SEED) -> Iterator[Batch]:
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


def mem_lens(task: Task, config: EvalConfig) -> list[int | None]:
    """The memory sizes M of the cache sweep, from multiples of S (inf: unbounded)."""
    segment = default_segment_len(task, config)
    out: list[int | None] = []
    for factor in config.mem_len_factors:
        m = None if math.isinf(factor) else int(round(factor * segment))
        if m not in out:
            out.append(m)
    return out


@torch.no_grad()
def _logits(model: Decoder, tokens: torch.Tensor, segment: int | None, mem_len: int | None) -> torch.Tensor:
    if segment is None:
        return model(tokens)
    cache = model.new_cache(mem_len=mem_len, length=tokens.shape[1])
    return torch.cat([model(tokens[:, s : s + segment], cache=cache) for s in range(0, tokens.shape[1], segment)], dim=1)


def _accuracy(
    model: Decoder, task: Task, length: int, config: EvalConfig, device: torch.device | str,
    segment: int | None = None, mem_len: int | None = None, seed: int = HELD_OUT_SEED,
) -> dict[str, float]:
    exact = correct = answers = sequences = 0
    loss_sum = 0.0
    with seeded_draws(seed + length):  # drawn positions, if any: a function of the sample alone
        for batch in held_out(task, length, config, seed):
            batch = batch.to(device)
            logits = _logits(model, batch.tokens, segment, mem_len)  # (B, T, V)
            mask = batch.targets != IGNORE
            hit = (logits.argmax(-1) == batch.targets) & mask
            exact += int((hit | ~mask).all(dim=1).sum())
            correct += int(hit.sum())
            answers += int(mask.sum())
            sequences += batch.tokens.shape[0]
            loss_sum += float(F.cross_entropy(logits[mask], batch.targets[mask], reduction="sum"))
    scores = {"exact_match": exact / sequences, "token_accuracy": correct / answers, "loss": loss_sum / answers}
    if not task.exact_match_meaningful:
        del scores["exact_match"]
    return scores


def _not_applicable(length: int, mem_len: float | None, reason: str, metrics: tuple[str, ...] = ("exact_match", "token_accuracy", "loss")) -> list[Measurement]:
    return [Measurement(length, mem_len, m, float("nan"), reason) for m in metrics]


def _metrics(task: Task) -> tuple[str, ...]:
    return ("exact_match", "token_accuracy", "loss") if task.exact_match_meaningful else ("token_accuracy", "loss")


def validation_exact_match(model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu") -> float:
    """Mean exact match over the training range (its shortest, middle and longest length) on a
    sample of its own, disjoint from the evaluation sample: the early-stopping signal."""
    lo, hi = task.train_lengths
    lengths = sorted({lo, (lo + hi) // 2, hi})
    model.eval()
    scores = [_accuracy(model, task, n, config, device, seed=VALIDATION_SEED)["exact_match"] for n in lengths]
    return sum(scores) / len(scores)


def iter_evaluate(model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu") -> Iterator[Measurement]:
    """Every measurement of a trained model, one length at a time (so a failure at a long
    length keeps the shorter ones): full context at each evaluation length, then through
    caches of each memory size at the cache-evaluation lengths."""
    model.eval()
    for length in task.eval_lengths:
        reason = model.encoding.supports(Span(0, task.sequence_length(length)))
        if reason:
            yield from _not_applicable(length, None, reason, _metrics(task))
            continue
        for k, v in _accuracy(model, task, length, config, device).items():
            yield Measurement(length, None, k, v)
    segment = default_segment_len(task, config)
    cache_lengths = config.cache_eval_lengths or task.eval_lengths
    for length in cache_lengths:
        reason = model.encoding.supports(Span(0, task.sequence_length(length)))
        for mem_len in mem_lens(task, config):
            stored_mem = math.inf if mem_len is None else mem_len
            if reason:
                yield from _not_applicable(length, stored_mem, reason, _metrics(task))
                continue
            acc = _accuracy(model, task, length, config, device, segment, mem_len)
            for k, v in acc.items():
                yield Measurement(length, stored_mem, k, v)
    if task.per_position:
        yield from position_rows(model, task, config, device)


#: Loss-by-position metrics: full context, strided sliding window, and their difference.
POSITION_METRICS = ("lm_loss", "lm_loss_window", "lm_penalty")


@torch.no_grad()
def position_rows(model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu") -> list[Measurement]:
    """Next-token loss by position at the longest evaluation length E, in bins of L/4 positions
    (L the longest training length; eval_len is a bin's last position, counted in tokens of
    context). Full context sees every earlier token. The sliding window re-reads the sequence
    in windows of L tokens every L/2, each scoring its last L/2 tokens (the first window all
    of them), with positions restarting in every window, so no token is ever seen at a
    position the model was not trained on. lm_penalty = full - window at the same tokens: the
    cost of the positions themselves, with whatever position dependence the data has removed."""
    L, E = task.train_lengths[1], max(task.eval_lengths)
    reason = model.encoding.supports(Span(0, E))
    bins = list(range(0, E, max(1, L // 4)))
    if reason:
        return [m for start in bins for m in _not_applicable(min(start + max(1, L // 4), E), None, reason, POSITION_METRICS)]
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
                losses = _token_losses(model(tokens[:, s : s + w]), targets[:, s : s + w]).sum(0).cpu()  # (w,)
                first = 0 if i == 0 else max(0, (starts[i - 1] + L) - s)  # score what no earlier window scored
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
        rows += [Measurement(stop, None, "lm_loss", f), Measurement(stop, None, "lm_loss_window", w),
                 Measurement(stop, None, "lm_penalty", f - w)]
    return rows


def _token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (B, T), 0 where the target is IGNORE."""
    losses = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="none")
    return losses.view(targets.shape).double()


def evaluate(model: Decoder, task: Task, config: EvalConfig, device: torch.device | str = "cpu") -> list[Measurement]:
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
