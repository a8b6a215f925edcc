"""CoPE (Golovneva et al. 2024): contextual positions, counted by gates the content opens."""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.kernels.bias_types import RowBlockBias, Scores
from posbench.validation import Range


@register_encoding("cope")
class CoPE(PositionalEncoding):
    """CoPE (Golovneva et al. 2024): positions are sums of gates sigmoid(q . k), so the bias depends
    on content.

    With z_ij = q_i . k_j / sqrt(d) (future keys masked), g_ij = sigmoid(z_ij) and the position
    of key j for query i is p_ij = sum_{t=j..i} g_it, clamped to ``npos_max`` - 1. The added
    logit is q_i . e[p_ij], interpolated linearly between the learned embeddings e of the two
    integer positions around p_ij (e: one (d, npos_max) table per layer, shared by the heads,
    initialised to zero), as the paper's reference code. A position counts what the gates open
    on (words, sentences), not tokens, so CoPE is not relative in tokens (declared).
    """

    relative = False  # positions are counted in gated content, not in i - j
    pairwise = False  # p_ij counts the gates of every key between j and i
    cost_note = (
        "positions depend on content: gates, a reverse cumulative sum and two gathers per "
        "pair, formed a block of query rows at a time and again in the backward pass, so no "
        "(B, H, L, L) tensor is kept"
    )

    def __init__(
        self, shape: AttentionShape, *, npos_max: Annotated[int, Range(ge=2)] = 64
    ) -> None:
        super().__init__(shape)
        self.npos_max = npos_max
        self.pos_emb = nn.Parameter(torch.zeros(shape.n_layers, shape.d_head, npos_max))

    def score(
        self, q: Tensor, k: Tensor, q_span: Span, k_span: Span, layer: LayerContext
    ) -> Scores:
        scale = 1.0 / math.sqrt(self.d_head)
        table = self.pos_emb[layer.index].to(q.dtype)  # (d, npos_max)

        def own_keys(r0: int, r1: int) -> Tensor | None:
            """Each query row's own key when causal (the last q_len keys are the queries)."""
            if not self.causal:
                return None
            return torch.arange(r0, r1, device=q.device) + (k.shape[2] - q.shape[2])

        def rows(r0: int, r1: int, keys: int, content: Tensor | None) -> Tensor:
            """The bias of query rows r0..r1-1 against keys 0..keys-1, (B, H, rows, keys),
            from those pairs' content logits scale * q . k (formed here when not given)."""
            q_rows = q[:, :, r0:r1]
            if content is None:
                content = scale * (q_rows @ k[:, :, :keys].transpose(-1, -2))
            own = own_keys(r0, r1)
            return _contextual_bias(q_rows, content, table, own, self.npos_max)["bias"]

        def attend(
            r0: int,
            r1: int,
            q_rows: Tensor,
            k_rows: Tensor,
            v: Tensor,
            mask: Tensor | None,
            scale: float,
        ) -> Tensor:
            own = own_keys(r0, r1)
            return _CopeBlock.apply(q_rows, k_rows, v, table, own, mask, scale, self.npos_max)

        return Scores(q, k, RowBlockBias(rows, q.shape[2], k.shape[2], attend), scale)


def _contextual_bias(
    q: Tensor, content: Tensor, table: Tensor, own: Tensor | None, npos: int
) -> dict[str, Tensor]:
    """CoPE's bias for query rows q (B, H, R, d) from their content logits (B, H, R, K), with
    the intermediates the hand-written backward pass reads (each (B, H, R, K))."""
    gates = torch.sigmoid(content)
    # p_ij = sum of the gates from key j to query i: the running sum at the query's own key
    # less the running sum before j. Later keys' gates never enter it, so they need no
    # masking (their positions come out <= 0 and attention masks them).
    running = gates.cumsum(-1)
    if own is not None:
        total = running.gather(-1, own.view(1, 1, -1, 1).expand(*running.shape[:-1], 1))
    else:
        total = running[..., -1:]
    raw = total - running + gates
    positions = raw.clamp(0, npos - 1)
    floor = positions.floor()
    weight = positions - floor  # interpolation weight of the next integer position
    index = floor.long()
    at_integers = torch.matmul(q, table)  # (B, H, R, npos)
    slopes = F.pad(at_integers.diff(dim=-1), (0, 1))  # to the next integer position
    slope = slopes.gather(-1, index)
    return {
        "bias": at_integers.gather(-1, index).add_(weight * slope),
        "gates": gates,
        "inside": (raw >= 0) & (raw <= npos - 1),  # where the clamp passes its gradient
        "index": index,
        "weight": weight,
        "slope": slope,
    }


