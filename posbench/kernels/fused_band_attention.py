"""Causal attention with a band bias through posbench's C++ kernel (posbench.kernels.native):
softmax(scale * q k^T + bias) v with bias[b, h, i, j] = band[b, h, i, j - i + W - 1] for
i - W < j <= i and 0 further back, the layout of a BandBias (DeBERTa). A bias of the
distance alone (ALiBi, T5, KERPLE, Sandwich) is the band with one row and W = L; at drawn
positions p, the band is read at p_i - p_j instead, W past the widest distance. A dense
bias (FIRE's) is read by key instead (``by_key``), and DeBERTa's term of the key
and the distance as a key band beside its band.

The kernel forms each block of query rows' scores with the band added, its exact softmax and
its product with v; the backward pass forms P and dS again for the same blocks and reads dq,
dk, dv and the band's gradient off them. Only q, k, v, the output, the log-sum-exp and the
band are kept: nothing of size L x L."""

from __future__ import annotations

import torch
from torch import Tensor

from posbench.kernels import native


class _FusedBandAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        band: Tensor,
        key_band: Tensor | None,
        a: Tensor | None,
        table: Tensor | None,
        positions: Tensor | None,
        by_key: bool,
        by_distance: bool,
        scale: float,
    ) -> Tensor:
        out, lse = native.band_flash().forward(
            q, k, v, band, key_band, positions, by_key, a, table, by_distance, scale
        )
        ctx.save_for_backward(q, k, v, band, key_band, a, table, out, lse)
        ctx.positions, ctx.by_key, ctx.by_distance = positions, by_key, by_distance
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # type: ignore[override]
        q, k, v, band, key_band, a, table, out, lse = ctx.saved_tensors
        band_grad = ctx.needs_input_grad[3]
        dq, dk, dv, dband, dkey, da, dtable = native.band_flash().backward(
            grad_out.contiguous(),
            q,
            k,
            v,
            out,
            lse,
            band,
            key_band,
            ctx.positions,
            ctx.by_key,
            a,
            table,
            ctx.by_distance,
            ctx.scale,
            band_grad,
        )
        dband = dband if band_grad else None
        return dq, dk, dv, dband, dkey, da, dtable, None, None, None, None


def fused_band_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    band: Tensor,
    scale: float,
    positions: Tensor | None = None,
    table_bias: tuple[Tensor, Tensor, bool] | None = None,
    key_band: Tensor | None = None,
    by_key: bool = False,
) -> Tensor:
    """Causal attention for q, k, v (B, H, L, d) on the CPU with the bias
    band[b, h, i, W - 1 - (p_i - p_j)] for p_i - p_j < W and 0 beyond, p the tokens' positions:
    0 .. L - 1, or ``positions`` (L,) (drawn: strictly increasing). band (B|1, H|1, L|1, W); at
    plain positions its columns that no key reaches (W > L) are dropped. ``table_bias`` (a,
    table, by_distance) adds a[b, h, i] . table[h, i - j] (by distance) or . table[h, j] (by
    key), a (B, H, L, r), table (H|1, L, r): Transformer-XL's position terms. ``key_band``, of
    the band's shape with a row per query (B|1, H, L, W) at plain positions, adds
    key_band[b, h, j, W - 1 - (i - j)]: a term of the key and the distance (DeBERTa's
    position-to-content). With ``by_key``, band is a dense bias (B|1, H|1, L, L) read at
    [b, h, i, j] itself (FIRE's), at plain positions. Needs ``native.band_flash()``."""
    B, H, L, _ = q.shape
    if positions is None:
        band = band[..., -L:]  # columns W - L .. W - 1: distances L - 1 .. 0 (by key: all)
        key_band = None if key_band is None else key_band[..., -L:].contiguous()
    else:
        positions = positions.to(device="cpu", dtype=torch.int64).contiguous()
    band = band.expand(band.shape[0] if band.shape[0] == B else 1, H, *band.shape[2:])
    a, table, by_distance = table_bias if table_bias is not None else (None, None, True)
    if a is not None:
        a, table = a.contiguous(), table[:, :L].contiguous()
    return _FusedBandAttention.apply(
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        band.contiguous(),
        key_band,
        a,
        table,
        positions,
        by_key,
        by_distance,
        scale,
    )


def distance_band(values: Tensor) -> Tensor:
    """Per-distance values (H|1, n) for distances 0 .. n - 1 as a band (1, H|1, 1, n), whose
    column n - 1 - δ holds distance δ."""
    return values.flip(-1)[None, :, None, :]


def causal_band(values: Tensor, q_len: int, k_len: int) -> Tensor:
    """A ToeplitzBias's values (H|1, Lq + Lk - 1), ordered by i - j ascending, for square
    causal scores (Lq = Lk = L) as a band (1, H|1, 1, L): column L - 1 - δ holds distance δ."""
    assert q_len == k_len, "a causal band needs square scores"
    return distance_band(values[:, k_len - 1 :])
