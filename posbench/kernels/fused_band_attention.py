"""Causal attention with a band bias through posbench's C++ kernel (posbench.kernels.native):
softmax(scale * q k^T + bias) v with bias[b, h, i, j] = band[b, h, i, j - i + W - 1] for
i - W < j <= i and 0 further back, the layout of a BandBias. A bias of the distance alone
(ALiBi, T5, KERPLE, Sandwich) is the band with one row and W = L; at drawn positions p, the
band is read at p_i - p_j instead, W past the widest distance. A dense bias is read by key
instead (``by_key``). A band given as products with tables by distance (DeBERTa's terms,
BandProduct) is formed inside the kernel, Transformer-XL's terms, each query against a table by
distance or by key, a block of rows at a time, and FIRE's SegmentBias in each row.

The kernel forms each block of query rows' scores with the bias added, its exact softmax and
its product with v; the backward pass forms P and dS again for the same blocks and reads dq,
dk, dv and the bias's gradients off them. Only q, k, v, the output, the log-sum-exp, the band
and the tables' inputs are kept: nothing of size L x L."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from posbench.kernels import native, served
from posbench.bias_kinds import BandProduct, SegmentBias


def _none_to_empty(tensor: Tensor | None, like: Tensor) -> Tensor:
    """An operator returns tensors only: an absent result travels as an empty tensor."""
    return like.new_empty(0) if tensor is None else tensor


def _empty_to_none(tensor: Tensor) -> Tensor | None:
    return None if tensor.numel() == 0 and tensor.dim() == 1 else tensor


@torch.library.custom_op("posbench::band_attention", mutates_args=())
def band_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    band: Tensor,
    positions: Optional[Tensor],
    by_key: bool,
    a: Optional[Tensor],
    table: Optional[Tensor],
    by_distance: bool,
    band_a: Optional[Tensor],
    band_t: Optional[Tensor],
    band_c: Optional[Tensor],
    band_u: Optional[Tensor],
    seg_start: Optional[Tensor],
    seg_a: Optional[Tensor],
    seg_b: Optional[Tensor],
    seg_f: Optional[Tensor],
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(out, lse, the band the products form or an empty tensor): the C++ kernel's forward
    pass as a torch operator, so torch.compile, torch.func and CUDA graphs see one op."""
    out, lse, product_band = native.band_flash().forward(
        q, k, v, band, positions, by_key, a, table, by_distance, band_a, band_t, band_c, band_u,
        seg_start, seg_a, seg_b, seg_f, scale,
    )  # fmt: skip
    return out, lse, _none_to_empty(product_band, q)


@band_attention_op.register_fake
def _band_attention_shapes(
    q, k, v, band, positions, by_key, a, table, by_distance, band_a, band_t, band_c, band_u,
    seg_start, seg_a, seg_b, seg_f, scale,
):  # type: ignore[no-untyped-def]  # fmt: skip
    B, H, L, _ = q.shape
    product_band = q.new_empty(0) if band_a is None else q.new_empty(B, H, L, band_t.shape[1])
    return q.new_empty(q.shape), q.new_empty(B, H, L), product_band


@torch.library.custom_op("posbench::band_attention_backward", mutates_args=())
def band_attention_backward_op(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    band: Tensor,
    positions: Optional[Tensor],
    by_key: bool,
    a: Optional[Tensor],
    table: Optional[Tensor],
    by_distance: bool,
    band_a: Optional[Tensor],
    band_t: Optional[Tensor],
    band_c: Optional[Tensor],
    band_u: Optional[Tensor],
    seg_start: Optional[Tensor],
    seg_a: Optional[Tensor],
    seg_b: Optional[Tensor],
    seg_f: Optional[Tensor],
    product_band: Optional[Tensor],
    scale: float,
    band_grad: bool,
) -> list[Tensor]:
    """(dq, dk, dv, dband, da, dtable, d band_a, d band_t, d band_c, d band_u, d seg_a,
    d seg_b, d seg_f), each absent one an empty tensor: the C++ kernel's backward pass as a
    torch operator."""
    grads = native.band_flash().backward(
        grad_out, q, k, v, out, lse, band, positions, by_key, a, table, by_distance, band_a,
        band_t, band_c, band_u, seg_start, seg_a, seg_b, seg_f, product_band, scale, band_grad,
    )  # fmt: skip
    return [_none_to_empty(g, q) for g in grads]


@band_attention_backward_op.register_fake
def _band_attention_backward_shapes(
    grad_out, q, k, v, out, lse, band, positions, by_key, a, table, by_distance, band_a, band_t,
    band_c, band_u, seg_start, seg_a, seg_b, seg_f, product_band, scale, band_grad,
):  # type: ignore[no-untyped-def]  # fmt: skip
    def like(t: Tensor | None, present: bool = True) -> Tensor:
        return q.new_empty(0) if t is None or not present else torch.empty_like(t)

    dband = like(band, band_grad and band_a is None)
    return [like(q), like(q), like(q), dband, like(a), like(table)] + [
        like(t) for t in (band_a, band_t, band_c, band_u, seg_a, seg_b, seg_f)
    ]


def _save_for_backward(ctx, inputs: tuple, output: tuple) -> None:  # type: ignore[no-untyped-def]
    q, k, v, band, positions, by_key, a, table, by_distance, *products_segments, scale = inputs
    out, lse, product_band = output
    ctx.save_for_backward(q, k, v, band, a, table, *products_segments, product_band, out, lse)
    ctx.positions, ctx.by_key, ctx.by_distance, ctx.scale = positions, by_key, by_distance, scale


