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
from posbench.config import EvalConfig
from posbench.encodings.base import Span
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
    remaining = config.n_samples
    while remaining > 0:
        size = min(config.batch_size, remaining)
        yield task.batch(length, size, generator)
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
    cache = model.new_cache(mem_len=mem_len)
    return torch.cat([model(tokens[:, s : s + segment], cache=cache) for s in range(0, tokens.shape[1], segment)], dim=1)


def _accuracy(
    model: Decoder, task: Task, length: int, config: EvalConfig, device: torch.device | str,
    segment: int | None = None, mem_len: int | None = None, seed: int = HELD_OUT_SEED,
) -> dict[str, float]:
    exact = correct = answers = sequences = 0
    loss_sum = 0.0
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
    return {"exact_match": exact / sequences, "token_accuracy": correct / answers, "loss": loss_sum / answers}


def _not_applicable(length: int, mem_len: float | None, reason: str) -> list[Measurement]:
    return [Measurement(length, mem_len, m, float("nan"), reason) for m in ("exact_match", "token_accuracy", "loss")]


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
            yield from _not_applicable(length, None, reason)
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
                yield from _not_applicable(length, stored_mem, reason)
                continue
            acc = _accuracy(model, task, length, config, device, segment, mem_len)
            for k, v in acc.items():
                yield Measurement(length, stored_mem, k, v)


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
