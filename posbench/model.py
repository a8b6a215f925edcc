"""A tiny pre-LayerNorm decoder (nanoGPT-sized) that takes any registered encoding."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from torch import Tensor, nn

from posbench.attention import SelfAttention
from posbench.cache import Cache
from posbench.deprecation import renamed_keywords, warn_renamed
from posbench.encodings import create_encoding
from posbench.encodings.base import PositionalEncoding, Span


#: The default decoder: 4 layers of 4 heads of 16 dimensions (d_head 16 keeps 8 RoPE
#: frequency pairs and gives Transformer-XL's W_kR 16 dimensions). Sweeps' [model] shares it.
D_MODEL, N_LAYERS, N_HEADS = 64, 4, 4


@dataclass(frozen=True)
class ModelConfig:
    """Size of the decoder and the encoding it uses."""

    vocab_size: int
    d_model: int = D_MODEL
    n_layers: int = N_LAYERS
    n_heads: int = N_HEADS
    d_ff: int | None = None  # defaults to 4 * d_model
    encoding_name: str = "nope"  # a registered encoding
    encoding_options: dict[str, Any] = field(default_factory=dict)
    #: False builds an encoder-style model whose queries see every key (T5's bidirectional
    #: buckets, ALiBi's symmetric bias); posbench's tasks are next-token tasks and train causal
    #: models, so this is for library use. A cache continues causal attention only.
    causal: bool = True
    #: The output head reads the token embedding's weights (GPT-2, nanoGPT); both then start
    #: N(0, 0.02).
    tie_embeddings: bool = False


class Block(nn.Module):
    """Pre-LN residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, layer: int, causal: bool = True
    ) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, layer, causal)
        self.ln_mlp = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))

    def forward(
        self, x: Tensor, span: Span, encoding: PositionalEncoding, cache: Cache | None
    ) -> Tensor:
        x = x + self.attn(self.ln_attn(x), span, encoding, cache)
        return x + self.mlp(self.ln_mlp(x))


class Decoder(nn.Module):
    """Token embedding, the encoding's hooks, pre-LN blocks, final LayerNorm, LM head."""

    def __init__(self, config: ModelConfig, encoding: PositionalEncoding) -> None:
        super().__init__()
        self.config = config
        d_ff = config.d_ff or 4 * config.d_model
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.encoding = encoding
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.n_heads, d_ff, i, config.causal)
            for i in range(config.n_layers)
        )
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(_init_linear)
        if config.tie_embeddings:
            nn.init.normal_(self.tok_emb.weight, std=0.02)
            self.head.weight = self.tok_emb.weight  # (V, d_model), one parameter

    def new_cache(self, mem_len: float = math.inf, length: int | None = None) -> Cache:
        """An empty memory keeping the newest `mem_len` positions (math.inf: all), for a stream of
        `length` tokens. The length is needed only when the encoding draws positions (they
        spread over their whole range, so the stream's are drawn up front)."""
        if mem_len is None:  # before 0.2, None kept every position
            warn_renamed("new_cache(None) (keep every position)", "new_cache(math.inf)")
            mem_len = math.inf
        return Cache.for_stream(self.config.n_layers, mem_len, self.encoding, length)

    def forward(self, tokens: Tensor, cache: Cache | None = None) -> Tensor:
        """Logits (B, L, V) for tokens (B, L), continuing what `cache` holds if given."""
        if cache is not None and not self.config.causal:
            raise ValueError(
                "a cache continues causal attention; a model built with causal=False reads whole "
                "sequences"
            )
        x = run_layers(self.encoding, self.blocks, self.tok_emb(tokens), cache)  # (B, L, d_model)
        return self.head(self.ln_f(x))


def stream_span(encoding: PositionalEncoding, length: int) -> Span:
    """The span of a whole stream of `length` tokens read at once (drawn positions, if any)."""
    return Span(0, length, encoding.place(length))


Layer = Callable[[Tensor, Span, PositionalEncoding, "Cache | None"], Tensor]


def run_layers(
    encoding: PositionalEncoding, layers: Iterable[Layer], x: Tensor, cache: Cache | None = None
) -> Tensor:
    """The one forward pass over positions: embeddings x (B, L, d) placed (a later span when
    `cache` holds earlier tokens, else the stream's own), checked, through the encoding's embed
    hook and each layer, and the cache advanced. The decoder and the profiler both run it."""
    L = x.shape[1]
    span = cache.span_for(L) if cache is not None else stream_span(encoding, L)
    encoding.check(span)
    x = encoding.embed(x, span)
    for layer in layers:
        x = layer(x, span, encoding, cache)
    if cache is not None:
        cache.advance(L)
    return x


def _init_linear(module: nn.Module) -> None:
    """One initialisation for every encoding: N(0, 0.02) weights, zero biases (GPT-2)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


@renamed_keywords
def build_model(
    encoding_name: str = "nope",
    vocab_size: int = 16,
    d_model: int = D_MODEL,
    n_layers: int = N_LAYERS,
    n_heads: int = N_HEADS,
    d_ff: int | None = None,
    encoding_options: dict[str, Any] | None = None,
    causal: bool = True,
    tie_embeddings: bool = False,
) -> Decoder:
    """Build a decoder with the encoding registered as `encoding_name` and its options."""
    config = ModelConfig(
        vocab_size,
        d_model,
        n_layers,
        n_heads,
        d_ff,
        encoding_name,
        dict(encoding_options or {}),
        causal,
        tie_embeddings,
    )
    return model_from_config(config)


def model_from_config(config: ModelConfig) -> Decoder:
    """Build the decoder a ModelConfig describes."""
    if config.d_model % config.n_heads:
        raise ValueError(f"d_model={config.d_model} is not divisible by n_heads={config.n_heads}")
    enc = create_encoding(
        config.encoding_name,
        n_heads=config.n_heads,
        d_head=config.d_model // config.n_heads,
        causal=config.causal,
        n_layers=config.n_layers,
        **config.encoding_options,
    )
    return Decoder(config, enc)
