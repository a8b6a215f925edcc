"""Rotary position embedding (Su et al. 2021), half-split pairing as in HF Llama, with the
context-extension scalings practitioners apply at evaluation time (linear, NTK-aware, dynamic
NTK, YaRN, Llama 3), each as Hugging Face transformers' modeling_rope_utils computes it."""

from __future__ import annotations

import math
from typing import Annotated, Optional

import torch
from torch import Tensor

from posbench.encodings.base import AttentionShape, LayerContext, PositionalEncoding, Span
from posbench.encodings.registry import register_encoding
from posbench.errors import OptionError
from posbench.validation import OneOf, Range

SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")


def rotate_half(x: Tensor) -> Tensor:
    """cat(-x2, x1) for x = cat(x1, x2) along the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_frequencies(
    dim: int,
    base: float = 10000.0,
    scaling: str = "none",
    factor: float = 1.0,
    original_length: int | None = None,
    length: int | None = None,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> tuple[Tensor, float]:
    """The inverse frequencies theta_k (dim / 2,), float64, and the attention factor (cos and
    sin are multiplied by it, so logits by its square) of a scaling, for a model trained on
    `original_length` tokens read at `length` (dynamic NTK only):

    - none: theta_k = base^(-2k/dim). linear: theta_k / factor.
    - ntk: the base becomes base * factor^(dim / (dim - 2)).
    - dynamic: the same with factor * L / L_orig - (factor - 1) for factor, once L > L_orig.
    - yarn: per frequency, a linear ramp between interpolating (theta / factor) and keeping
      theta, over the dimensions whose rotations within L_orig lie between beta_slow and
      beta_fast; attention factor 0.1 ln(factor) + 1.
    - llama3: wavelengths above L_orig / low_freq_factor are divided by factor, those below
      L_orig / high_freq_factor kept, the band between interpolated smoothly.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # (dim / 2,)
    attention = 1.0
    if scaling == "ntk":
        base = base * factor ** (dim / (dim - 2))
    elif scaling == "dynamic":
        assert original_length is not None
        seen = max(length or original_length, original_length)
        base = base * (factor * seen / original_length - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / base**exponents
    if scaling == "linear":
        inv_freq = inv_freq / factor
    elif scaling == "yarn":
        assert original_length is not None

        def correction_dim(rotations: float) -> float:
            return (
                dim * math.log(original_length / (rotations * 2 * math.pi)) / (2 * math.log(base))
            )

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        high = high + 0.001 if low == high else high
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1 - ramp  # 1: extrapolate (keep theta), 0: interpolate (theta / factor)
        inv_freq = inv_freq / factor * (1 - keep) + inv_freq * keep
        attention = 0.1 * math.log(factor) + 1.0
    elif scaling == "llama3":
        assert original_length is not None
        low_wavelength, high_wavelength = (
            original_length / low_freq_factor,
            original_length / high_freq_factor,
        )
        wavelength = 2 * math.pi / inv_freq
        scaled = torch.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
        smooth = (original_length / wavelength - low_freq_factor) / (
            high_freq_factor - low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq, attention


@register_encoding("rope")
class RoPE(PositionalEncoding):
    """Rotary (Su et al. 2021; HF modeling_rope_utils for the scalings): q and k rotated by p *
    theta_k.

    Pairs (k, k + d/2) (half-split); GPT-J/NeoX pair (2k, 2k+1), a fixed permutation of the
    same rotation. Keys are rotated by their absolute positions before they are cached.
    ``rotary_fraction`` rotates only the first fraction of each head's dimensions (Hugging
    Face's partial_rotary_factor; Kazemnejad et al.'s rotary rotates 25%), the rest pass through.
    ``keep_frequencies`` is p-RoPE (Barbero et al. 2025): only the highest-frequency fraction p
    of the pairs rotates, the lowest-frequency ones get frequency 0.
    ``scaling`` (linear, ntk, dynamic, yarn, llama3) with ``factor`` stretches a model trained
    on ``original_length`` tokens to longer inputs, typically applied at evaluation time to a
    model trained without it. Dynamic NTK's base follows the current length: its scores are
    then neither shift-invariant nor the same through a cache (cached keys keep the rotation
    of the length they were written at, as in Hugging Face; issue 25104 there).
    """

    relative = True

    def __init__(
        self,
        shape: AttentionShape,
        *,
        base: Annotated[float, Range(gt=1)] = 10000.0,
        scaling: Annotated[str, OneOf(SCALINGS)] = "none",
        factor: Annotated[float, Range(ge=1)] = 1.0,
        original_length: Annotated[Optional[int], Range(ge=1)] = None,
        beta_fast: Annotated[float, Range(gt=0)] = 32.0,
        beta_slow: Annotated[float, Range(gt=0)] = 1.0,
        low_freq_factor: Annotated[float, Range(gt=0)] = 1.0,
        high_freq_factor: Annotated[float, Range(gt=0)] = 4.0,
        rotary_fraction: Annotated[float, Range(gt=0, le=1)] = 1.0,
        keep_frequencies: Annotated[float, Range(ge=0, le=1)] = 1.0,
    ) -> None:
        super().__init__(shape)
        if shape.d_head % 2:
            raise OptionError(
                f"encoding 'rope' rotates pairs of dimensions and needs an even head size, got "
                f"d_head={shape.d_head}; choose d_model and n_heads with an even d_model / n_heads."
            )
        if scaling in ("dynamic", "yarn", "llama3") and original_length is None:
            raise OptionError(
                f"encoding 'rope': scaling {scaling!r} needs original_length, the length the model "
                "was trained on (in tokens); add original_length = N."
            )
        if scaling == "llama3" and high_freq_factor <= low_freq_factor:
            raise OptionError(
                "encoding 'rope': llama3 scaling needs high_freq_factor > low_freq_factor, "
                f"got {high_freq_factor} and {low_freq_factor}."
            )
        # Hugging Face: frequencies over int(d * fraction) dimensions, one per started pair, so an
        # odd count rotates one dimension more than it names.
        self.frequency_dim = int(shape.d_head * rotary_fraction)
        self.rotary_dim = 2 * math.ceil(self.frequency_dim / 2)
        if self.rotary_dim == 0:
            raise OptionError(
                f"encoding 'rope': rotary_fraction {rotary_fraction} of d_head {shape.d_head} "
                "rotates no pair of dimensions; raise it."
            )
        if scaling in ("ntk", "dynamic") and self.frequency_dim <= 2:
            raise OptionError(
                f"encoding 'rope': {scaling} scaling raises the base to the power d / (d - 2) and "
                f"needs more than 2 rotated dimensions, got {self.frequency_dim}; raise "
                "rotary_fraction or choose another scaling."
            )
        if scaling == "yarn" and self.frequency_dim % 2:
            raise OptionError(
                f"encoding 'rope': yarn scaling ramps over pairs of dimensions and needs an even "
                f"number of rotated dimensions, got int(d_head * rotary_fraction) = "
                f"{self.frequency_dim}; choose a rotary_fraction that gives an even count."
            )
        self.keep_frequencies = keep_frequencies
        self.base, self.scaling, self.factor, self.original_length = (
            base,
            scaling,
            factor,
            original_length,
        )
        self.knobs = {
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
        }
        if scaling == "dynamic":
            self.relative = False  # the base depends on the length read, not on i - j alone
            self.cache_consistent = False

    def frequencies(self, length: int | None = None) -> tuple[Tensor, float]:
        """theta_k (rotary_dim / 2,) float64 and the attention factor, at `length` for dynamic
        NTK; p-RoPE zeroes the lowest-frequency (last) 1 - p of them, the count kept rounded
        down."""
        inv_freq, attention = rope_frequencies(
            self.frequency_dim,
            self.base,
            self.scaling,
            self.factor,
            self.original_length,
            length,
            **self.knobs,
        )
        kept = int(self.keep_frequencies * self.rotary_dim // 2)  # rounded down, as HF's p-RoPE
        inv_freq[kept:] = 0.0
        return inv_freq, attention

    def cos_sin(self, span: Span, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos and sin for `span`, each (L, rotary_dim), repeated over both halves and multiplied
        by the attention factor (as Hugging Face applies YaRN's)."""
        length = (
            span.last + 1
            if self.scaling == "dynamic" and span.last + 1 > (self.original_length or 0)
            else None
        )

        def build(n: int) -> Tensor:  # frequencies only when the table is (re)built, not per call
            inv_freq, attention = self.frequencies(length)
            angles = (
                torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None, :]
            )  # (n, d_head / 2)
            cos, sin = (attention * angles.cos()).float(), (attention * angles.sin()).float()
            return torch.stack((cos.repeat(1, 2), sin.repeat(1, 2)), dim=1).to(
                device
            )  # (n, 2, rotary_dim)

        name = (
            "cos_sin" if length is None else f"cos_sin@{length}"
        )  # dynamic: one table per length read
        table = self.position_rows(name, span, device, build)
        return table[:, 0], table[:, 1]

    def rotate(
        self, q: Tensor, k: Tensor, span: Span, layer: LayerContext
    ) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(span, q.device)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        r = self.rotary_dim

        def turn(x: Tensor) -> Tensor:  # rotate the first r dimensions, pass the rest through
            turned = x[..., :r] * cos + rotate_half(x[..., :r]) * sin
            return turned if r == x.shape[-1] else torch.cat((turned, x[..., r:]), dim=-1)

        return turn(q), turn(k)
