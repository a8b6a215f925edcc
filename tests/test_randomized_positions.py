"""Randomized positions (Ruoss et al. 2023), an option of every encoding: the draw, where it
happens, its reproducibility, and the cache."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from helpers import tiny_sweep
from posbench.encodings import create_encoding
from posbench.encodings.positions import RandomPositions, Span, seeded_draws
from posbench.errors import ConfigError, OptionError, PositionOutOfRangeError
from posbench.experiment.config import EncodingSpec, EvalConfig
from posbench.experiment.variants import parse_variants
from posbench.experiment.evaluation import evaluate
from posbench.experiment.runner import run_sweep
from posbench.model import build_model
from posbench.store import collect
from posbench.tasks import create_task


def test_a_draw_is_a_sorted_sample_without_repeats_of_the_whole_range() -> None:
    sampler = RandomPositions(50)
    torch.manual_seed(0)
    draws = torch.stack([sampler.draw(10) for _ in range(2000)])  # (2000, 10)
    assert draws.dtype == torch.int64 and draws.min() >= 0 and draws.max() <= 49
    assert bool((draws[:, 1:] > draws[:, :-1]).all())  # strictly increasing: distinct and sorted
    assert set(draws.flatten().tolist()) == set(range(50))  # every position is reachable
    # The k-th smallest of n uniform draws without replacement from 0..M-1 has mean
    # (k + 1)(M + 1)/(n + 1) - 1 (order statistics); 2000 draws put each within a few tenths.
    expected = torch.tensor([(k + 1) * 51 / 11 - 1 for k in range(10)])
    assert torch.allclose(draws.double().mean(0), expected.double(), atol=0.6)
    assert torch.equal(sampler.draw(50), torch.arange(50))  # a full draw is every position
    with pytest.raises(
        PositionOutOfRangeError, match=r"at most 50 tokens \(distinct positions 0..49\), got 51"
    ):
        sampler.draw(51)


def test_rope_at_drawn_positions_rotates_by_those_positions() -> None:
    """The reference formula: RoPE of a token at drawn position p rotates pair k by p * theta_k
    (what Ruoss et al.'s noisy rotary computes from the sorted sample)."""
    enc = create_encoding("rope", n_heads=2, d_head=8)
    positions = torch.tensor([3, 17, 40, 41, 90])
    q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    rotated, _ = enc.rotate(q.float(), q.float(), Span(0, 5, positions), None)
    theta = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)  # (4,)
    angle = positions.double()[:, None] * theta[None, :]  # (5, 4)
    x1, x2 = q[..., :4], q[..., 4:]
    expected = torch.cat(
        (x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()), dim=-1
    )
    assert torch.allclose(rotated.double(), expected, atol=1e-5)


def test_training_draws_on_every_pass_and_evaluation_draws_or_reads_plain_positions() -> None:
    tokens = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    drawn = build_model("rope", encoding_options={"randomize_positions": 256})
    plain = build_model("rope")
    plain.load_state_dict(drawn.state_dict())  # the option adds no parameter: one state dict
    with torch.no_grad():
        assert not torch.allclose(drawn(tokens), drawn(tokens))  # training: a new draw per pass
        drawn.eval()
        with seeded_draws(4):
            first = drawn(tokens)
        with seeded_draws(4):
            again = drawn(tokens)
        assert torch.equal(first, again) and not torch.allclose(first, plain.eval()(tokens))
        at_plain = build_model(
            "rope", encoding_options={"randomize_positions": 256, "eval_positions": "plain"}
        )
        at_plain.load_state_dict(drawn.state_dict())
        assert torch.equal(at_plain.eval()(tokens), plain(tokens))


def test_a_cache_draws_the_whole_stream_up_front_and_keeps_cached_keys_positions() -> None:
    torch.manual_seed(0)
    model = build_model("t5", encoding_options={"randomize_positions": 100}).eval()
    tokens = torch.randint(0, 16, (1, 20), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="pass the stream's length"):
        model.new_cache(mem_len=4)
    with torch.no_grad():
        with seeded_draws(2):
            whole = model(tokens)
        with seeded_draws(2):
            cache = model.new_cache(mem_len=math.inf, length=20)
        chunked = torch.cat(
            [model(tokens[:, s : s + 6], cache=cache) for s in range(0, 20, 6)], dim=1
        )
        assert torch.allclose(whole, chunked, atol=1e-5)
        with pytest.raises(PositionOutOfRangeError, match="made for a stream of 20 tokens"):
            model(tokens[:, :1], cache=cache)


def test_options_are_checked_with_one_sentence_each() -> None:
    with pytest.raises(
        OptionError,
        match="'learned' represents positions 0..1023 only, but randomize_positions = 2048",
    ):
        create_encoding("learned", n_heads=2, d_head=8, randomize_positions=2048)
    with pytest.raises(OptionError, match="needs randomize_positions = M as well"):
        create_encoding("alibi", n_heads=2, d_head=8, eval_positions="plain")
    with pytest.raises(OptionError, match="'eval_positions' must be one of"):
        create_encoding(
            "alibi", n_heads=2, d_head=8, randomize_positions=64, eval_positions="sometimes"
        )
    with pytest.raises(OptionError, match="it accepts: .*randomize_positions, eval_positions"):
        create_encoding("alibi", n_heads=2, d_head=8, randomise_positions=64)


