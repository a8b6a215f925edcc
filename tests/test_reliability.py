"""Results you can trust: configurations are never pooled, damaged runs are never used,
failures keep what was measured, user mistakes get one sentence, and nothing is written
outside the sweep's folders."""

from __future__ import annotations

import dataclasses
import errno
import json
import re
import signal
from pathlib import Path

import pandas as pd
import pytest

from posbench.plugins import load_plugin_dir
from posbench.store import RunFolder
from posbench.experiment.runner import run_sweep

from helpers import TINY_TOML, fail_fsync_for, invoke, one_sentence_error, tiny_sweep, write_config

PLUGINS = Path("tests/plugins")


# ---- configurations are never pooled ---------------------------------------------------------
def test_a_second_configuration_in_the_same_folder_is_never_pooled(tmp_path: Path) -> None:
    out = tmp_path / "M"
    config = write_config(tmp_path)
    assert (
        invoke(
            "run", "--config", str(config), "--steps", "2", "--no-report", "--out", str(out)
        ).exit_code
        == 0
    )
    first_ids = set(pd.read_csv(out / "results.csv")["run_id"])
    result = invoke("run", "--config", str(config), "--steps", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out / "results.csv")
    assert not first_ids & set(frame["run_id"])  # only the 4-step runs
    summary = pd.read_csv(out / "report" / "by_length.csv")
    assert (summary["n"] == 1).all()  # one seed, one run: nothing averaged across configurations
    html = (out / "report" / "report.html").read_text()
    assert "other configurations" in html and all(run_id in html for run_id in first_ids)
    assert all((out / run_id / "result.json").exists() for run_id in first_ids)  # kept, apart


def test_repeated_seeds_train_once_and_negative_seeds_are_refused(tmp_path: Path) -> None:
    outcome = run_sweep(tiny_sweep("nope", seeds=(0, 0)), tmp_path / "sw")
    assert len(outcome.ran) == 1
    config = write_config(tmp_path)
    one_sentence_error(
        invoke("run", "--config", str(config), "--seeds", "-1", "--out", str(tmp_path / "neg")),
        "option 'seeds' must be a list of integers >= 0",
        "got [-1].",
    )
    assert not (tmp_path / "neg").exists()
    huge = "100000000000000000000"  # passed validation, then failed inside torch's seeding
    one_sentence_error(
        invoke("run", "--config", str(config), "--seeds", huge, "--out", str(tmp_path / "big")),
        "option 'seeds' must be a list of integers >= 0 and <= 2147483647",
    )
    assert not (tmp_path / "big").exists()


# ---- failures keep their work and are retried ----------------------------------------------
def test_a_failed_evaluation_keeps_the_model_and_shorter_lengths_then_retries_without_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_plugin_dir(PLUGINS)
    out = tmp_path / "sw"
    sweep = tiny_sweep("test_eval_failing")
    monkeypatch.setenv("POSBENCH_TEST_FAIL_EVAL", "1")
    failed = run_sweep(sweep, out)
    folder = RunFolder(out / failed.ran[0])
    result = folder.result()
    assert (
        result["status"] == "error"
        and result["stage"] == "evaluation"
        and "MemoryError" in result["error"]
    )
    assert (folder.path / "model.pt").is_file()
    kept = pd.read_csv(folder.path / "measurements.csv")
    assert set(kept["eval_len"].dropna()) == {2, 3}  # lengths 2 and 3 (<= 8 tokens) were measured
    model_bytes = (folder.path / "model.pt").read_bytes()
    monkeypatch.delenv("POSBENCH_TEST_FAIL_EVAL")
    retried = run_sweep(sweep, out)
    assert retried.ran == failed.ran and not retried.failures
    assert "reusing the model" in (folder.path / "log.txt").read_text()
    assert (folder.path / "model.pt").read_bytes() == model_bytes  # not retrained
    assert folder.result()["train_losses"] == result["train_losses"]


def test_diverged_runs_are_retried_on_the_next_invocation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_plugin_dir(PLUGINS)
    out = tmp_path / "sw"
    sweep = tiny_sweep("nope", "test_diverging")
    monkeypatch.setenv("POSBENCH_TEST_DIVERGE", "1")
    first = run_sweep(sweep, out)
    assert list(first.failures) == ["copy / test_diverging / seed 0"]
    monkeypatch.delenv("POSBENCH_TEST_DIVERGE")
    second = run_sweep(sweep, out)
    assert len(second.ran) == 1 and not second.failures