def _block_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor,
    own: Tensor | None,
    mask: Tensor | None,
    scale: float,
    npos: int,
) -> dict[str, Tensor]:
    """One block of CoPE attention, q (B, H, R, d) against k, v (B, H, K, d): the output and
    what the backward pass reads (each (B, H, R, K) unless named otherwise)."""
    content = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    parts = _contextual_bias(q, content, table, own, npos)
    logits = content.add_(parts.pop("bias"))
    if mask is not None:
        logits.masked_fill_(~mask, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return parts | {"out": torch.matmul(probs, v), "probs": probs}


class _CopeBlock(torch.autograd.Function):
    """CoPE attention of one block of query rows with its backward pass written out: it keeps
    only its inputs and forms the block's gates, positions and weights again in the backward
    pass, so no (B, H, L, L) tensor outlives its block."""

    @staticmethod
    def forward(ctx, q, k, v, table, own, mask, scale, npos):  # type: ignore[override]
        ctx.save_for_backward(q, k, v, table, own, mask)
        ctx.scale, ctx.npos = scale, npos
        with torch.no_grad():
            return _block_forward(q, k, v, table, own, mask, scale, npos)["out"]

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, table, own, mask = ctx.saved_tensors
        f = _block_forward(q, k, v, table, own, mask, ctx.scale, ctx.npos)
        probs = f["probs"]
        grad_v = torch.matmul(probs.transpose(-1, -2), grad_out)
        grad_probs = torch.matmul(grad_out, v.transpose(-1, -2))
        # softmax: dlogits = P * (dP - rowsum(dP * P)); masked keys have P = 0
        grad_logits = probs.mul_(grad_probs.sub_((grad_probs * probs).sum(-1, keepdim=True)))
        # bias = at[index] + weight * slope[index], slope[m] = at[m + 1] - at[m]
        grad_at = torch.zeros(*q.shape[:-1], ctx.npos, dtype=q.dtype, device=q.device)
        grad_at.scatter_add_(-1, f["index"], grad_logits)
        grad_slopes = torch.zeros_like(grad_at).scatter_add_(
            -1, f["index"], grad_logits * f["weight"]
        )
        grad_at[..., 1:] += grad_slopes[..., :-1]
        grad_at[..., :-1] -= grad_slopes[..., :-1]
        # positions = clamp(total - running + gates); running = cumsum(gates)
        grad_raw = (grad_logits * f["slope"]).mul_(f["inside"])
        grad_running = -grad_raw
        grad_total = grad_raw.sum(-1, keepdim=True)
        if own is not None:
            index = own.view(1, 1, -1, 1).expand(*grad_running.shape[:-1], 1)
            grad_running.scatter_add_(-1, index, grad_total)
        else:
            grad_running[..., -1:] += grad_total
        # cumsum's gradient is the reverse cumulative sum: the total less the running sum before
        reverse = grad_running.sum(-1, keepdim=True) - grad_running.cumsum(-1) + grad_running
        grad_gates = grad_raw.add_(reverse)
        gates = f["gates"]
        grad_content = grad_logits.add_(grad_gates.mul_(gates * (1 - gates))).mul_(ctx.scale)
        grad_q = torch.matmul(grad_content, k) + torch.matmul(grad_at, table.transpose(0, 1))
        grad_k = torch.matmul(grad_content.transpose(-1, -2), q)
        grad_table = torch.einsum("bhrd,bhrn->dn", q, grad_at)
        return grad_q, grad_k, grad_v, grad_table, None, None, None, None
