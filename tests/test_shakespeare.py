"""The bundled Tiny Shakespeare corpus: the published bytes, checked on load, and nanoGPT's
split and vocabulary."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from posbench import create_task
from posbench.errors import OptionError
from posbench.tasks.shakespeare import CORPUS, CORPUS_SHA256, verified_corpus


def test_the_bundled_corpus_is_the_published_file() -> None:
    data = CORPUS.read_bytes()
    assert hashlib.sha256(data).hexdigest() == CORPUS_SHA256
    assert len(data) == 1_115_394  # characters: the corpus is ASCII
    assert verified_corpus() == CORPUS


def test_a_changed_copy_is_refused_in_one_sentence(tmp_path: Path) -> None:
    changed = tmp_path / "tinyshakespeare.txt"
    changed.write_bytes(CORPUS.read_bytes()[:-1])
    with pytest.raises(OptionError, match="has sha256 .* not the published .*; restore the file"):
        verified_corpus(changed)
    with pytest.raises(OptionError, match="cannot be read"):
        verified_corpus(tmp_path / "missing.txt")


def test_nanogpt_split_and_vocabulary() -> None:
    """nanoGPT's prepare.py: 65 characters, sorted; 1,003,854 training and 111,540 validation
    tokens (the first 90% and the last 10%)."""
    task = create_task("shakespeare")
    text = CORPUS.read_text(encoding="utf-8")
    alphabet = sorted(set(text))
    assert task.vocab_size == len(alphabet) == 65
    assert (len(task.train_text), len(task.eval_text)) == (1_003_854, 111_540)
    decode = "".join
    assert decode(alphabet[i] for i in task.train_text[:20].tolist()) == text[:20]
    assert decode(alphabet[i] for i in task.eval_text[-20:].tolist()) == text[-20:]


def test_evaluation_reads_only_the_held_out_text() -> None:
    task = create_task("shakespeare", eval_lengths=[64])
    held_out = task.for_evaluation()
    seq, answer = held_out.generate(64, 4, torch.Generator().manual_seed(0))
    text = held_out.eval_text
    for row in seq:  # each window is a slice of the last 10%
        window = row.tolist()
        starts = (text[: len(text) - len(window) + 1] == window[0]).nonzero().flatten().tolist()
        assert any(text[s : s + len(window)].tolist() == window for s in starts)
    assert not answer[:, 0].any() and answer[:, 1:].all()