def _backward(ctx, grad_out: Tensor, *_unused: Tensor):  # type: ignore[no-untyped-def]
    """The inputs' gradients from the output's (lse and the product band take none)."""
    q, k, v, band, a, table, *products_segments, product_band, out, lse = ctx.saved_tensors
    band_grad = ctx.needs_input_grad[3]
    grads = band_attention_backward_op(
        grad_out.contiguous(), q, k, v, out, lse, band, ctx.positions, ctx.by_key, a, table,
        ctx.by_distance, *products_segments, _empty_to_none(product_band), ctx.scale, band_grad,
    )  # fmt: skip
    dq, dk, dv, dband, da, dtable, *product_grads = (_empty_to_none(g) for g in grads[:10])
    dseg_a, dseg_b, dseg_f = (_empty_to_none(g) for g in grads[10:])
    return (
        dq, dk, dv, dband if band_grad else None, None, None, da, dtable, None, *product_grads,
        None, dseg_a, dseg_b, dseg_f, None,
    )  # fmt: skip


band_attention_op.register_autograd(_backward, setup_context=_save_for_backward)


def fused_band_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    band: Tensor,
    scale: float,
    positions: Tensor | None = None,
    table_bias: tuple[Tensor, Tensor, bool] | None = None,
    band_products: tuple[BandProduct, BandProduct | None] | None = None,
    by_key: bool = False,
    segments: SegmentBias | None = None,
) -> Tensor:
    """Causal attention for q, k, v (B, H, L, d) on the CPU with the bias
    band[b, h, i, W - 1 - (p_i - p_j)] for p_i - p_j < W and 0 beyond, p the tokens' positions:
    0 .. L - 1, or ``positions`` (L,) (drawn: strictly increasing). band (B|1, H|1, L|1, W); at
    plain positions its columns that no key reaches (W > L) are dropped. ``band_products``
    (queries', keys' or None) gives the band instead (band then (1, H, 1, 0), plain positions):
    row i's entry for key j = i - δ is a_i . t[δ] + c_j . u[δ] for δ < W. ``table_bias`` (a,
    table, by_distance) adds a[b, h, i] . table[h, i - j] (by distance) or . table[h, j] (by
    key), a (B, H, L, r), table (H|1, L, r): Transformer-XL's position terms; by distance at
    drawn positions the bias is a[b, h, i] . table[h, p_i - p_j], the table (H|1, T, r) with
    T >= table_rows(positions). With ``by_key``,
    band is a dense bias (B|1, H|1, L, L) read at [b, h, i, j] itself, at plain positions.
    ``segments`` (a SegmentBias, band then (1, H, 1, 0); its positions given as ``positions``)
    is formed in each row instead. Needs ``native.band_flash()``."""
    served.note(served.CPP_BAND)
    B, H, L, _ = q.shape
    if positions is None:
        band = band[..., -L:]  # columns W - L .. W - 1: distances L - 1 .. 0 (by key: all)
    else:
        positions = positions.to(device="cpu", dtype=torch.int64).contiguous()
    band = band.expand(band.shape[0] if band.shape[0] == B else 1, H, *band.shape[2:])
    a, table, by_distance = table_bias if table_bias is not None else (None, None, True)
    if a is not None:
        rows = L if positions is None or not by_distance else table_rows(positions)
        a, table = a.contiguous(), table[:, :rows].contiguous()
    k_contiguous = k.contiguous()
    products: list[Tensor | None] = [None] * 4
    if band_products is not None:
        queries, keys = band_products
        products[:2] = [queries.a.contiguous(), queries.table.contiguous()]
        if keys is not None:  # the keys' factors are usually k itself: one copy serves both
            factor = k_contiguous if keys.a is k else keys.a.contiguous()
            products[2:] = [factor, keys.table.contiguous()]
    parts: list[Tensor | None] = [None] * 4
    if segments is not None:
        parts = [segments.start.contiguous()] + [
            t.to(q.dtype).contiguous() for t in (segments.a, segments.b, segments.f)
        ]
    out, _, _ = band_attention_op(
        q.contiguous(),
        k_contiguous,
        v.contiguous(),
        band.contiguous(),
        positions,
        by_key,
        a,
        table,
        by_distance,
        *products,
        *parts,
        scale,
    )
    return out


def table_rows(positions: Tensor) -> int:
    """The distances 0 .. p_last - p_first that strictly increasing positions (L,) reach."""
    return int(positions[-1] - positions[0]) + 1


def distance_band(values: Tensor) -> Tensor:
    """Per-distance values (H|1, n) for distances 0 .. n - 1 as a band (1, H|1, 1, n), whose
    column n - 1 - δ holds distance δ."""
    return values.flip(-1)[None, :, None, :]


def causal_band(values: Tensor, q_len: int, k_len: int) -> Tensor:
    """A ToeplitzBias's values (H|1, Lq + Lk - 1), ordered by i - j ascending, for square
    causal scores (Lq = Lk = L) as a band (1, H|1, 1, L): column L - 1 - δ holds distance δ."""
    assert q_len == k_len, "a causal band needs square scores"
    return distance_band(values[:, k_len - 1 :])
