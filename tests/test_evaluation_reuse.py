"""Evaluation computes nothing twice: each memory's reading continues from the full-context
pass, free-running decoding resumes from it, and loss by position reads it. Every encoding in
the registry gets the same numbers as reading each way from scratch (in float64, so round-off
cannot flip an argmax; loss by position sums its losses in float32)."""

from __future__ import annotations

import math

import pytest
import torch

import posbench
from posbench.experiment import evaluation
from posbench.experiment.config import EvalConfig, TrainConfig
from posbench.experiment.evaluation import (
    HELD_OUT_SEED,
    _accuracy,
    continues_full_context,
    default_segment_len,
    evaluate,
    held_out,
    mem_lens,
)
from posbench.experiment.training import train
from posbench.tasks.base import IGNORE

COPY = posbench.create_task("copy", train_lengths=[1, 6], eval_lengths=[3, 6, 9, 12])
LM = posbench.create_task("lm", train_lengths=[8, 8], eval_lengths=[8, 24])
CONFIG = EvalConfig(n_samples=24, batch_size=12, segment_len=5)


def _trained(encoding: str, task: posbench.Task, **options: object) -> posbench.Decoder:
    """A model that has learned some of `task` (mistakes left to decode from), in float64."""
    torch.manual_seed(0)
    model = posbench.build_model(
        encoding, task.vocab_size, 16, 2, 2, encoding_options=dict(options)
    )
    train(model, task, TrainConfig(steps=60, batch_size=16, warmup_steps=5), 0)
    return model.double().eval()


@torch.no_grad()
def _free_running_from_scratch(model: posbench.Decoder, length: int) -> tuple[float, float]:
    """Greedy token accuracy and correct prefix, decoding every sequence from its first answer
    and recomputing the whole prefix at every step."""
    hits = answers = prefix = sequences = 0
    for batch in held_out(COPY, length, CONFIG):
        tokens, answer = batch.tokens.clone(), batch.targets != IGNORE
        first = int(answer.any(dim=0).nonzero()[0])
        predictions = model(tokens[:, : first + 1]).argmax(-1)
        for t in range(first + 1, tokens.shape[1]):
            tokens[:, t] = torch.where(answer[:, t - 1], predictions[:, t - 1], tokens[:, t])
            step = model(tokens[:, : t + 1])[:, -1].argmax(-1, keepdim=True)
            predictions = torch.cat((predictions, step), dim=1)
        free = (predictions == batch.targets) & answer
        hits += int(free.sum())
        answers += int(answer.sum())
        wrong = torch.cumsum((answer & ~free).long(), dim=1) == 0
        prefix += int((wrong & answer).sum())
        sequences += tokens.shape[0]
    return hits / answers, prefix / sequences


def _rows(rows: list) -> dict:
    return {(r.eval_len, r.mem_len, r.metric, r.position): r.value for r in rows}