def test_evaluation_draws_are_reproducible_whatever_ran_before() -> None:
    task = create_task("copy", train_lengths=[1, 3], eval_lengths=[3, 6])
    torch.manual_seed(0)
    model = build_model(
        "alibi",
        vocab_size=task.vocab_size,
        d_model=16,
        n_layers=1,
        n_heads=2,
        encoding_options={"randomize_positions": 64},
    )
    config = EvalConfig(n_samples=8, batch_size=4, mem_len_factors=(0.0, 1.0))
    torch.manual_seed(1)
    first = evaluate(model, task, config)
    torch.manual_seed(2)
    torch.rand(5)
    second = evaluate(model, task, config)
    assert [(m.eval_len, m.mem_len, m.metric, m.value) for m in first] == [
        (m.eval_len, m.mem_len, m.metric, m.value) for m in second
    ]


def test_lengths_beyond_the_drawn_range_are_not_applicable_with_the_reason() -> None:
    task = create_task("copy", train_lengths=[1, 3], eval_lengths=[3, 40])
    model = build_model(
        "rope",
        vocab_size=task.vocab_size,
        d_model=16,
        n_layers=1,
        n_heads=2,
        encoding_options={"randomize_positions": 32},
    )
    rows = evaluate(model, task, EvalConfig(n_samples=4, batch_size=4, mem_len_factors=(1.0,)))
    long = [m for m in rows if m.eval_len == 40]
    assert long and all(math.isnan(m.value) and "at most 32 tokens" in m.note for m in long)
    assert all(not math.isnan(m.value) for m in rows if m.eval_len == 3)


def test_a_sweep_trains_with_drawn_positions_and_evaluates_them_both_ways(tmp_path: Path) -> None:
    sweep = tiny_sweep("rope", steps=4)
    randomized = EncodingSpec("rope", {"randomize_positions": 64}, "rope+random")
    sweep = dataclasses.replace(
        sweep,
        encodings=(EncodingSpec("rope"), randomized),
        eval_variants=parse_variants("rope+random:eval_positions=plain"),
    )
    outcome = run_sweep(sweep, tmp_path / "sweep")
    assert not outcome.failures
    frame = collect(tmp_path / "sweep")
    assert {"rope", "rope+random", "rope+random [eval eval_positions=plain]"} <= set(
        frame["encoding_label"]
    )
    with pytest.raises(ConfigError, match="names no encoding this sweep trains, by name or label"):
        run_sweep(
            dataclasses.replace(
                sweep, eval_variants=parse_variants("rope+rnd:eval_positions=plain")
            ),
            tmp_path / "other",
        )


def test_training_shorter_than_the_drawn_range_needs_sequences_that_fit(tmp_path: Path) -> None:
    sweep = dataclasses.replace(
        tiny_sweep("rope"), encodings=(EncodingSpec("rope", {"randomize_positions": 4}),)
    )
    with pytest.raises(ConfigError, match="randomized positions place at most 4 tokens"):
        run_sweep(sweep, tmp_path / "sweep")


def test_spans_tell_the_same_positions_from_the_same_tokens() -> None:
    drawn = torch.tensor([0, 3, 4, 9])
    assert Span(0, 4).same_positions(Span(0, 4))
    assert Span(0, 4, drawn).same_positions(Span(0, 4, drawn.clone()))
    assert Span(0, 4, torch.arange(4)).same_positions(Span(0, 4))
    assert not Span(0, 4, drawn).same_positions(Span(0, 4))  # same tokens, other positions
    assert not Span(0, 4).same_positions(Span(1, 5))
    keys, distance = Span(0, 4, drawn).band(2, torch.device("cpu"))
    assert keys.tolist() == [[0, 0], [0, 1], [1, 2], [2, 3]]  # key -1 clamped: masked later
    assert distance.tolist() == [[0, 0], [3, 0], [1, 0], [5, 0]]


def test_evaluation_averages_at_least_32_position_draws_per_length(monkeypatch) -> None:
    """Positions are drawn once per forward call; evaluation cuts the held-out sample into at
    least POSITION_DRAWS calls for an encoding that draws them, and reads the same sample."""
    from posbench.experiment.evaluation import POSITION_DRAWS, _accuracy
    from posbench.tasks import create_task

    task = create_task("copy", train_lengths=[1, 4], eval_lengths=[8])
    draws: list[int] = []
    original = RandomPositions.draw
    monkeypatch.setattr(
        RandomPositions, "draw", lambda self, n: draws.append(n) or original(self, n)
    )
    config = EvalConfig(n_samples=64, batch_size=64)
    torch.manual_seed(0)
    model = build_model(
        "rope", task.vocab_size, 16, 1, 2, encoding_options={"randomize_positions": 64}
    ).eval()
    _accuracy(model, task, 8, config, "cpu")
    assert len(draws) >= POSITION_DRAWS
    plain = build_model("rope", task.vocab_size, 16, 1, 2).eval()
    draws.clear()
    _accuracy(plain, task, 8, config, "cpu")
    assert draws == []


