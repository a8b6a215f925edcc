"""The language-modelling task: a seeded, stationary synthetic language; text files by
character; loss by position and the extrapolation penalty."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from posbench.cli import app
from posbench.experiment.config import EvalConfig, TrainConfig
from posbench.errors import OptionError
from posbench.experiment.evaluation import position_rows
from posbench.model import build_model
from posbench.tasks import create_task
from posbench.experiment.training import train


def test_the_language_is_seeded() -> None:
    a = create_task("lm").batch(64, 4, torch.Generator().manual_seed(3)).tokens
    b = create_task("lm").batch(64, 4, torch.Generator().manual_seed(3)).tokens
    other = create_task("lm", language_seed=1).batch(64, 4, torch.Generator().manual_seed(3)).tokens
    assert torch.equal(a, b) and not torch.equal(a, other)


def test_token_statistics_do_not_depend_on_position() -> None:
    task = create_task("lm", n_symbols=8)
    tokens = task.batch(256, 2000, torch.Generator().manual_seed(0)).tokens  # (2000, 256)

    def unigram(block: torch.Tensor) -> torch.Tensor:
        return torch.bincount(block.flatten(), minlength=8).double() / block.numel()

    early, late = unigram(tokens[:, :32]), unigram(tokens[:, -32:])
    assert 0.5 * float((early - late).abs().sum()) < 0.02  # total variation distance
    d = task.copy_distance  # the copy rule holds as often at the start as at the end
    start = (tokens[:, d : d + 32] == tokens[:, :32]).double().mean()
    end = (tokens[:, -32:] == tokens[:, -32 - d : -d]).double().mean()
    assert abs(float(start - end)) < 0.02 and float(start) > task.p_copy


def test_a_sliding_window_sees_the_same_loss_at_every_offset() -> None:
    torch.manual_seed(0)
    task = create_task("lm", train_lengths=[32, 32], eval_lengths=[32, 256], n_symbols=8)
    model = build_model("alibi", task.vocab_size, 32, 1, 2)
    train(model, task, TrainConfig(steps=150, batch_size=16, warmup_steps=10), seed=0)
    rows = position_rows(model, task, EvalConfig(n_samples=256, batch_size=128))
    assert {r.eval_len for r in rows} == {
        256
    }  # the length evaluated; each row's bin is its position
    window = {r.position: r.value for r in rows if r.metric == "lm_loss_window" and r.position > 32}
    values = list(window.values())
    assert len(values) == (256 - 32) // 8
    assert max(values) - min(values) < 0.06, window  # stationary data: no trend, only noise
    penalty = {r.position: r.value for r in rows if r.metric == "lm_penalty"}
    # within L the two contexts are the same; the whole context (256 tokens) runs through the
    # C++ kernel and the window (32) through torch's, equal to float round-off
    assert all(abs(penalty[p]) < 1e-6 for p in penalty if p <= 32), penalty


def test_a_text_file_trains_by_character(tmp_path: Path) -> None:
    text = "the quick brown fox jumps over the lazy dog. " * 40
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    task = create_task("lm", corpus=str(corpus), train_lengths=[16, 16], eval_lengths=[16, 64])
    assert task.vocab_size == len(set(text))
    train_batch = task.batch(16, 4, torch.Generator().manual_seed(0))
    held_out = task.for_evaluation().batch(64, 4, torch.Generator().manual_seed(0))
    assert train_batch.tokens.shape == (4, 16) and held_out.tokens.shape == (4, 64)
    split = int(len(text) * 0.9)
    alphabet = sorted(set(text))
    decoded = "".join(alphabet[i] for i in held_out.tokens[0].tolist())
    assert decoded in text[split:]  # evaluation windows come from the held-out tail only


def test_a_corpus_that_is_not_utf8_is_one_sentence(tmp_path: Path) -> None:
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("café crème ".encode("latin-1") * 200)
    with pytest.raises(OptionError, match=r"is not UTF-8 text \(byte 0xe9 at offset 3\)"):
        create_task("lm", corpus=str(corpus))
    config = tmp_path / "sweep.toml"
    config.write_text(
        f'tasks = [{{ name = "lm", corpus = "{corpus}" }}]\nencodings = ["nope"]\nprofile = false\n'
    )
    result = CliRunner().invoke(
        app, ["run", "--config", str(config), "--out", str(tmp_path / "out")]
    )
    assert (
        result.exit_code == 2
        and "is not UTF-8 text" in result.output
        and "Traceback" not in result.output
    )
    assert not (tmp_path / "out").exists()


def test_a_missing_or_short_corpus_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="cannot read corpus"):
        create_task("lm", corpus=str(tmp_path / "absent.txt"))
    short = tmp_path / "short.txt"
    short.write_text("abcdefgh" * 10)
    with pytest.raises(OptionError, match="too few for windows"):
        create_task("lm", corpus=str(short))


def test_lm_has_no_exact_match_rows() -> None:
    from posbench.experiment.evaluation import evaluate

    task = create_task("lm", train_lengths=[8, 8], eval_lengths=[8, 32], n_symbols=4)
    model = build_model("nope", task.vocab_size, 16, 1, 2)
    rows = evaluate(model, task, EvalConfig(n_samples=8, batch_size=8, mem_len_factors=(0.0,)))
    metrics = {r.metric for r in rows}
    assert "exact_match" not in metrics and {"token_accuracy", "loss", "lm_penalty"} <= metrics
    assert all(math.isfinite(r.value) for r in rows)


def test_the_report_shows_loss_by_position_and_the_penalty(tmp_path: Path) -> None:
    import dataclasses

    from posbench.experiment.config import TaskSpec
    from posbench.report.html import build_report
    from posbench.experiment.runner import run_sweep

    from helpers import tiny_sweep

    sweep = tiny_sweep("nope", "rope", seeds=(0, 1))
    sweep = dataclasses.replace(
        sweep,
        tasks=(TaskSpec("lm", {"train_lengths": [8, 8], "eval_lengths": [8, 32], "n_symbols": 4}),),
    )
    outcome = run_sweep(sweep, tmp_path / "sw")
    assert not outcome.failures
    report = build_report(tmp_path / "sw", tmp_path / "report")
    html = report.html.read_text()
    assert "lm: loss by position" in html and "penalty 2x (nats)" in html
    assert (tmp_path / "report" / "figures" / "loss_vs_position_lm.png").is_file()
    assert " ± " in html  # two seeds: intervals


def test_language_floor_matches_a_brute_force_estimate_on_a_small_vocabulary() -> None:
    """The floor by position against plug-in conditional entropies counted over many windows:
    equal where the copied token is inside the window (the exact Bayes loss), and an upper
    bound on the plug-in estimate of the window's best predictor before that."""
    import collections
    import math

    task = create_task(
        "lm", n_symbols=3, copy_distance=3, p_copy=0.5, train_lengths=[8, 8], eval_lengths=[8]
    )
    floor = task.floor_by_position(8)
    windows = task._synthetic(9, 60000, torch.Generator().manual_seed(7))
    for k in range(
        8
    ):  # target k is token k + 1 given tokens 0..k (at most 3 back matter once k >= 3)
        context = windows[:, max(0, k - 2) : k + 1] if k >= 3 else windows[:, : k + 1]
        counts: dict[tuple[int, ...], collections.Counter] = collections.defaultdict(
            collections.Counter
        )
        for row, nxt in zip(context.tolist(), windows[:, k + 1].tolist()):
            counts[tuple(row)][nxt] += 1
        total = len(windows)
        brute = (
            -sum(c * math.log(c / sum(cs.values())) for cs in counts.values() for c in cs.values())
            / total
        )
        if k >= 3:
            assert float(floor[k]) == pytest.approx(brute, abs=0.02)
        else:
            assert float(floor[k]) >= brute - 0.02
    assert task.loss_floor(8) == pytest.approx(float(floor.mean()))