def test_a_sweep_where_every_run_failed_exits_1_with_the_failures(tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        TINY_TOML.replace(
            '"nope", { name = "t5", num_buckets = 8, max_distance = 16 }', '"test_exploding"'
        ),
    )
    result = invoke(
        "--plugins", str(PLUGINS), "run", "--config", str(config), "--out", str(tmp_path / "out")
    )
    assert result.exit_code == 1, result.output
    assert "FAILED copy / test_exploding / seed 0: RuntimeError: boom in embed" in result.output
    assert "no report was written" in result.output and "Traceback" not in result.output


def test_an_evaluation_length_that_cannot_fit_in_memory_is_refused_up_front(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, TINY_TOML.replace("eval_lengths = [2, 3, 6]", "eval_lengths = [2, 100000000]")
    )
    text = one_sentence_error(
        invoke("run", "--config", str(config), "--out", str(tmp_path / "out")),
        "at length 100000000",
        "GiB",
        "lower eval_lengths or [eval] batch_size",
    )
    assert "available" in text and not (tmp_path / "out").exists()


# ---- one sentence for every user mistake, nothing written -----------------------------------
@pytest.mark.parametrize(
    ("replace", "fragments"),
    [
        (
            ("d_model = 16", 'd_model = "big"'),
            ["[model]", "option 'd_model' must be an integer >= 1", "'big'"],
        ),
        (
            ("profile = false", "profile = false\nthreads = -3"),
            ["option 'threads' must be an integer >= 1", "-3"],
        ),
        (("steps = 3", "steps = 20.5"), ["option 'steps' must be an integer >= 1", "20.5"]),
        (("steps = 3", 'steps = 3\nlr = "fast"'), ["option 'lr' must be a number > 0", "'fast'"]),
        (
            ("n_samples = 8", "n_samples = 0"),
            ["option 'n_samples' must be an integer >= 1", "got 0"],
        ),
        (
            ("batch_size = 8", "batch_size = 0"),
            ["[eval]", "option 'batch_size' must be an integer >= 1"],
        ),
        (
            ("profile = false", 'profile = false\ndevice = "tpu"'),
            ["--device must be cpu, cuda, cuda:N or mps", "'tpu'"],
        ),
        (("d_model = 16", "d_model = 15"), ["d_model=15 must be divisible by n_heads=2"]),
        (
            ('"nope"', '{ name = "txl", clamp_len = -1 }'),
            ["encoding 'txl'", "option 'clamp_len' must be an integer >= 1", "-1"],
        ),
        (
            ('"nope"', '{ name = "txl", clamp_len = 0 }'),
            ["option 'clamp_len' must be an integer >= 1", "got 0"],
        ),
        (
            ('"nope"', '{ name = "t5", num_buckets = 0 }'),
            ["encoding 't5'", "option 'num_buckets' must be an integer >= 2"],
        ),
        (
            ('"nope"', '{ name = "deberta", span = 0 }'),
            ["encoding 'deberta'", "option 'span' must be an integer >= 1"],
        ),
        (
            ('"nope"', '{ name = "rope", base = 0 }'),
            ["encoding 'rope'", "option 'base' must be a number > 1", "got 0"],
        ),
        (('"nope"', '{ name = "copy" }'), ["Unknown encoding 'copy'"]),
        (
            ('"nope"', """{ name = "rope", label = "=cmd|' /C calc'!A0" }"""),
            ["of encoding 'rope' starts with '='", "reads as a formula"],
        ),
        (
            ('"nope"', '{ name = "rope", label = "@SUM(A1)" }'),
            ["starts with '@'", "start it with a letter or digit"],
        ),
        (
            ('"nope"', '{ name = "rope", label = "two\\nlines" }'),
            ["holds a control character", "use printable characters"],
        ),
    ],
)
def test_bad_values_get_one_sentence_before_anything_is_written(
    tmp_path: Path, replace: tuple[str, str], fragments: list[str]
) -> None:
    assert replace[0] in TINY_TOML
    config = write_config(tmp_path, TINY_TOML.replace(replace[0], replace[1], 1))
    out = tmp_path / "out"
    one_sentence_error(invoke("run", "--config", str(config), "--out", str(out)), *fragments)
    assert not out.exists()


