"""Press et al.'s evaluation on real text: the whole held-out text in non-overlapping windows,
every token scored once; the perplexity ratio to L with its interval over seeds and the
effective length; their Table 3 from its data file; the learned-the-text bar; the three
literature checks on constructed results."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import small_model, tidy

from posbench import create_task
from posbench.experiment.config import EvalConfig
from posbench.experiment.evaluation import text_rows
from posbench.report.literature import AGREES, DISAGREES, check_findings
from posbench.report.press import log_ratios, press_ratios, ratio_table
from posbench.report.summary import learned_in_distribution
from posbench.tasks.lm import bigram_loss
from posbench.tasks.shakespeare import Shakespeare


def _corpus_task(tmp_path: Path, eval_lengths: list[int]):
    text = "".join(chr(97 + (i * 7 + i // 5) % 11) for i in range(1500))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    return create_task("lm", corpus=str(corpus), train_lengths=[8, 8], eval_lengths=eval_lengths)


def _reference(model, text: torch.Tensor, n: int) -> float:
    """Each window of n inputs from the start, one at a time, the last one shorter."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(text) - 1, n):
            inputs = text[start : start + n][None]
            targets = text[start + 1 : start + n + 1][None]
            inputs = inputs[:, : targets.shape[1]]
            logits = model(inputs)
            total += float(F.cross_entropy(logits[0].double(), targets[0], reduction="sum"))
            count += targets.shape[1]
    assert count == len(text) - 1  # every token but the first, once
    return total / count


@pytest.mark.parametrize("batch_size", [1, 64])
def test_whole_text_loss_scores_every_token_once_in_consecutive_windows(
    tmp_path: Path, batch_size: int
) -> None:
    task = _corpus_task(tmp_path, [8, 16, 48])
    text = task.evaluation_text()
    assert len(text) % 48 != 1  # the last window is shorter: it must still be scored
    model = small_model("alibi", vocab=task.vocab_size).eval()
    rows = text_rows(model, task, text, EvalConfig(batch_size=batch_size))
    assert [r.eval_len for r in rows] == [8, 16, 48] and {r.metric for r in rows} == {"text_loss"}
    for row in rows:
        expected = _reference(model, text, row.eval_len)
        assert row.value == pytest.approx(expected, rel=1e-5)


def test_a_length_the_encoding_cannot_read_is_not_applicable(tmp_path: Path) -> None:
    task = _corpus_task(tmp_path, [8, 64])
    model = small_model("learned", vocab=task.vocab_size).eval()
    model.encoding.max_positions = 32
    rows = {r.eval_len: r for r in text_rows(model, task, task.evaluation_text(), EvalConfig())}
    assert not math.isnan(rows[8].value)
    assert math.isnan(rows[64].value) and "represents positions 0..31 only" in rows[64].note


def test_only_a_corpus_has_a_text_to_score() -> None:
    assert create_task("lm").evaluation_text() is None
    assert create_task("copy").evaluation_text() is None
    shakespeare = create_task("shakespeare")
    assert torch.equal(shakespeare.evaluation_text(), shakespeare.eval_text)


def test_the_learned_bar_is_the_corpus_bigram_loss() -> None:
    task = create_task("shakespeare")
    measured = bigram_loss(task.train_text, task.eval_text, task.vocab_size)
    assert round(measured, 3) == Shakespeare.learned_loss_below
    unigram = torch.bincount(task.train_text, minlength=task.vocab_size).double() + 1
    unigram_loss = float(-(unigram / unigram.sum())[task.eval_text[1:]].log().mean())
    assert measured < unigram_loss - 0.8  # the previous character says a lot (3.35 -> 2.48)


def _text_results(
    ratios: dict[str, tuple[float, ...]],
    seeds: int = 5,
    spread: float = 0.005,
    at_train: float = 1.9,
    task: str = "shakespeare",
) -> list[dict]:
    """Whole-text losses: at L = 64 `at_train`, at 2, 4, 8 and 16 L that plus the log of each
    ratio, each seed off by up to `spread` nats."""
    rng = np.random.default_rng(0)
    rows = []
    for label, values in ratios.items():
        for seed in range(seeds):
            base = {"task": task, "task_name": task, "encoding": label.split("-")[0]}
            base |= {"encoding_label": label, "seed": seed, "train_len_max": 64}
            base |= {"metric": "text_loss"}
            rows.append(base | {"eval_len": 64, "value": at_train})
            for multiple, ratio in zip((2, 4, 8, 16), values):
                value = at_train + math.log(ratio) + rng.uniform(-spread, spread)
                rows.append(base | {"eval_len": 64 * multiple, "value": value})
    return rows


