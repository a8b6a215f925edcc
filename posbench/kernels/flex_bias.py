"""Attention whose bias is a function of (head, i - j) alone, through
``torch.nn.attention.flex_attention``: a score_mod reads the bias from a per-distance table
(H, n) at the positions of the query and the key, and a block mask skips the blocks causality
rules out, so no (H, Lq, Lk) bias exists on either pass. Compiled on CUDA, where it is fused;
elsewhere flex_attention's eager implementation (forward only) serves the equality tests."""

from __future__ import annotations

import functools
import warnings
from contextlib import AbstractContextManager
from typing import Callable

import torch
from torch import Tensor

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


_broken: list[str] = []  # why flex_attention failed in this process, once it has

#: flex_attention's compiled kernels take heads at least this wide (torch 2.11 on CUDA refuses
#: narrower ones at compile time); narrower heads keep the SDPA and dense-bias path.
MIN_HEAD_DIM = 16

#: How many compiled variants of flex_attention one process may hold. Its guards split on grad
#: mode, on whether the table needs a gradient, on a batch of one and on queries shorter than
#: flex's decoding size (128): up to 16 variants (one CUDA `posbench bench` of five encodings
#: recompiled 9 times). torch's default of 8 sends the rest to flex's unfused eager path, which
#: forms the (B, H, Lq, Lk) scores flex exists to avoid.
RECOMPILE_LIMIT = 32


def flex_available(device: torch.device, head_dim: int) -> bool:
    """Whether attention on `device` with heads `head_dim` wide runs through flex_attention:
    CUDA with a torch that has it, heads of at least MIN_HEAD_DIM, unless flex already failed
    in this process (see flex_failed)."""
    if device.type != "cuda" or head_dim < MIN_HEAD_DIM or _broken:
        return False
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:  # pragma: no cover - torch older than 2.5
        return False
    return True


def flex_failed(error: Exception) -> None:
    """Turn the flex path off for this process after `error`, with one warning: attention then
    takes the SDPA and dense-bias path, which gives the same numbers more slowly."""
    _broken.append(f"{type(error).__name__}: {error}".splitlines()[0])
    warnings.warn(
        f"flex_attention failed on this machine ({_broken[0]}); attention uses SDPA with a dense "
        "bias from now on, slower but the same numbers.",
        RuntimeWarning,
    )


def distance_score_mod(values: Tensor, lo: int, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
    """score + values[h, p_q - p_k - lo]: values (H, n) over distances lo .. lo + n - 1, q_pos
    (Lq,) and k_pos (Lk,) the positions of the query and key tokens (drawn ones included)."""

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + values[h, q_pos[q_idx] - k_pos[kv_idx] - lo]

    return score_mod


def dense_score_mod(score_mod: ScoreMod, scores: Tensor) -> Tensor:
    """`score_mod` applied to every entry of scores (B, H, Lq, Lk) by broadcasting its index
    arguments, as flex_attention's eager path evaluates it: the reference that tests compare
    against the math path, gradients included, on machines where flex has no backward."""
    B, H, Lq, Lk = scores.shape
    device = scores.device
    b = torch.arange(B, device=device)[:, None, None, None]
    h = torch.arange(H, device=device)[None, :, None, None]
    q_idx = torch.arange(Lq, device=device)[None, None, :, None]
    kv_idx = torch.arange(Lk, device=device)[None, None, None, :]
    return score_mod(scores, b, h, q_idx, kv_idx)


@functools.lru_cache(maxsize=32)
def _causal_block_mask(q_len: int, k_len: int, device: torch.device):  # noqa: ANN202
    """Key j is seen by query i (the last q_len of k_len tokens) when j <= i + k_len - q_len."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = k_len - q_len

    def causal(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= q_idx + offset

    return create_block_mask(causal, None, None, q_len, k_len, device=device)


@functools.lru_cache(maxsize=1)
def _compiled_flex():  # noqa: ANN202
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def _recompile_limit() -> AbstractContextManager[object]:
    """torch's recompile limit raised to RECOMPILE_LIMIT while the compiled flex runs (older
    torch calls it cache_size_limit)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch(name, max(getattr(config, name), RECOMPILE_LIMIT))


def flex_distance_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    values: Tensor,
    lo: int,
    q_pos: Tensor,
    k_pos: Tensor,
    scale: float,
    causal: bool,
) -> Tensor:
    """softmax(scale * q k^T + values[h, p_i - p_j - lo]) v for q (B, H, Lq, d), k and v
    (B, H, Lk, d), causal over the last Lq of Lk tokens when asked."""
    from torch.nn.attention.flex_attention import flex_attention

    block_mask = _causal_block_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    # One memory layout for every call: the compiled kernel guards on strides, and q, k, v
    # arrive as views of the projection or as a cache's own tensors.
    q, k, v = (t.contiguous() for t in (q, k, v))
    values, q_pos, k_pos = (t.contiguous() for t in (values.to(q.dtype), q_pos, k_pos))
    score_mod = distance_score_mod(values, lo, q_pos, k_pos)
    if q.device.type == "cuda":
        with _recompile_limit():
            return _compiled_flex()(
                q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale
            )
    with warnings.catch_warnings():  # eager on purpose here: its "use torch.compile" advice
        warnings.simplefilter("ignore", UserWarning)
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