@pytest.mark.parametrize("threads", [1, 2])
def test_floors_computed_together_equal_floors_computed_one_at_a_time(threads: int) -> None:
    """loss_floors computes the missing floors side by side on torch's threads; each is the
    floor loss_floor computes alone, bit for bit, and a floor already computed is reused."""
    from posbench.tasks import lm

    options = {"n_symbols": 5, "copy_distance": 3, "train_lengths": [8, 8]}
    lengths = [8, 16, 24, 40]
    task = create_task("lm", language_seed=11, eval_lengths=lengths, **options)
    lm._FLOORS.clear()
    alone = {n: task.floor_by_position(n).clone() for n in lengths}
    lm._FLOORS.clear()
    task.floor_by_position(16)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        together = task.loss_floors([*lengths, 8])
    finally:
        torch.set_num_threads(old_threads)
    assert list(together) == lengths
    for n in lengths:
        assert torch.equal(task.floor_by_position(n), alone[n])
        assert together[n] == task.loss_floor(n) == float(alone[n].mean())


def test_a_text_corpus_has_no_floor(tmp_path) -> None:
    corpus = tmp_path / "text.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog " * 200)
    task = create_task("lm", corpus=str(corpus), train_lengths=[16, 16], eval_lengths=[16, 32])
    assert task.loss_floor(16) is None
    assert task.loss_floors([16, 32]) == {16: None, 32: None}


def test_lm_training_stops_near_the_floor_and_records_when(tmp_path) -> None:
    """stop_within: held-out in-distribution loss within that many nats of the language's floor
    ends training; far above it, the cap ends it and the note says the threshold was not reached."""
    import dataclasses

    import pandas as pd

    from posbench.experiment.config import TaskSpec
    from posbench.experiment.runner import run_sweep
    from posbench.store import run_folders

    from helpers import tiny_sweep

    sweep = dataclasses.replace(
        tiny_sweep("nope", steps=20),
        tasks=(TaskSpec("lm", {"train_lengths": [16, 16], "eval_lengths": [16, 32]}),),
    )
    loose = dataclasses.replace(
        sweep, train=dataclasses.replace(sweep.train, stop_within=50.0, check_every=5)
    )
    frame = pd.read_csv(run_sweep(loose, tmp_path / "a").results_csv)
    assert frame.loc[frame["metric"] == "steps_to_threshold", "value"].tolist() == [5]
    excess = frame[frame["metric"] == "excess_loss"].set_index("eval_len")["value"]
    floor = frame[frame["metric"] == "loss_floor"].set_index("eval_len")["value"]
    loss = frame[(frame["metric"] == "loss") & frame["mem_len"].isna()].set_index("eval_len")[
        "value"
    ]
    assert excess[16] == pytest.approx(loss[16] - floor[16])
    strict = dataclasses.replace(
        sweep, train=dataclasses.replace(sweep.train, stop_within=1e-6, check_every=5)
    )
    outcome = run_sweep(strict, tmp_path / "b")
    frame = pd.read_csv(outcome.results_csv, keep_default_na=False, na_values=[""])
    assert frame.loc[frame["metric"] == "steps_to_threshold", "note"].tolist() == [
        "not reached within 20 steps"
    ]
    result = next(f.result() for f in run_folders(tmp_path / "b"))
    assert (
        result["undertrained"] and result["in_distribution_excess"] > 0.1
    )  # 20 steps learn no language