def test_rope_with_an_odd_head_size_is_one_sentence(tmp_path: Path) -> None:
    toml = TINY_TOML.replace('"nope"', '"rope"').replace("d_model = 16", "d_model = 18")
    one_sentence_error(
        invoke(
            "run", "--config", str(write_config(tmp_path, toml)), "--out", str(tmp_path / "out")
        ),
        "rope",
        "even head size",
        "d_head=9",
    )


def test_labels_are_shown_literally(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from posbench.report.progress import RichReporter

    sweep = tiny_sweep("nope")
    sweep = dataclasses.replace(
        sweep, encodings=(dataclasses.replace(sweep.encodings[0], label="ali[/red]bi"),)
    )
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    with RichReporter(console) as reporter:
        outcome = run_sweep(sweep, tmp_path / "sw", reporter=reporter)
    assert not outcome.failures and "ali[/red]bi" in console.file.getvalue()
    toml = TINY_TOML.replace(
        '"nope", { name = "t5", num_buckets = 8, max_distance = 16 }',
        '{ name = "rope", base = 500.0, label = "rope[base=500]" }',
    )
    result = invoke(
        "run", "--config", str(write_config(tmp_path, toml)), "--out", str(tmp_path / "out")
    )
    assert result.exit_code == 0 and "copy / rope[base=500] / seed 0" in result.output


# ---- the disk and the folder -----------------------------------------------------------------
def test_disk_full_during_the_report_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path)
    assert invoke("run", "--config", str(config), "--no-report", "--out", str(out)).exit_code == 0
    fail_fsync_for(monkeypatch, "report.html", errno.ENOSPC)
    one_sentence_error(
        invoke("report", str(out)),
        "No space left on the device",
        "report.html",
        "choose another -o)",
    )
    assert RunFolder(next(p for p in out.iterdir() if (p / "model.pt").exists())).is_finished()


def test_reports_go_beside_their_sweep_never_into_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    elsewhere = tmp_path / "x" / "exp"
    result = invoke("run", "--config", str(config), "--out", str(elsewhere))
    assert result.exit_code == 0 and (elsewhere / "report" / "report.html").is_file()
    assert str(elsewhere / "report" / "report.html") in result.output.replace("\n", "")
    assert not (work / "reports").exists()
    documented = invoke("run", "--config", str(config), "--out", "results/exp")
    assert documented.exit_code == 0 and (work / "reports" / "exp" / "report.html").is_file()
    custom = invoke("report", str(elsewhere), "-o", str(tmp_path / "mine"))
    assert custom.exit_code == 0 and (tmp_path / "mine" / "report.html").is_file()


