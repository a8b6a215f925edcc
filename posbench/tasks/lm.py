"""Language modelling: next-token loss at every position, far past the training length."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, ClassVar, Sequence

import numpy as np
import torch
from torch import Tensor

from posbench.errors import OptionError
from posbench.kernels.cpu import flushing_denormals
from posbench.tasks.registry import register_task
from posbench.tasks.base import Task
from posbench.validation import Range

#: Windows sampled (with a seed of their own) to compute the language's loss floor.
FLOOR_WINDOWS = 2048
FLOOR_SEED = 3_000_017
#: Floors computed in this process, by (n_symbols, p_copy, copy_distance, language_seed, length).
_FLOORS: dict[tuple[int, float, int, int, int], Tensor] = {}

#: Tokens generated and dropped before a synthetic window starts, so every window begins in
#: the chain's stationary regime (and has `copy_distance` tokens of history to copy from).
BURN_IN = 64


@register_task("lm")
class LanguageModel(Task):
    """Next-token prediction on a synthetic fixed-offset retrieval language (a diagnostic, not
    language), or on a text file by character.

    The synthetic language mixes two rules, both position-free: with probability ``p_copy``
    the next token repeats the token ``copy_distance`` back (a fixed *relative* offset the
    model must find at every position), otherwise it follows an order-2 Markov chain over
    ``n_symbols`` tokens whose transition rows are drawn once from Dirichlet(0.3) with
    ``language_seed``. Every sequence is a window cut from a stream that has already run
    BURN_IN tokens, so the token statistics are the same at every position of the window:
    past the training length only the positions are new, never the data. (A corpus whose
    statistics drift with position fakes extrapolation failure for every encoding alike.)

    ``corpus = "FILE"`` trains on any UTF-8 text at character level instead: the vocabulary
    is its characters, training windows come from its first 90%, evaluation windows from the
    last 10%. The length is the window in tokens; every token after the first carries loss.
    """

    default_train_lengths = (64, 64)
    default_eval_lengths = (32, 64, 128, 256, 512)
    length_unit = "tokens"
    #: Whole-sequence exact match means nothing for a language: only token metrics are kept.
    exact_match_meaningful: ClassVar[bool] = False
    #: The evaluation adds loss by position, full context and sliding window (see evaluation).
    per_position: ClassVar[bool] = True

    def __init__(
        self,
        *,
        train_lengths=None,
        eval_lengths=None,
        corpus: str | None = None,
        n_symbols: Annotated[int, Range(ge=2)] = 16,
        p_copy: Annotated[float, Range(ge=0, le=1)] = 0.5,
        copy_distance: Annotated[int, Range(ge=1)] = 8,
        language_seed: Annotated[int, Range(ge=0)] = 0,
    ) -> None:
        super().__init__(train_lengths=train_lengths, eval_lengths=eval_lengths)
        self.corpus = corpus
        self.p_copy, self.copy_distance, self.language_seed = p_copy, copy_distance, language_seed
        if corpus is not None:
            text = _read_utf8(Path(corpus))
            alphabet = sorted(set(text))
            index = {ch: i for i, ch in enumerate(alphabet)}
            ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
            split = int(len(ids) * 0.9)
            self.train_text, self.eval_text = ids[:split], ids[split:]
            self.n_symbols = len(alphabet)
            longest = max(self.eval_lengths + (self.train_lengths[1],)) + 1
            if len(self.eval_text) < longest or len(self.train_text) < longest:
                raise OptionError(
                    f"task 'lm': corpus {corpus} has {len(ids)} characters, too few for windows of "
                    f"{longest} "
                    "in both its first 90% (training) and last 10% (evaluation); use a longer "
                    "text or shorter lengths."
                )
        else:
            self.n_symbols = n_symbols
            rng = np.random.default_rng(language_seed)
            # (V, V, V): P(next | previous two), one Dirichlet(0.3) row per pair of tokens
            self.transitions = torch.from_numpy(
                rng.dirichlet(np.full(n_symbols, 0.3), size=(n_symbols, n_symbols))
            ).float()

    @property
    def vocab_size(self) -> int:
        return self.n_symbols

    def sequence_length(self, length: int) -> int:
        return length

    def generate(
        self, length: int, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        seq = (
            self._text_windows(length + 1, batch_size, generator)
            if self.corpus
            else self._synthetic(length + 1, batch_size, generator)
        )
        answer = torch.ones_like(seq, dtype=torch.bool)
        answer[:, 0] = False  # the first token has no context to predict it from
        return seq, answer

    def _synthetic(self, n: int, batch_size: int, generator: torch.Generator) -> Tensor:
        """(B, n) tokens of the stationary language, after BURN_IN dropped tokens."""
        total = BURN_IN + n
        out = torch.empty(batch_size, total, dtype=torch.long)
        out[:, :2] = torch.randint(0, self.n_symbols, (batch_size, 2), generator=generator)
        copy = torch.rand(batch_size, total, generator=generator) < self.p_copy
        for t in range(2, total):
            probs = self.transitions[out[:, t - 2], out[:, t - 1]]  # (B, V)
            markov = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            source = out[:, t - self.copy_distance] if t >= self.copy_distance else markov
            out[:, t] = torch.where(copy[:, t], source, markov)
        return out[:, BURN_IN:]

    def loss_floor(self, length: int) -> float | None:
        """The loss of the predictor that knows the generator, averaged over a window's targets,
        estimated on FLOOR_WINDOWS windows (standard error about 0.002 nats; ``floor_by_position``).
        Where the window holds the token copy_distance back it is the exact Bayes loss, the
        language's entropy rate; for the first copy_distance targets the copied token lies before
        the window and the predictor puts the copy's mass on the stationary unigram distribution
        instead (an upper bound on the best loss there, and the entropy rate a lower one)."""
        if self.corpus:
            return None
        return float(self.floor_by_position(length).mean())

    def loss_floors(self, lengths: Sequence[int]) -> dict[int, float | None]:
        """loss_floor at each of `lengths`, the ones not yet computed in this process side by
        side on as many threads as torch computes on: each is a long chain of small sampling
        steps from a generator of its own, most of them on one core, so they add up otherwise.
        Each thread flushes denormals as the caller does; the floors are the ones loss_floor
        gives one at a time, bit for bit."""
        if self.corpus:
            return {n: None for n in lengths}
        missing = [n for n in dict.fromkeys(lengths) if self._floor_key(n) not in _FLOORS]
        workers = min(len(missing), torch.get_num_threads())
        if workers > 1:
            flushing = flushing_denormals()
            with ThreadPoolExecutor(
                workers, initializer=torch.set_flush_denormal, initargs=(flushing,)
            ) as pool:
                list(pool.map(self.floor_by_position, sorted(missing, reverse=True)))
        return {n: self.loss_floor(n) for n in lengths}

    def _floor_key(self, length: int) -> tuple[int, float, int, int, int]:
        return (self.n_symbols, self.p_copy, self.copy_distance, self.language_seed, length)

    def floor_by_position(self, length: int) -> Tensor:
        """The generator-aware predictor's mean loss at each target of a window, (length,) nats."""
        key = self._floor_key(length)
        if key not in _FLOORS:
            windows = self._synthetic(
                length + 1, FLOOR_WINDOWS, torch.Generator().manual_seed(FLOOR_SEED + length)
            )
            unigram = torch.bincount(windows.flatten(), minlength=self.n_symbols).double()
            unigram /= unigram.sum()
            T = self.transitions.double()
            losses = torch.empty(length, dtype=torch.float64)
            for k in range(length):  # target k is token k + 1, read after tokens 0..k
                if k >= 1:
                    markov = T[windows[:, k - 1], windows[:, k]]  # (B, V)
                else:  # the token before the window is unseen: average it out
                    markov = torch.einsum("a,bav->bv", unigram, T[:, windows[:, 0]].transpose(0, 1))
                source = k + 1 - self.copy_distance
                copied = (
                    torch.nn.functional.one_hot(windows[:, source], self.n_symbols).double()
                    if source >= 0
                    else unigram.expand(len(windows), -1)
                )
                predicted = self.p_copy * copied + (1 - self.p_copy) * markov
                losses[k] = -predicted.gather(1, windows[:, k + 1, None]).log().mean()
            _FLOORS[key] = losses
        return _FLOORS[key]

    def evaluation_text(self) -> Tensor | None:
        """With a corpus: its held-out last 10%, every token of which the evaluation scores."""
        return self.eval_text if self.corpus else None

    def for_evaluation(self) -> "LanguageModel":
        """With a corpus: the same task reading windows from the held-out last 10%."""
        if not self.corpus:
            return self
        held_out = copy.copy(self)
        held_out.train_text = self.eval_text
        return held_out

    def _text_windows(self, n: int, batch_size: int, generator: torch.Generator) -> Tensor:
        """(B, n) character windows of the text this task reads."""
        text = self.train_text
        starts = torch.randint(0, len(text) - n + 1, (batch_size,), generator=generator)
        return torch.stack([text[s : s + n] for s in starts.tolist()])


def bigram_loss(train_text: Tensor, eval_text: Tensor, vocab_size: int) -> float:
    """Held-out loss (nats per token) of the model that predicts each token from the one
    before it alone: bigram counts of `train_text` with add-one smoothing, scored on every
    token of `eval_text` after its first. A model that does no better read no more context."""
    counts = torch.ones(vocab_size, vocab_size, dtype=torch.float64)  # (previous, next)
    ones = torch.ones(len(train_text) - 1, dtype=torch.float64)
    counts.index_put_((train_text[:-1], train_text[1:]), ones, accumulate=True)
    probabilities = counts / counts.sum(dim=1, keepdim=True)
    return float(-probabilities[eval_text[:-1], eval_text[1:]].log().mean())


def _read_utf8(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise OptionError(
            f"task 'lm': cannot read corpus {path} ({err.strerror}); check the path."
        ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise OptionError(
            f"task 'lm': corpus {path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
            f"{err.start}); "
            "convert it to UTF-8, e.g. with iconv."
        ) from None
    if len(set(text)) < 2:
        raise OptionError(f"task 'lm': corpus {path} needs at least two distinct characters.")
    return text