@pytest.mark.parametrize(
    ("name", "options", "outdated"),
    [
        ("rope", {"randomize_positions": 64}, True),
        ("txl", {"randomize_positions": 64}, True),
        ("rope", {}, False),  # plain positions: evaluation unchanged
        ("rope", {"randomize_positions": 64, "eval_positions": "plain"}, False),
        ("nope", {"randomize_positions": 64}, False),  # reads no position: draws change nothing
    ],
)
def test_evaluation_protocol_1_is_outdated_only_where_drawn_positions_are_read(
    name: str, options: dict, outdated: bool
) -> None:
    from posbench.experiment.evaluation import EVALUATION_PROTOCOL, outdated_evaluation

    encoding = create_encoding(name, n_heads=2, d_head=8, **options)
    assert bool(outdated_evaluation(1, encoding)) is outdated
    assert outdated_evaluation(EVALUATION_PROTOCOL, encoding) is None


def _as_protocol_1(folder: Path, keep_model: bool) -> None:
    """Make a stored run look evaluated before the protocol was recorded (version 1)."""
    import json

    result = json.loads((folder / "result.json").read_text())
    assert result.pop("evaluation_protocol") == 2
    if not keep_model:  # as an exported run: its weights left out, and said so
        from posbench.store import MODEL_FILE, MODEL_NOT_KEPT

        (folder / MODEL_FILE).unlink()
        result[MODEL_NOT_KEPT] = result["files"].pop(MODEL_FILE)
    (folder / "result.json").write_text(json.dumps(result))


@pytest.mark.parametrize("keep_model", [True, False])
def test_a_run_evaluated_under_an_older_protocol_is_computed_again(
    tmp_path: Path, keep_model: bool
) -> None:
    """A randomized run stored by an older evaluation is evaluated again on its kept model, or
    trained again without it; a plain run of the same sweep stays stored."""
    from posbench.experiment.planner import EVALUATE_KEPT, RUN, STORED, plan_sweep
    from posbench.store import RunFolder

    sweep = dataclasses.replace(
        tiny_sweep("rope", steps=4),
        encodings=(
            EncodingSpec("rope"),
            EncodingSpec("rope", {"randomize_positions": 64}, "rope+random"),
        ),
    )
    out = tmp_path / "sweep"
    assert not run_sweep(sweep, out).failures
    jobs = {job.label: job for job in plan_sweep(sweep, out).jobs}
    randomized, plain = jobs["copy / rope+random / seed 0"], jobs["copy / rope / seed 0"]
    before = collect(out)
    _as_protocol_1(out / randomized.run_id, keep_model)
    jobs = {job.label: job for job in plan_sweep(sweep, out).jobs}
    assert jobs[plain.label].action == STORED
    again = jobs[randomized.label]
    assert again.action == (EVALUATE_KEPT if keep_model else RUN)
    assert "evaluation protocol 1" in again.reason
    assert not run_sweep(sweep, out).failures
    assert all(job.action == STORED for job in plan_sweep(sweep, out).jobs)
    assert RunFolder(out / randomized.run_id).result()["evaluation_protocol"] == 2
    after = collect(out)
    rows = ["encoding_label", "eval_len", "metric"]
    assert len(after) == len(before)  # the run's rows replaced, not added
    assert set(map(tuple, after[rows].fillna(-1).values)) == set(
        map(tuple, before[rows].fillna(-1).values)
    )


def test_run_from_takes_no_run_evaluated_under_an_older_protocol(tmp_path: Path) -> None:
    from helpers import TINY_TOML, invoke, write_config

    toml = TINY_TOML.replace(
        'encodings = ["nope", { name = "t5", num_buckets = 8, max_distance = 16 }]',
        'encodings = ["rope", { name = "rope", randomize_positions = 64, label = "rope+random" }]',
    )
    config = write_config(tmp_path, toml)
    published = tmp_path / "published"
    run = ("run", "--config", str(config), "--no-report")
    assert invoke(*run, "--out", str(published)).exit_code == 0
    folders = [p for p in published.iterdir() if (p / "config.json").is_file()]
    randomized = next(
        p for p in folders if "randomize_positions" in (p / "config.json").read_text()
    )
    _as_protocol_1(randomized, keep_model=False)
    mine = tmp_path / "mine"
    dry = invoke(*run, "--out", str(mine), "--from", str(published), "--dry-run")
    assert dry.exit_code == 0 and "would take 1 finished run(s)" in dry.output, dry.output
    result = invoke(*run, "--out", str(mine), "--from", str(published))
    assert result.exit_code == 0 and "took 1 finished run(s)" in result.output
    assert (mine / randomized.name / "model.pt").exists()  # trained here, evaluated today