def test_the_ratio_table_exponentiates_the_mean_log_ratio() -> None:
    frame = tidy(_text_results({"alibi": (0.98, 0.97, 0.97, 0.97), "rope": (1.05, 1.2, 2, 4)}))
    table = ratio_table(frame).set_index("encoding_label")
    assert table.loc["alibi", "ratio_2x"] == pytest.approx(0.98, rel=0.01)
    assert table.loc["rope", "ratio_16x"] == pytest.approx(4.0, rel=0.01)
    assert table.loc["rope", "ratio_16x_low"] < 4.0 < table.loc["rope", "ratio_16x_high"]
    assert table.loc["alibi", "loss"] == pytest.approx(1.9)
    # rope stays within exp(0.1) = 1.105 to 2x only; alibi at every length evaluated
    assert table.loc["rope", "effective_length"] == 128
    assert not table.loc["rope", "effective_length_censored"]
    assert table.loc["alibi", "effective_length"] == 1024
    assert table.loc["alibi", "effective_length_censored"]
    ratios = log_ratios(frame)
    assert set(ratios["multiple"]) == {2.0, 4.0, 8.0, 16.0}


def test_press_table_3_ratios_are_theirs() -> None:
    table = press_ratios().set_index(["encoding", "multiple"])
    assert table.loc[("t5", 8.0), "ratio"] == pytest.approx(25.79 / 18.80)
    assert table.loc[("alibi", 16.0), "perplexity"] == 17.98
    assert table.loc[("sinusoidal", 2.0), "eval_len"] == 2024
    assert ("t5", 16.0) not in table.index  # out of memory in the paper
    assert set(press_ratios(512)["eval_len"]) == {1012, 2512, 4512, 8512}


def test_a_run_above_the_bigram_loss_did_not_learn_the_text() -> None:
    rows = _text_results({"alibi": (1, 1, 1, 1)}, at_train=2.3)
    rows += _text_results({"nope": (1, 1, 1, 1)}, at_train=2.6)
    rows += _text_results({"rope": (1, 1, 1, 1)}, at_train=2.6, task="unregistered")
    learned = learned_in_distribution(tidy(rows))
    assert learned[("shakespeare", "alibi")] is True
    assert learned[("shakespeare", "nope")] is False
    assert ("unregistered", "rope") not in learned  # no bar: not judged


PRESS_ORDER = {
    "sinusoidal": (2.6, 7.0, 14.0, 23.0),
    "rope": (1.6, 2.3, 3.4, 5.5),
    "t5": (1.0, 1.03, 1.4, 2.0),
    "alibi": (0.97, 0.96, 0.96, 0.96),
}


def _text_verdicts(ratios: dict[str, tuple[float, ...]]) -> dict[str, tuple[str, str]]:
    verdicts = check_findings(tidy(_text_results(ratios)))
    return {v.finding: (v.verdict, v.measured) for v in verdicts if "real text" in v.finding}


def test_press_text_findings_agree_with_results_that_follow_table_3() -> None:
    verdicts = _text_verdicts(PRESS_ORDER)
    assert len(verdicts) == 3
    for finding, (verdict, measured) in verdicts.items():
        assert verdict == AGREES, (finding, measured)
    order = next(m for f, (_, m) in verdicts.items() if "at every multiple" in f)
    assert re.search(r"2x: sinusoidal 2\.6\d, rope 1\.6\d, t5 1\.0\d, alibi 0\.9\d", order)


def test_press_text_findings_disagree_with_the_reverse() -> None:
    reverse = dict(zip(PRESS_ORDER, reversed(list(PRESS_ORDER.values()))))
    verdicts = _text_verdicts(reverse)
    for finding, (verdict, measured) in verdicts.items():
        assert verdict == DISAGREES, (finding, measured)


def test_a_run_records_whether_it_learned_the_text() -> None:
    from posbench.experiment.compute import _learned

    task = create_task("shakespeare", train_lengths=[64, 64], eval_lengths=[64, 128])
    notes: list[str] = []

    def rows(at_train: float) -> list[dict]:
        return [
            {"metric": "text_loss", "mem_len": None, "eval_len": n, "value": at_train + (n > 64)}
            for n in (64, 128)
        ]

    assert _learned(rows(1.9), task, notes.append)["undertrained"] is False and not notes
    flagged = _learned(rows(2.6), task, notes.append)
    assert flagged["undertrained"] is True and flagged["in_distribution_text_loss"] == 2.6
    assert notes == [
        "did not learn the text: in-distribution loss 2.600 nats per token, not below 2.482 "
        "(a bigram model's)"
    ]
