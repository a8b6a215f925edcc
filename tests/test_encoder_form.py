"""DeepMind's encoder form of the transduction tasks: a bidirectional model reads the question
and one blank per answer token, and emits the answer at the blanks all at once."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from helpers import invoke, one_sentence_error, tiny_sweep, write_config
from posbench.encodings import BUILTINS
from posbench.errors import ConfigError, OptionError
from posbench.experiment.compute import decoder_for
from posbench.experiment.config import EncodingSpec, ModelSize, TaskSpec
from posbench.experiment.evaluation import greedy_predictions
from posbench.experiment.planner import resolve_sweep
from posbench.experiment.runner import run_sweep
from posbench.store import collect
from posbench.tasks import REGISTRY as TASKS
from posbench.tasks import create_task
from posbench.tasks.base import IGNORE
from posbench.tasks.transduction import Transduction

TRANSDUCTIONS = sorted(name for name in TASKS.names() if issubclass(TASKS.get(name), Transduction))


@pytest.mark.parametrize("name", TRANSDUCTIONS)
def test_the_encoder_form_scores_the_same_answers_at_blanks(name: str) -> None:
    decoder, encoder = create_task(name), create_task(name, form="encoder")
    assert decoder.causal and not encoder.causal
    length = decoder.train_lengths[1]
    plain = decoder.batch(length, 4, torch.Generator().manual_seed(3))
    posed = encoder.batch(length, 4, torch.Generator().manual_seed(3))
    assert posed.tokens.shape == plain.tokens.shape  # (B, question + answer)
    assert torch.equal(posed.targets, plain.targets)  # the same answer at the same places
    q_len = encoder.question_length(length)
    assert torch.equal(posed.tokens[:, :q_len], plain.tokens[:, :q_len])
    assert (posed.tokens[:, q_len:] == encoder.sep).all()  # blanks: no answer token is read
    assert (posed.targets[:, :q_len] == IGNORE).all()


def test_an_unknown_form_is_one_sentence() -> None:
    with pytest.raises(OptionError, match="'form' must be one of 'decoder', 'encoder'"):
        create_task("reverse_string", form="seq2seq")


@pytest.mark.parametrize("encoding", BUILTINS)
def test_every_encoding_builds_bidirectional_for_the_encoder_form(encoding: str) -> None:
    task = create_task("reverse_string", form="encoder")
    model = decoder_for(ModelSize(16, 1, 2), EncodingSpec(encoding), task)
    assert not model.config.causal
    batch = task.batch(4, 2, torch.Generator().manual_seed(0))
    # a later token changes an earlier output: attention reads both ways
    changed = batch.tokens.clone()
    changed[:, -1] = 1 - changed[:, -1].clamp(max=1)
    model.eval()
    with torch.no_grad():
        first = model(batch.tokens)[:, 0]
        assert not torch.allclose(first, model(changed)[:, 0])
        assert torch.equal(greedy_predictions(model, batch.tokens, batch.targets != IGNORE),
                           model(batch.tokens).argmax(-1))  # fmt: skip


def test_an_encoder_sweep_evaluates_at_full_context_only(tmp_path: Path) -> None:
    sweep = dataclasses.replace(
        tiny_sweep("alibi", steps=3),
        tasks=(
            TaskSpec(
                "reverse_string",
                {"train_lengths": [1, 3], "eval_lengths": [2, 3, 6], "form": "encoder"},
            ),
        ),
    )
    outcome = run_sweep(sweep, tmp_path / "sweep")
    assert not outcome.failures, outcome.failures
    frame = collect(tmp_path / "sweep")
    assert frame["mem_len"].isna().all()  # no cache rows: a cache is causal
    full = frame.pivot_table(index="eval_len", columns="metric", values="value")
    assert (full["greedy_token_accuracy"] == full["token_accuracy"]).all()


def test_an_encoder_task_refuses_recurrent_training() -> None:
    sweep = dataclasses.replace(
        tiny_sweep("alibi"),
        tasks=(TaskSpec("parity_check", {"form": "encoder"}, {"train_mem_len": 4}),),
    )
    with pytest.raises(ConfigError, match="bidirectional encoder.*drop train_mem_len"):
        resolve_sweep(sweep)


def test_the_form_is_an_option_on_the_command_line(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        """
tasks = [{ name = "parity_check", form = "both" }]
encodings = ["nope"]
""",
    )
    result = invoke("run", "--config", str(config), "--out", str(tmp_path / "sweep"))
    one_sentence_error(result, "'form' must be one of 'decoder', 'encoder'")


def test_every_task_of_deepminds_suite_declares_its_language_class() -> None:
    from posbench.report.summary import FAMILIES, task_family

    suite = [name for name in TRANSDUCTIONS if TASKS.get(name).family]
    assert len(suite) == 15 and {TASKS.get(n).family for n in suite} == set(FAMILIES)
    assert task_family("parity_check") == "regular"
    assert task_family("reverse_string") == "context-free"
    assert task_family("duplicate_string") == "context-sensitive"
    assert task_family("copy") == "" and task_family("my label") == ""


def test_deepmind_scores_average_token_accuracy_past_training_per_class() -> None:
    from helpers import tidy
    from posbench.report.summary import deepmind_scores, family_scores

    rows = []
    for task, values in (("parity_check", (1.0, 0.6, 0.4)), ("reverse_string", (1.0, 0.8, 0.7))):
        for seed, shift in ((0, 0.0), (1, 0.1)):
            for length, value in zip((16, 32, 64), values):
                rows.append(
                    {"task": task, "encoding": "rope", "encoding_label": "rope", "seed": seed,
                     "model": "d64 L5 H4", "train_len_max": 16, "eval_len": length,
                     "metric": "token_accuracy", "value": value - shift}
                )  # fmt: skip
    scores = deepmind_scores(tidy(rows)).set_index(["task", "seed"])["score"]
    assert scores[("parity_check", 0)] == pytest.approx(0.5)  # lengths 32 and 64 only
    table = family_scores(deepmind_scores(tidy(rows))).set_index("family")
    assert table.at["regular", "mean"] == pytest.approx(0.45)
    assert table.at["regular", "best"] == pytest.approx(0.5)
    assert table.at["all", "mean"] == pytest.approx((0.45 + 0.7) / 2)
    assert table.at["all", "learned"] == table.at["all", "tasks"] == 2


def _deepmind_rows(
    learned: dict[tuple[str, str], bool], past: float = 0.5
) -> list[dict[str, object]]:
    """One seed per (label, task): token accuracy `past` at 2x and exact match 1.0 in
    distribution where `learned` says so, else 0.2."""
    rows: list[dict[str, object]] = []
    for (label, task), did in learned.items():
        base = {"task": task, "encoding": label, "encoding_label": label, "seed": 0}
        base |= {"train_len_max": 16}
        rows += [
            base | {"eval_len": 32, "metric": "token_accuracy", "value": past},
            base | {"eval_len": 16, "metric": "exact_match", "value": 1.0 if did else 0.2},
        ]
    return rows


def test_every_row_of_the_class_table_averages_the_same_tasks() -> None:
    from helpers import tidy
    from posbench.report.summary import deepmind_scores, family_scores, unlearnable_tasks

    learned = {
        ("rope", "parity_check"): True,
        ("alibi", "parity_check"): True,
        ("rope", "even_pairs"): True,
        ("alibi", "even_pairs"): False,  # learnable (rope learned it): alibi's row has no mean
        ("rope", "reverse_string"): False,  # no encoding learned it: left out of the table
        ("alibi", "reverse_string"): False,
        ("rope", "duplicate_string"): True,  # alibi was never trained on it: left out
    }
    scores = deepmind_scores(tidy(_deepmind_rows(learned)))
    assert unlearnable_tasks(scores) == ["reverse_string"]
    table = family_scores(scores).set_index(["encoding_label", "family"])
    assert table.at[("rope", "regular"), "tasks"] == table.at[("alibi", "regular"), "tasks"] == 2
    assert table.at[("rope", "regular"), "mean"] == pytest.approx(0.5)
    assert table.at[("alibi", "regular"), "learned"] == 1
    assert math.isnan(table.at[("alibi", "regular"), "mean"])  # not a mean over fewer tasks
    for label in ("rope", "alibi"):
        assert table.at[(label, "context-free"), "tasks"] == 0
        assert table.at[(label, "context-sensitive"), "tasks"] == 0
        assert table.at[(label, "all"), "tasks"] == 2
    assert table.at[("rope", "all"), "mean"] == pytest.approx(0.5)
    assert math.isnan(table.at[("alibi", "all"), "mean"])


def test_the_randomized_gain_by_class_counts_tasks_both_twins_learned() -> None:
    from helpers import tidy
    from posbench.report.summary import deepmind_scores, family_gains

    rows = []
    for label, task, past, exact in (
        ("rope", "parity_check", 0.5, 1.0),
        ("rope+random", "parity_check", 0.7, 1.0),
        ("rope", "reverse_string", 0.3, 1.0),
        ("rope+random", "reverse_string", 0.9, 0.1),  # did not learn: its 0.9 is not counted
    ):
        base = {"task": task, "encoding": "rope", "encoding_label": label, "seed": 0}
        base |= {"train_len_max": 16}
        rows += [
            base | {"eval_len": 32, "metric": "token_accuracy", "value": past},
            base | {"eval_len": 16, "metric": "exact_match", "value": exact},
        ]
    gains = family_gains(deepmind_scores(tidy(rows)), "rope", "rope+random")
    assert gains["regular"] == pytest.approx(0.2) and gains["all"] == pytest.approx(0.2)
    assert "context-free" not in gains


def test_an_encoder_report_shows_the_score_by_class_and_the_randomized_gain(
    tmp_path: Path,
) -> None:
    from posbench.report.html import build_report

    sweep = dataclasses.replace(
        tiny_sweep("nope", steps=3),
        encodings=(
            EncodingSpec("nope"),
            EncodingSpec("nope", {"randomize_positions": 64}, "nope+random"),
        ),
        tasks=tuple(
            TaskSpec(name, {"train_lengths": [1, 3], "eval_lengths": [3, 6], "form": "encoder"})
            for name in ("parity_check", "reverse_string")
        ),
    )
    run_sweep(sweep, tmp_path / "sweep")
    html = build_report(tmp_path / "sweep", tmp_path / "report").html.read_text()
    section = html[html.index('id="deepmind"') :]
    assert "context-free" in section and "regular" in section
    assert "NAME+random minus NAME" in section
