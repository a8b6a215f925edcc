"""One training loop for every encoding: AdamW, linear warmup then cosine decay, clipping,
a fixed number of steps, one length drawn per batch from the task's training range."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from posbench.attention import attention_tensor_bytes
from posbench.experiment.config import TrainConfig
from posbench.model import Decoder
from posbench.tasks.base import IGNORE, Batch, Task

StepCallback = Callable[[int, float], None]
#: Called every config.check_every steps with the step count done; True stops training.
StopCheck = Callable[[int], bool]
#: Devices whose AdamW runs as one fused kernel: the same update as the per-parameter loop, up
#: to float rounding, about 9x faster on CPU for these models' 50-odd small parameters, where
#: the loop cost 15-20% of a training step.
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


class Diverged(RuntimeError):
    """Training produced a NaN or infinite loss."""


@dataclass
class TrainResult:
    """What training measured: the loss curve (every `log_every` steps) and timing."""

    losses: list[tuple[int, float]]
    final_loss: float
    seconds: float
    steps_done: int
    #: Steps after which the stop check first passed (None: never, or no check).
    steps_to_threshold: int | None = None


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warmup over warmup_steps, then cosine decay to min_lr at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.min_lr + (config.lr - config.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def parameter_groups(model: torch.nn.Module, config: TrainConfig) -> list[dict[str, Any]]:
    """AdamW's parameter groups: one, or with decay_matrices_only the weights (two or more
    dimensions) decayed and the biases and LayerNorm gains not."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not config.decay_matrices_only:
        return [{"params": params, "weight_decay": config.weight_decay}]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def sequence_loss(model: Decoder, batch: Batch) -> torch.Tensor:
    """Mean cross-entropy over the answer tokens of a batch, whole sequences at once."""
    logits = model(batch.tokens)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE)


def recurrent_loss(model: Decoder, batch: Batch, segment_len: int, mem_len: int) -> torch.Tensor:
    """Transformer-XL training: segments through a cache of mem_len detached positions."""
    cache = model.new_cache(mem_len=mem_len, length=batch.tokens.shape[1])
    total, count = batch.tokens.new_zeros((), dtype=torch.float32), 0
    for start in range(0, batch.tokens.shape[1], segment_len):
        tokens = batch.tokens[:, start : start + segment_len]
        targets = batch.targets[:, start : start + segment_len]
        logits = model(tokens, cache=cache)
        n = int((targets != IGNORE).sum())
        if n:
            total = total + F.cross_entropy(
                logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum"
            )
            count += n
    return total / max(count, 1)


def train(
    model: Decoder,
    task: Task,
    config: TrainConfig,
    seed: int,
    device: torch.device | str = "cpu",
    on_step: StepCallback | None = None,
    log_every: int = 50,
    should_stop: StopCheck | None = None,
) -> TrainResult:
    """Train `model` on `task` for config.steps steps, or until `should_stop` (asked every
    config.check_every steps) says so; raises Diverged on a non-finite loss."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(
        parameter_groups(model, config),
        lr=config.lr,
        betas=(0.9, config.beta2),
        fused=torch.device(device).type in FUSED_ADAMW_DEVICES,
    )
    generator = torch.Generator().manual_seed(seed)
    lo, hi = task.train_lengths
    segment = config.train_segment_len or config.train_mem_len
    losses: list[tuple[int, float]] = []
    start_time = time.perf_counter()
    loss_value = float("nan")
    for step in range(config.steps):
        length = int(torch.randint(lo, hi + 1, (1,), generator=generator))
        batch = task.batch(length, config.batch_size, generator).to(device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        if config.train_mem_len is not None:
            loss = recurrent_loss(model, batch, segment, config.train_mem_len)
        else:
            loss = sequence_loss(model, batch)
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            raise Diverged(f"loss became {loss_value} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        if step % log_every == 0 or step == config.steps - 1:
            losses.append((step, loss_value))
        if on_step is not None:
            on_step(step, loss_value)
        done = step + 1
        if should_stop is not None and done % config.check_every == 0 and done < config.steps:
            stopped = should_stop(done)
            model.train()
            if stopped:
                losses.append((step, loss_value))
                return TrainResult(losses, loss_value, time.perf_counter() - start_time, done, done)
    return TrainResult(losses, loss_value, time.perf_counter() - start_time, config.steps)


def training_memory_bytes(model: Decoder, task: Task, config: TrainConfig) -> int:
    """A rough lower estimate of the memory one training step at the longest training length
    takes: every layer keeps its attention-side tensor (scores and weights) and activations for
    the backward pass, plus the logits. Enough to refuse a batch that cannot fit before any
    allocator does so with its own message."""
    tokens = task.sequence_length(task.train_lengths[1])
    if config.train_segment_len:
        tokens = min(tokens, config.train_segment_len)
    size = model.config
    d_ff = size.d_ff or 4 * size.d_model
    attention = attention_tensor_bytes(model.encoding, config.batch_size, tokens)
    per_layer = 2 * attention + 4 * config.batch_size * tokens * (d_ff + 6 * size.d_model)
    return size.n_layers * per_layer + 4 * config.batch_size * tokens * size.vocab_size