# ---- an interrupted report leaves a whole one -------------------------------------------------
@pytest.fixture
def interruptible():
    """SIGINT raises KeyboardInterrupt, as in a foreground shell, also when pytest runs as a
    background job (which starts with SIGINT ignored, so a raised SIGINT would do nothing)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _report_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("signal_name", "code", "how"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
def test_a_report_interrupted_while_it_is_built_leaves_the_previous_one(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    interruptible: None,
    signal_name: str,
    code: int,
    how: str,
) -> None:
    import signal

    from posbench.report import plots

    out = tmp_path / "out"
    config = write_config(tmp_path)
    assert invoke("run", "--config", str(config), "--out", str(out)).exit_code == 0
    before = _report_files(out / "report")
    assert "report.html" in before and "results.csv" in before
    real = plots.cost_plot

    def interrupted(*args: object, **kwargs: object) -> object:
        signal.raise_signal(getattr(signal, signal_name))
        return real(*args, **kwargs)

    monkeypatch.setattr(plots, "cost_plot", interrupted)
    result = invoke("report", str(out))
    assert result.exit_code == code
    assert result.output.startswith(f"{how}: {out / 'report'} holds its previous report")
    assert result.output.endswith("run the same command again to write the report.\n")
    assert len(result.output.splitlines()) == 1
    assert _report_files(out / "report") == before


def test_a_report_interrupted_while_it_is_written_is_written_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interruptible: None
) -> None:
    import signal

    from posbench import store

    out = tmp_path / "out"
    config = write_config(tmp_path)
    assert invoke("run", "--config", str(config), "--no-report", "--out", str(out)).exit_code == 0
    real, calls = store.atomic_write_bytes, []

    def interrupted_after_the_first(path: Path, data: bytes, flag: str = "--out") -> None:
        calls.append(path.name)
        real(path, data, flag)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(store, "atomic_write_bytes", interrupted_after_the_first)
    result = invoke("report", str(out))
    assert result.exit_code == 130 and result.output.startswith("interrupted: ")
    assert len(calls) > 3 and calls[-1] == "report.html"  # the whole set, then the interrupt
    written = _report_files(out / "report")
    tables = {"report.html", "report.json", "results.csv", "summary.csv", "by_length.csv"}
    assert tables <= set(written)
    assert sum(name.startswith("figures/") for name in written) == len(calls) - len(tables)


def test_a_run_interrupted_while_its_report_is_built_says_the_runs_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interruptible: None
) -> None:
    import signal

    from posbench.report import plots

    out = tmp_path / "out"
    config = write_config(tmp_path)

    def interrupted(*args: object, **kwargs: object) -> object:
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("the interrupt should have stopped the report")

    monkeypatch.setattr(plots, "cost_plot", interrupted)
    result = invoke("run", "--config", str(config), "--out", str(out))
    assert result.exit_code == 130
    assert f"interrupted: every finished run is stored in {out}" in result.output
    assert f"`posbench report {out}`" in result.output
    assert not (out / "report").exists()
    monkeypatch.undo()
    assert invoke("report", str(out)).exit_code == 0


# ---- progress where there is no terminal ---------------------------------------------------
def test_plain_progress_lines_when_stdout_is_not_a_terminal(tmp_path: Path) -> None:
    config = write_config(tmp_path, TINY_TOML.replace("steps = 3", "steps = 20"))
    result = invoke("run", "--config", str(config), "--no-report", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0
    for fragment in (
        "sweep: 2 run(s), 0 already done, 2 to run",
        "copy / nope / seed 0: started, 20 steps",
        "copy / nope / seed 0: step 20/20, loss",
        "copy / nope / seed 0: evaluating",
        "copy / nope / seed 0: stored, ok in",
    ):
        assert fragment in result.output, result.output
    assert "\x1b[" not in result.output  # no terminal control codes in a log


# ---- bad input: one sentence, never a crash, a hang or a write elsewhere ----------------------
def test_bench_refuses_a_nan_run_time_and_an_impossible_length(tmp_path: Path) -> None:
    out = str(tmp_path / "bench")
    one_sentence_error(
        invoke("bench", "--min-run-time", "nan", "--out", out), "--min-run-time", "nan"
    )
    one_sentence_error(
        invoke("bench", "--encodings", "alibi", "--seq-lens", "100000000", "--out", out),
        "length 100000000 with 'alibi' needs at least",
        "GiB available",
    )
    # NoPE's attention never forms the scores: its activations alone are what cannot fit
    one_sentence_error(
        invoke("bench", "--encodings", "nope", "--seq-lens", "10000000", "--out", out),
        "length 10000000 with 'nope' needs at least",
        "(its attention tensor and the layer's activations)",
    )
    assert not (tmp_path / "bench").exists()  # refused before anything was written


def test_more_threads_than_cores_are_refused_in_one_sentence(tmp_path: Path) -> None:
    import os

    cores = os.cpu_count()
    out = str(tmp_path / "out")
    fragment = f"--threads = 100000 asks for more threads than this machine's {cores} cores"
    one_sentence_error(invoke("bench", "--threads", "100000", "--out", out), fragment)
    config = write_config(tmp_path)
    one_sentence_error(
        invoke("run", "--config", str(config), "--threads", "100000", "--out", out), fragment
    )
    toml = write_config(tmp_path, "threads = 100000\n" + TINY_TOML)
    one_sentence_error(invoke("run", "--config", str(toml), "--out", out), "threads = 100000")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "toml,fragments",
    [
        ("encodings = []\n", ["encodings = [] names nothing"]),
        ("tasks = []\n", ["tasks = [] names nothing"]),
        ("[train]\nlr = inf\n", ["option 'lr' must be a number > 0", "inf"]),
        ('name = "../../x"\n', ["name = '../../x' must be a plain folder name"]),
        ('name = "/tmp/elsewhere"\n', ["must be a plain folder name"]),
    ],
)
def test_config_values_that_would_run_everything_or_escape_are_refused(
    tmp_path: Path, toml: str, fragments: list[str]
) -> None:
    config = write_config(tmp_path, toml)
    # where name = "../../x" and "/tmp/elsewhere" would write: nothing may appear there (they
    # may exist already, e.g. /tmp/x beside a clone in /tmp, so their contents are compared)
    escapes = [Path("results", "..", "..", "x").resolve(), Path("/tmp/elsewhere")]
    before = [_tree(path) for path in escapes]
    one_sentence_error(invoke("run", "--config", str(config), "--steps", "1"), *fragments)
    assert [_tree(path) for path in escapes] == before


def _tree(path: Path) -> set[Path] | None:
    """Everything under `path` (None: no such path)."""
    return set(path.rglob("*")) | {path} if path.exists() else None


def test_an_infinite_option_in_a_variant_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    one_sentence_error(
        invoke("run", "--config", str(config), "--eval-variants", "t5:num_buckets=inf"),
        "num_buckets",
    )
    one_sentence_error(
        invoke("run", "--config", str(config), "--encodings", "rope",
               "--eval-variants", "rope:scaling=yarn,factor=inf,original_length=8"),
        "option 'factor' must be a number >= 1, got inf",
    )  # fmt: skip


def test_a_config_file_that_is_not_utf8_is_one_sentence(tmp_path: Path) -> None:
    config = tmp_path / "latin1.toml"
    config.write_bytes('about = "d\xe9j\xe0 vu"\n'.encode("latin-1"))
    one_sentence_error(
        invoke("run", "--config", str(config)), "is not UTF-8 text", "save it as UTF-8"
    )


def test_inspect_checks_what_it_reads(tmp_path: Path) -> None:
    """A stored diagnostics file changed after the run (a byte appended, cut short) is named,
    never read into a traceback or a table of nan."""
    out = tmp_path / "sweep"
    run_sweep(tiny_sweep("t5", steps=2), out)
    run = next(p for p in out.iterdir() if (p / "terms.csv").exists())
    with open(run / "terms.csv", "ab") as handle:
        handle.write(b"\x00")
    one_sentence_error(invoke("inspect", str(run)), "terms.csv was changed or cut short")


def test_advice_that_works(tmp_path: Path) -> None:
    """Each sentence's fix is one the tool accepts: a run folder given to report names its
    sweep folder, a plugin file names its folder, a bad seed shows the list as written."""
    import warnings

    from posbench.plugins import PluginWarning

    out = tmp_path / "sweep"
    run_sweep(tiny_sweep("nope", steps=1), out)
    run = next(p for p in out.iterdir() if (p / "config.json").exists())
    one_sentence_error(
        invoke("report", str(run)),
        f"is one run's folder; pass the sweep folder that holds it ({out})",
    )
    plugin = tmp_path / "mine.py"
    plugin.write_text("")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_plugin_dir(plugin)
    assert any(
        issubclass(w.category, PluginWarning) and f"pass {tmp_path}" in str(w.message)
        for w in caught
    )
    one_sentence_error(invoke("run", "--seeds", "-1", "--steps", "1"), "got [-1].")


def test_a_model_too_big_to_train_is_one_sentence_before_it_is_built(tmp_path: Path) -> None:
    config = write_config(tmp_path, TINY_TOML.replace("d_model = 16", "d_model = 1000000"))
    one_sentence_error(
        invoke("run", "--config", str(config), "--out", str(tmp_path / "o")),
        "d_model=1000000",
        "GiB available; lower the [model] sizes.",
    )
    assert not (tmp_path / "o").exists()


def test_randomized_positions_beyond_the_bound_are_refused_not_drawn(tmp_path: Path) -> None:
    toml = TINY_TOML.replace('"nope",', '{ name = "nope", randomize_positions = 1000000000000 },')
    one_sentence_error(
        invoke("run", "--config", str(write_config(tmp_path, toml)), "--dry-run"),
        "randomize_positions",
        "<= 1048576",
    )


def test_dry_run_lists_the_runs_and_what_is_stored_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path)
    planned = invoke("run", "--config", str(config), "--out", str(out), "--dry-run")
    assert planned.exit_code == 0, planned.output
    assert "2 training run(s), 0 stored already" in planned.output and not out.exists()
    assert invoke("run", "--config", str(config), "--out", str(out), "--no-report").exit_code == 0
    before = sorted(p.name for p in out.rglob("*"))
    again = invoke("run", "--config", str(config), "--out", str(out), "--dry-run")
    assert "2 training run(s), 2 stored already" in again.output
    assert re.search(r"copy / nope / seed 0\s*│\s*[0-9a-f]{12}\s*│\s*stored", again.output)
    assert sorted(p.name for p in out.rglob("*")) == before


def test_a_task_evaluated_only_in_distribution_is_reported_with_the_reason(
    tmp_path: Path,
) -> None:
    """No evaluated length reaches 2x: no headline to rank, said in one sentence, no crash."""
    toml = TINY_TOML.replace("eval_lengths = [2, 3, 6]", "eval_lengths = [2, 3]")
    assert toml != TINY_TOML
    out = tmp_path / "sweep"
    result = invoke("run", "--config", str(write_config(tmp_path, toml)), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "No artists" not in result.output
    sentence = (
        "copy is not in the overview: its headline is read at 2x the longest training length "
        "(6), and its longest evaluated length is 3; add an evaluation length of at least 6"
    )
    assert sentence in " ".join(result.output.split())
    assert sentence in (out / "report" / "report.html").read_text()
    assert pd.read_csv(out / "report" / "summary.csv").empty


def test_a_training_batch_that_cannot_fit_is_one_sentence_before_anything_runs(
    tmp_path: Path,
) -> None:
    toml = TINY_TOML.replace("batch_size = 4", "batch_size = 1000000000")
    out = tmp_path / "sweep"
    result = invoke("run", "--config", str(write_config(tmp_path, toml)), "--out", str(out))
    one_sentence_error(
        result, "in batches of 1000000000 needs about", "lower [train] batch_size"
    )
    assert not list(out.glob("*/config.json"))  # nothing started


def test_an_encoding_too_large_to_train_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """A learned table of 10^9 positions: counted on the meta device, never allocated (the dry
    run used to build it: minutes and gigabytes)."""
    toml = TINY_TOML.replace(
        '{ name = "t5", num_buckets = 8, max_distance = 16 }',
        '{ name = "learned", max_positions = 1000000000 }',
    )
    config = write_config(tmp_path, toml)
    result = invoke("run", "--config", str(config), "--dry-run", "--out", str(tmp_path / "o"))
    one_sentence_error(
        result, "the decoder with 'learned(max_positions=1000000000)'", "parameters, whose"
    )


PLUGIN = '''
import torch
from posbench import PositionalEncoding, register_encoding


@register_encoding("test_edited")
class Edited(PositionalEncoding):
    """A distance bias whose slope a user edits between runs."""

    relative = True

    def position_bias(self, q_span, k_span, layer, device):
        distance = q_span.arange(device)[:, None] - k_span.arange(device)[None, :]
        return SLOPE * distance.float().expand(self.n_heads, -1, -1)
'''


def test_editing_a_plugins_code_makes_its_runs_a_new_configuration(tmp_path: Path) -> None:
    """Seed 0 on the old code, then seeds 0 and 1 on the edited code: the edited sweep holds
    only runs of the new code, and both codes' runs stay stored apart."""
    import subprocess
    import sys

    plugins, out = tmp_path / "plugins", tmp_path / "sweep"
    plugins.mkdir()
    config = write_config(tmp_path, TINY_TOML.replace('"nope", ', '"test_edited", '))

    def run(slope: str, seeds: str) -> None:
        (plugins / "edited.py").write_text(PLUGIN.replace("SLOPE", slope))
        command = [sys.executable, "-m", "posbench.cli", "--plugins", str(plugins), "run"]
        command += ["--config", str(config), "--encodings", "test_edited", "--seeds", seeds]
        done = subprocess.run(command + ["--out", str(out), "--no-report"], capture_output=True)
        assert done.returncode == 0, done.stderr.decode()

    run("-0.1", "0")
    old = {p.parent.name for p in out.glob("*/result.json")}
    run("-0.5", "0,1")
    frame = pd.read_csv(out / "results.csv")
    assert frame["run_id"].nunique() == 2 and not old & set(frame["run_id"])  # seed 0 redone
    configs = [json.loads(p.read_text()) for p in out.glob("*/config.json")]
    digests = {c["plugin_code"]["encoding"] for c in configs}
    assert len(configs) == 3 and len(digests) == 2  # the old run kept, apart