@pytest.mark.parametrize("joint", [True, False], ids=["whole-sample", "per-batch"])
@pytest.mark.parametrize("encoding", posbench.list_encodings())
def test_each_memory_and_free_running_read_as_if_from_scratch(
    encoding: str, joint: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each memory's reading and free running, continued from the full-context pass (the
    whole sample at once, or a batch at a time), against reading from the start."""
    monkeypatch.setattr(evaluation, "reads_jointly", lambda *args: joint)
    model = _trained(encoding, COPY)
    rows = _rows(evaluate(model, COPY, CONFIG))
    segment = default_segment_len(COPY, CONFIG)
    for length in COPY.eval_lengths:
        if math.isnan(rows[length, None, "token_accuracy", None]):
            continue  # beyond what the encoding represents: n/a both ways
        for mem in mem_lens(COPY, CONFIG):
            alone = _accuracy(model, COPY, length, CONFIG, "cpu", segment, mem)
            for metric, value in alone.items():
                assert rows[length, mem, metric, None] == pytest.approx(value, rel=1e-9), (
                    length,
                    mem,
                    metric,
                )
        greedy, prefix = _free_running_from_scratch(model, length)
        assert rows[length, None, "greedy_token_accuracy", None] == pytest.approx(greedy)
        assert rows[length, None, "correct_prefix", None] == pytest.approx(prefix)


def test_the_reading_is_shared_where_the_encoding_allows_and_decoding_has_work_left() -> None:
    """The test above compares the shortcuts, not the fallback with itself: the trained
    models continue from the full-context pass and still make mistakes to decode from."""
    model = _trained("rope", COPY)
    assert continues_full_context(model)
    rows = _rows(evaluate(model, COPY, CONFIG))
    assert 0 < rows[12, None, "greedy_token_accuracy", None] < 1
    assert rows[12, None, "greedy_token_accuracy", None] != rows[12, None, "token_accuracy", None]
    restart = _trained("sinusoidal", COPY, restart_per_segment=True)
    assert not continues_full_context(restart)  # its segments restart their positions


@pytest.mark.parametrize("options", [{}, {"randomize_positions": 64}], ids=["plain", "drawn"])
@pytest.mark.parametrize("encoding", ["alibi", "txl"])
def test_loss_by_position_reads_the_full_context_pass_and_batches_its_windows(
    encoding: str, options: dict
) -> None:
    model = _trained(encoding, LM, **options)
    rows = _rows(evaluate(model, LM, CONFIG))
    L, E = LM.train_lengths[1], max(LM.eval_lengths)
    full = torch.zeros(E, dtype=torch.float64)
    window = torch.zeros(E, dtype=torch.float64)
    count = 0
    from posbench.encodings.positions import seeded_draws

    with torch.no_grad(), seeded_draws(HELD_OUT_SEED + E):
        for batch in held_out(LM, E, CONFIG):
            losses = torch.nn.functional.cross_entropy(
                model(batch.tokens).transpose(1, 2), batch.targets, reduction="none"
            )
            full += losses.sum(0)
            for s in range(0, E - L + 1, L // 2):  # every window from scratch
                part = torch.nn.functional.cross_entropy(
                    model(batch.tokens[:, s : s + L]).transpose(1, 2),
                    batch.targets[:, s : s + L],
                    reduction="none",
                ).sum(0)
                first = 0 if s == 0 else L // 2
                window[s + first : s + L] += part[first:]
            count += batch.tokens.shape[0]
    full, window = full / count, window / count
    for stop in range(L // 4, E + 1, L // 4):
        start = stop - L // 4
        got_full = rows[E, None, "lm_loss", stop]
        got_window = rows[E, None, "lm_loss_window", stop]
        if options:  # drawn positions: a draw per forward call, so only the shape is shared
            assert math.isfinite(got_full) and math.isfinite(got_window)
            continue
        assert got_full == pytest.approx(float(full[start:stop].mean()), rel=1e-6)
        assert got_window == pytest.approx(float(window[start:stop].mean()), rel=1e-6)


@pytest.mark.parametrize("encoding", ["txl", "alibi", "rope", "sinusoidal"])
def test_a_memory_of_0_reads_its_segments_from_the_sliding_windows_as_if_from_scratch(
    encoding: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With segments as long as the windows' stride, a relative encoding's memory of 0 takes
    the segments the sliding windows begin with from them (the windows are read once); every
    memory's rows at the longest length equal reading through that memory from the start, and
    loss by position equals its reading from scratch."""
    config = EvalConfig(n_samples=24, batch_size=12, segment_len=LM.train_lengths[1] // 2)
    model = _trained(encoding, LM)
    taken: list[int] = []
    alone = evaluation.segments_alone

    def counted(model, tokens, logits, segment, known):  # type: ignore[no-untyped-def]
        taken.append(len(known))
        return alone(model, tokens, logits, segment, known)

    monkeypatch.setattr(evaluation, "segments_alone", counted)
    rows = _rows(evaluate(model, LM, config))
    E = max(LM.eval_lengths)
    segment = default_segment_len(LM, config)
    for mem in mem_lens(LM, config):
        for metric, value in _accuracy(model, LM, E, config, "cpu", segment, mem).items():
            assert rows[E, mem, metric, None] == pytest.approx(value, rel=1e-9), (mem, metric)
    scratch = _rows(evaluation.position_rows(model, LM, config))
    assert {k: v for k, v in rows.items() if k[3] is not None} == pytest.approx(scratch, rel=1e-9)
    windows = evaluation.SlidingWindows.of(LM)
    if model.encoding.relative:  # windows 1.. begin with segments 1..: all taken, none read
        assert max(taken) == len(windows.starts) - 1 > 0
    else:  # absolute positions: a memory of 0 reads at the stream's positions, not alone
        assert taken == []


def test_the_restart_variant_reads_full_context_as_its_base_model_does() -> None:
    """Restarting positions per segment changes only readings in segments: at full context,
    free running included, the variant's rows are its base model's (its decoding once put every
    decoded token at position 0)."""
    base = _trained("sinusoidal", COPY)
    restart = _trained("sinusoidal", COPY, restart_per_segment=True)
    restart.load_state_dict(base.state_dict())
    plain = {k: v for k, v in _rows(evaluate(base, COPY, CONFIG)).items() if k[1] is None}
    variant = {k: v for k, v in _rows(evaluate(restart, COPY, CONFIG)).items() if k[1] is None}
    assert variant == pytest.approx(plain)  # decoded at position 0, 4 of 4 lengths differed
