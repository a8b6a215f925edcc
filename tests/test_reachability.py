"""Reachability: which rows of position- or distance-indexed parameters training reaches and
evaluation reads, for every built-in that declares a table and for a plugin that does."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from posbench.encodings import create_encoding
from posbench.experiment.config import EncodingSpec, TaskSpec
from posbench.experiment.reachability import reachability, row_ranges, unreached, untrained_share
from posbench.experiment.planner import reachability_warnings
from posbench.experiment.runner import run_sweep
from posbench.plugins import load_plugin_dir
from posbench.store import RunFolder
from posbench.tasks import create_task
from helpers import tiny_sweep

LM = create_task("lm")  # windows of 64, evaluated to 512
COPY = create_task("copy", train_lengths=[1, 16], eval_lengths=[4, 8, 16, 20, 32, 64])


def _encoding(name: str, **options: object):
    return create_encoding(name, 4, 16, n_layers=4, **options)


def test_t5_defaults_leave_the_far_buckets_untrained_on_lm_windows_of_64() -> None:
    missing = unreached(_encoding("t5"), LM, "t5")
    assert [m.rows for m in missing] == [[27, 28, 29, 30, 31]]
    assert missing[0].first_length == 128
    assert "buckets 27-31 of tables.0.weight" in missing[0].message()
    shares = untrained_share(reachability(_encoding("t5"), LM))
    assert shares[64] == 0 and shares[32] == 0
    assert shares[128] < shares[256] < shares[512]
    assert shares[512] == pytest.approx(0.756, abs=0.002)  # of all pairs of a 512-token window


def test_t5_suggestion_reaches_every_bucket() -> None:
    message = unreached(_encoding("t5"), LM, "t5")[0].message()
    suggested = int(message.split("max_distance = ")[1].split()[0])
    assert unreached(_encoding("t5", max_distance=suggested), LM, "t5") == []
    assert unreached(_encoding("t5", max_distance=suggested + 1), LM, "t5") != []


def test_t5_catch_all_bucket_usage_shifts_from_training_to_evaluation() -> None:
    frame = reachability(_encoding("t5", max_distance=64), LM)
    last = frame[frame["row"] == 31].set_index("phase")["share"]
    assert 0 < last["train"] < 0.01  # a handful of pairs per training window
    assert last["512"] > 0.7  # most pairs at 8x


def test_deberta_span_longer_than_training_distances_is_named_with_the_fix() -> None:
    missing = unreached(_encoding("deberta"), COPY, "deberta")
    assert row_ranges(missing[0].rows) == "96-127"  # distances 32..63 of a span of 64
    assert missing[0].first_length == 20
    assert "span = 32 would reach them all" in missing[0].message()
    assert unreached(_encoding("deberta", span=32), COPY, "deberta") == []


def test_bidirectional_deberta_suggests_the_span_that_reaches_both_ways() -> None:
    encoder = create_task(
        "reverse_string", train_lengths=[1, 8], eval_lengths=[8, 16], form="encoder"
    )  # 16 tokens in training: distances -15..15
    wide = create_encoding("deberta", 4, 16, n_layers=4, causal=False, span=16)
    missing = unreached(wide, encoder, "deberta")
    assert missing[0].rows == [0]  # the far-left catch-all, distances <= -16
    suggested = int(missing[0].message().split("span = ")[1].split()[0])
    assert suggested == 15
    fitted = create_encoding("deberta", 4, 16, n_layers=4, causal=False, span=suggested)
    assert unreached(fitted, encoder, "deberta") == []


def test_learned_table_rows_past_the_training_length_are_named() -> None:
    missing = unreached(_encoding("learned"), COPY, "learned")
    assert row_ranges(missing[0].rows) == "32-127"
    assert missing[0].message().endswith("never trained at these lengths.")  # no option fixes it
    shares = untrained_share(reachability(_encoding("learned"), COPY))
    assert shares[32] == pytest.approx(0.5)  # tokens 32..63 of 64


def test_recurrent_training_reaches_only_segment_plus_memory() -> None:
    task = create_task("lm", train_lengths=[64, 64], eval_lengths=[64])
    assert unreached(_encoding("t5", max_distance=64), task, "t5") == []
    missing = unreached(
        _encoding("t5", max_distance=64), task, "t5", None, 16, 16
    )  # distances < 32
    assert missing and missing[0].rows[-1] == 31


def test_randomized_positions_reach_the_far_rows() -> None:
    missing = unreached(_encoding("learned", randomize_positions=128), COPY, "learned+random")
    assert missing == []


def test_encodings_without_tables_have_nothing_to_reach() -> None:
    for name in ("nope", "alibi", "rope", "txl", "sinusoidal"):
        assert reachability(_encoding(name), COPY).empty


def test_a_plugin_that_declares_a_table_is_checked_and_warned_about(tmp_path: Path) -> None:
    load_plugin_dir(Path("tests/plugins"))
    sweep = dataclasses.replace(
        tiny_sweep("test_distance_table", "nope"),
        tasks=(TaskSpec("copy", {"train_lengths": [1, 2], "eval_lengths": [2, 3, 6]}),),
    )
    warnings = reachability_warnings(sweep)
    assert warnings == [
        "task 'copy': test_distance_table: distances 4-7 of table.weight are read at evaluation "
        "(from length 3) but never trained at these lengths."
    ]
    run_sweep(sweep, tmp_path / "sweep")
    folder = next(f for f in (tmp_path / "sweep").iterdir() if (f / "reachability.csv").exists())
    result = RunFolder(folder).result()
    assert result["unreached"] == [warnings[0].removeprefix("task 'copy': ")]
    rows = RunFolder(folder).measurements()
    shares = rows[rows["metric"] == "untrained_share"].set_index("eval_len")["value"]
    assert shares[2] == 0 and shares[6] > 0


def test_configuration_time_warning_names_t5_buckets_and_the_fix() -> None:
    sweep = dataclasses.replace(
        tiny_sweep(),
        tasks=(TaskSpec("lm", {"eval_lengths": [64, 512]}),),
        encodings=(EncodingSpec("t5"), EncodingSpec("t5", {"max_distance": 64}, "t5-64")),
    )
    warnings = reachability_warnings(sweep)
    assert len(warnings) == 1
    assert warnings[0].startswith(
        "task 'lm': t5: buckets 27-31 of tables.0.weight are read at evaluation"
    )
    assert "max_distance = 69 would reach them all" in warnings[0]


def test_inspect_and_report_show_reachability(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from posbench.cli import app
    from posbench.report.html import build_report

    sweep = dataclasses.replace(
        tiny_sweep("learned", "nope"),
        tasks=(TaskSpec("copy", {"train_lengths": [1, 3], "eval_lengths": [2, 3, 6, 12]}),),
    )
    run_sweep(sweep, tmp_path / "sweep")
    learned = next(f for f in (tmp_path / "sweep").iterdir() if (f / "reachability.csv").exists())
    output = " ".join(
        CliRunner()
        .invoke(app, ["inspect", str(learned)], catch_exceptions=False, terminal_width=200)
        .output.split()
    )
    assert (
        "unreached: learned: positions 6-23 of table.weight are read at evaluation (from length 6)"
        in output
    )
    build_report(tmp_path / "sweep", tmp_path / "report")
    html = (tmp_path / "report" / "report.html").read_text()
    assert (
        re.search(r"\d\.\d\d †", html) and "training never reached" in html
    )  # a marked cell, and why


def test_options_tied_to_the_training_length_resolve_per_task() -> None:
    from posbench.experiment.config import resolve_tied_options
    from posbench.experiment.planner import expand_runs

    spec = EncodingSpec("t5", {"num_buckets": "train/4", "max_distance": "train/4"}, "t5")
    assert resolve_tied_options(spec, 64).options == {"num_buckets": 16, "max_distance": 16}
    assert resolve_tied_options(EncodingSpec("deberta", {"span": "train"}), 32) == EncodingSpec(
        "deberta", {"span": 32}, "deberta(span=train)"
    )  # the label keeps the tied form
    sweep = dataclasses.replace(
        tiny_sweep(),
        encodings=(spec, EncodingSpec("deberta", {"span": "train"})),
        tasks=(
            TaskSpec("copy", {"train_lengths": [1, 16], "eval_lengths": [16, 64]}),
            TaskSpec("lm", {"eval_lengths": [64, 512]}),
        ),
    )
    resolved = {(r.task.name, r.encoding.name): r.encoding for r in expand_runs(sweep)}
    assert resolved[("copy", "t5")].options == {"num_buckets": 8, "max_distance": 8}
    assert resolved[("lm", "t5")].options == {"num_buckets": 16, "max_distance": 16}
    assert (
        resolved[("lm", "deberta")].options == {"span": 64}
        and resolved[("lm", "deberta")].label == "deberta(span=train)"
    )
    assert reachability_warnings(sweep) == []  # every bucket and relative embedding is trained
    frame = reachability(_encoding("t5", num_buckets=16, max_distance=16), LM)
    catch_all = frame[frame["row"] == 15].set_index("phase")["share"]
    assert (
        catch_all["train"] > 0.5
    )  # common in training, as in Press et al.'s windows of 4x max_distance
