"""Character-level language modelling on Tiny Shakespeare, the text nanoGPT's published losses
are measured on, bundled with posbench and checked by its checksum on every load."""

from __future__ import annotations

import hashlib
from pathlib import Path

from posbench.errors import OptionError
from posbench.tasks.lm import LanguageModel
from posbench.tasks.registry import register_task

#: The bundled corpus (provenance in data/README.md) and its SHA-256.
CORPUS = Path(__file__).resolve().parent / "data" / "tinyshakespeare.txt"
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


def verified_corpus(path: Path = CORPUS, sha256: str = CORPUS_SHA256) -> Path:
    """`path`, after checking that its bytes are the ones published (a changed or truncated
    copy would move every number measured on it)."""
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as err:
        raise OptionError(
            f"task 'shakespeare': its bundled corpus {path} cannot be read ({err.strerror}); "
            "reinstall posbench."
        ) from None
    if digest != sha256:
        raise OptionError(
            f"task 'shakespeare': its bundled corpus {path} has sha256 {digest}, not the "
            f"published {sha256}; restore the file (git checkout, or reinstall posbench)."
        )
    return path


@register_task("shakespeare")
class Shakespeare(LanguageModel):
    """Next-character prediction on Tiny Shakespeare (bundled), with nanoGPT's split.

    The vocabulary is the corpus's 65 characters; training windows come from its first 90%,
    evaluation windows from the last 10%, as nanoGPT's shakespeare_char data set cuts them, so
    a validation loss here reads on the same text as nanoGPT's published 1.88 nats per
    character (its CPU configuration). The length is the window in characters. A loss floor is
    not known for real text; a run learned the text when its in-distribution loss is below the
    held-out loss of a bigram model of the corpus (learned_loss_below).
    """

    #: bigram_loss of this corpus's split (a test recomputes it): the loss of a model that reads
    #: the previous character only. A run above it learned nothing a bigram table does not know.
    learned_loss_below = 2.482
    default_train_lengths = (64, 64)  # nanoGPT's CPU configuration: block 64
    default_eval_lengths = (64, 128, 256, 512, 1024)  # L to 16L

    def __init__(self, *, train_lengths=None, eval_lengths=None) -> None:
        super().__init__(
            train_lengths=train_lengths,
            eval_lengths=eval_lengths,
            corpus=str(verified_corpus()),
        )
