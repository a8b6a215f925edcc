"""The results store: one reader and writer of run and sweep folders, checksums, and stores
written by posbench 0.1 (read into today's columns without touching their files)."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from posbench.errors import ResultsError
from posbench.experiment.config import TaskSpec
from posbench.experiment.evaluation import POSITION_METRICS
from posbench.experiment.runner import run_sweep
from posbench.store import (
    COLUMNS,
    DAMAGED_DIR,
    MEASUREMENTS_FILE,
    RESULT_FILE,
    RunFolder,
    collect,
    current_columns,
    run_folders,
    sweep_lock,
)

from helpers import fail_fsync_for, invoke, one_sentence_error, tiny_sweep, write_config


def _as_written_by_0_1(folder: Path) -> None:
    """Rewrite a run's measurements as posbench 0.1 stored them (a profile's memory length in
    cache_len, a loss-by-position row's position in eval_len) with a checksum that matches."""
    frame = pd.read_csv(
        folder / MEASUREMENTS_FILE, keep_default_na=False, na_values=[""], dtype={"note": str}
    )
    by_position = frame["metric"].isin(POSITION_METRICS)
    frame.loc[by_position, "eval_len"] = frame.loc[by_position, "position"]
    profile = frame["seq_len"].notna() | frame["metric"].str.startswith("latency_decode")
    frame["cache_len"] = frame["mem_len"].where(profile)
    frame.loc[profile, "mem_len"] = math.nan
    old = frame[["eval_len", "mem_len", "seq_len", "cache_len", "metric", "value", "note"]]
    data = old.to_csv(index=False).encode()
    (folder / MEASUREMENTS_FILE).write_bytes(data)
    result = json.loads((folder / RESULT_FILE).read_text())
    result["files"][MEASUREMENTS_FILE] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "rows": len(old),
    }
    (folder / RESULT_FILE).write_text(json.dumps(result))


def test_a_store_written_by_posbench_0_1_loads_with_the_same_numbers(tmp_path: Path) -> None:
    sweep = dataclasses.replace(
        tiny_sweep("alibi", steps=2),
        profile=True,
        quick=True,
        tasks=(TaskSpec("lm", {"train_lengths": [8, 8], "eval_lengths": [8, 16]}),),
    )
    run_sweep(sweep, tmp_path / "sweep")
    today = collect(tmp_path / "sweep")
    assert list(today.columns) == COLUMNS
    assert (
        today["metric"].isin(POSITION_METRICS).any()
        and today["metric"].eq("latency_decode_ms").any()
    )
    for folder in run_folders(tmp_path / "sweep"):
        _as_written_by_0_1(folder.path)
        assert "cache_len" in pd.read_csv(folder.path / MEASUREMENTS_FILE).columns
        assert folder.is_finished()  # its checksums hold: the file is read as it is
    loaded = collect(tmp_path / "sweep")
    pd.testing.assert_frame_equal(loaded, today, check_dtype=False)


def test_todays_columns_pass_unchanged() -> None:
    frame = pd.DataFrame(
        [
            {
                "eval_len": 16.0,
                "position": 4.0,
                "mem_len": math.nan,
                "seq_len": math.nan,
                "metric": "lm_penalty",
                "value": 0.1,
                "note": "",
            }
        ]
    )
    pd.testing.assert_frame_equal(current_columns(frame), frame)


def test_run_folder_reads_its_own_files(tmp_path: Path) -> None:
    run_sweep(tiny_sweep("t5", steps=2), tmp_path / "sweep")
    folder = next(f for f in run_folders(tmp_path / "sweep"))
    assert folder.exists() and folder.is_finished() and not folder.is_profile()
    assert folder.label() == "copy / t5 / seed 0"
    assert folder.config()["encoding"]["name"] == "t5"
    assert folder.array("bias.npy").ndim == 2 and folder.table("terms.csv") is not None
    assert folder.table("no-such.csv") is None and folder.array("no-such.npy") is None
    assert set(folder.model_state()) >= {"tok_emb.weight"}
    assert not RunFolder(tmp_path / "sweep" / "nothing").exists()


def test_published_results_are_in_todays_columns() -> None:
    """Every published suite keeps its runs in one archive (reports/<suite>/runs.tar.xz), and
    the results.csv inside each (README's numbers) is migrated with the store."""
    from posbench.store import opened_sweep

    suites = sorted(path.parent for path in Path("reports").glob("*/report.json"))
    archives = sorted(Path("reports").glob("*/runs.tar.xz"))
    assert suites and [path.parent for path in archives] == suites
    for path in archives:
        with opened_sweep(path) as folder:
            csv = folder / "results.csv"
            frame = pd.read_csv(
                csv, keep_default_na=False, na_values=[""], dtype={"note": str}, nrows=50
            )
        assert list(frame.columns) == COLUMNS, path


# ---- damaged runs are detected, set aside and redone ------------------------------------------
def test_a_measurements_file_cut_at_a_row_boundary_is_detected_and_redone(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    first = run_sweep(tiny_sweep("nope", "rope"), out)
    before = pd.read_csv(first.results_csv)
    victim = out / first.ran[0] / "measurements.csv"
    lines = victim.read_text().splitlines(keepends=True)
    victim.write_text("".join(lines[: len(lines) // 2]))  # whole rows, simply fewer of them
    assert not RunFolder(out / first.ran[0]).is_finished()
    again = run_sweep(tiny_sweep("nope", "rope"), out)
    assert again.ran == [first.ran[0]] and list(again.set_aside) == ["copy / nope / seed 0"]
    assert "SHA-256" in again.set_aside["copy / nope / seed 0"]
    aside = list((out / DAMAGED_DIR).iterdir())
    assert len(aside) == 1 and (aside[0] / "measurements.csv").read_text() == "".join(
        lines[: len(lines) // 2]
    )
    pd.testing.assert_frame_equal(pd.read_csv(again.results_csv), before)


def test_one_garbled_run_does_not_block_the_sweep(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path)
    assert invoke("run", "--config", str(config), "--no-report", "--out", str(out)).exit_code == 0
    victim = sorted(p for p in out.iterdir() if (p / "measurements.csv").exists())[0]
    (victim / "measurements.csv").write_bytes(b"\x00\xff garbage")
    result = invoke("run", "--config", str(config), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "set aside" in result.output and "ran 1 run(s), skipped 1" in result.output
    again = invoke("run", "--config", str(config), "--out", str(out))
    assert again.exit_code == 0 and "ran 0 run(s), skipped 2" in again.output


def test_a_missing_model_file_is_named_with_a_hint_that_works(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path)
    assert invoke("run", "--config", str(config), "--no-report", "--out", str(out)).exit_code == 0
    victim = sorted(p for p in out.iterdir() if (p / "model.pt").exists())[0]
    (victim / "model.pt").unlink()
    report = invoke("report", str(out))
    assert report.exit_code == 0 and "run the same command again" not in report.output
    assert "`posbench run` on this sweep (the same --out) sets the damaged run aside" in " ".join(
        report.output.split()
    )
    rerun = invoke("run", "--config", str(config), "--out", str(out))
    assert rerun.exit_code == 0 and "ran 1 run(s)" in rerun.output
    assert (out / victim.name / "model.pt").exists()


def test_disk_full_during_a_run_is_one_sentence_and_marks_nothing_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path)
    fail_fsync_for(monkeypatch, "measurements.csv", errno.ENOSPC)
    one_sentence_error(
        invoke("run", "--config", str(config), "--out", str(out)),
        "No space left on the device",
        "measurements.csv",
        "free some disk space",
    )
    assert not [p for p in out.iterdir() if (p / "result.json").exists()]
    monkeypatch.undo()
    result = invoke("run", "--config", str(config), "--out", str(out))
    assert result.exit_code == 0 and "ran 2 run(s)" in result.output


def test_a_read_only_folder_is_one_sentence_even_when_every_run_is_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path)
    assert invoke("run", "--config", str(config), "--no-report", "--out", str(out)).exit_code == 0
    real_open = os.open

    def read_only(path, flags, *args, **kwargs):  # a read-only mount refuses every new file
        if str(path).startswith(str(out)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    one_sentence_error(
        invoke("run", "--config", str(config), "--out", str(out)),
        "Read-only file system",
        "choose another --out",
    )


def test_an_immutable_run_folder_is_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    config = write_config(tmp_path)
    assert invoke("run", "--config", str(config), "--no-report", "--out", str(out)).exit_code == 0
    victim = next(p for p in out.iterdir() if (p / "result.json").exists())
    (victim / "result.json").write_text(json.dumps({"status": "error", "error": "x"}))
    real_unlink = Path.unlink

    def immutable(self: Path, missing_ok: bool = False) -> None:
        if self.parent == victim:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", immutable)
    one_sentence_error(
        invoke("run", "--config", str(config), "--out", str(out)),
        "Operation not permitted",
        str(victim),
    )


def test_a_second_command_on_the_same_folder_is_told_who_holds_it(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    out.mkdir()
    with sweep_lock(out):
        with pytest.raises(
            ResultsError,
            match=rf"being written by another posbench command \(process {os.getpid()} ",
        ):
            run_sweep(tiny_sweep("nope"), out)
    assert len(run_sweep(tiny_sweep("nope"), out).ran) == 1  # the lock went with its holder


def _one_run(tmp_path: Path) -> tuple[Path, RunFolder]:
    out = tmp_path / "sweep"
    run_sweep(tiny_sweep("alibi", "nope", steps=2), out)
    return out, next(f for f in run_folders(out) if f.config()["encoding"]["name"] == "alibi")


def test_a_hand_edited_config_is_noticed_and_the_run_redone(tmp_path: Path) -> None:
    """config.json is what a run is recomputed from: valid JSON that no longer hashes to the
    run's id is damage, never silently relabelled numbers."""
    out, folder = _one_run(tmp_path)
    edited = folder.config() | {"seed": 7}
    edited["encoding"] = edited["encoding"] | {"name": "nope"}
    (folder.path / "config.json").write_text(json.dumps(edited))
    assert "config.json was changed after the run wrote it" in folder.damage()
    outcome = run_sweep(tiny_sweep("alibi", "nope", steps=2), out)
    assert folder.run_id in outcome.ran and len(outcome.set_aside) == 1
    frame = collect(out)
    assert set(frame["encoding"]) == {"alibi", "nope"} and set(frame["seed"]) == {0}


@pytest.mark.parametrize("damage", ["garbled", "deleted"])
def test_a_garbled_or_deleted_config_is_set_aside_and_redone(tmp_path: Path, damage: str) -> None:
    out, folder = _one_run(tmp_path)
    if damage == "garbled":
        (folder.path / "config.json").write_text("{not json")
    else:
        (folder.path / "config.json").unlink()
    assert not folder.is_finished()
    outcome = run_sweep(tiny_sweep("alibi", "nope", steps=2), out)
    assert folder.run_id in outcome.ran and folder.run_id in [f.run_id for f in run_folders(out)]
    assert set(collect(out)["encoding"]) == {"alibi", "nope"}  # nothing dropped from results.csv


@pytest.mark.parametrize(
    "record",
    [
        {"status": "ok", "files": "abc"},
        {"status": "ok", "files": {"measurements.csv": {"rows": 3}}},
        {"status": 3, "files": {}},
        ["status", "ok"],
    ],
)
def test_a_result_record_of_the_wrong_shape_is_damage_not_a_crash(
    tmp_path: Path, record: object
) -> None:
    out, folder = _one_run(tmp_path)
    (folder.path / "result.json").write_text(json.dumps(record))
    assert "is not a posbench result" in folder.damage()
    problems: list[str] = []
    assert "alibi" not in set(collect(out, problems)["encoding"]) and problems
    outcome = run_sweep(tiny_sweep("alibi", "nope", steps=2), out)  # set aside and redone
    assert folder.run_id in outcome.ran and set(collect(out)["encoding"]) == {"alibi", "nope"}


def test_a_sweep_whose_record_was_lost_is_still_a_sweep(tmp_path: Path) -> None:
    """sweep.json deleted by hand or mid-sweep: the run folders are intact, so the next run
    skips them and writes the record again."""
    out, _ = _one_run(tmp_path)
    (out / "sweep.json").unlink()
    outcome = run_sweep(tiny_sweep("alibi", "nope", steps=2), out)
    assert not outcome.ran and len(outcome.skipped) == 2 and (out / "sweep.json").exists()


@pytest.mark.parametrize("name", ["results.csv", "summary.csv", "report.html"])
def test_report_never_overwrites_a_file_posbench_did_not_write(tmp_path: Path, name: str) -> None:
    from posbench.report.html import build_report

    out, _ = _one_run(tmp_path)
    target = tmp_path / "mine"
    target.mkdir()
    (target / name).write_text("my own notes\n")
    with pytest.raises(
        ResultsError, match=f"{name} exists and was not written by posbench; move it"
    ):
        build_report(out, target)
    assert (target / name).read_text() == "my own notes\n"
    build_report(out, tmp_path / "ours")
    build_report(out, tmp_path / "ours")  # its own files: rewritten


def test_a_run_folder_deleted_while_the_sweep_runs_is_reported_missing(tmp_path: Path) -> None:
    import shutil

    from posbench.experiment.compute import SilentReporter

    out = tmp_path / "sweep"

    class DeletesTheFirst(SilentReporter):
        def run_finished(self, run, status: str, seconds: float) -> None:
            if not hasattr(self, "gone"):
                self.gone = run.label
                shutil.rmtree(out / run.run_id)

    reporter = DeletesTheFirst()
    outcome = run_sweep(tiny_sweep("alibi", "nope", steps=2), out, reporter=reporter)
    assert outcome.missing == [reporter.gone] and len(outcome.ran) == 2


def test_a_killed_writes_temporary_files_are_swept_up_on_the_next_run(tmp_path: Path) -> None:
    from posbench.report.html import build_report

    out, folder = _one_run(tmp_path)
    left = [
        out / ".results.csv.0123456789ab.tmp",
        folder.path / ".measurements.csv.abcdef012345.tmp",
    ]
    mine = out / ".notes.tmp"  # not a posbench temporary file: kept
    for path in [*left, mine]:
        path.write_text("half")
    run_sweep(tiny_sweep("alibi", "nope", steps=2), out)
    assert not any(path.exists() for path in left) and mine.exists()
    report = tmp_path / "report"
    report.mkdir()
    (report / ".report.html.0123456789ab.tmp").write_text("half")
    build_report(out, report)
    assert not list(report.glob(".*.tmp"))


def _git_of_posbench(*args: str) -> str:
    """git's answer in the folder of the posbench source that runs ('' outside a checkout)."""
    import subprocess

    import posbench

    source = Path(posbench.__file__).resolve().parent
    return subprocess.run(
        ["git", *args], cwd=source, capture_output=True, text=True
    ).stdout.strip()


def test_runs_record_the_commit_of_the_posbench_source_not_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from posbench.experiment.environment import git_commit

    head = _git_of_posbench("rev-parse", "HEAD")
    if not head:
        pytest.skip("posbench does not run from a git checkout here")
    monkeypatch.chdir(tmp_path)  # a folder outside any checkout
    assert git_commit().removesuffix("+changes") == head


def test_runs_of_two_configurations_are_never_averaged_without_the_sweep_record(
    tmp_path: Path,
) -> None:
    """Two `posbench run`s with other --steps into one folder, then sweep.json lost: each
    configuration keeps its own label, so no table pools them."""
    out = tmp_path / "sweep"
    run_sweep(tiny_sweep("nope", steps=2), out)
    run_sweep(tiny_sweep("nope", steps=3), out)
    kept = collect(out)
    assert set(kept["encoding_label"]) == {"nope"} and kept["run_id"].nunique() == 1
    (out / "sweep.json").unlink()
    apart = collect(out)
    assert apart["run_id"].nunique() == 2
    labels = apart.groupby("run_id")["encoding_label"].first()
    assert len(set(labels)) == 2 and all(label.startswith("nope [config ") for label in labels)
    from posbench.report.overview import overview

    assert sorted(overview(apart)["encoding_label"]) == sorted(labels)
    run_sweep(tiny_sweep("nope", steps=2, seeds=(1,)), tmp_path / "one")
    run_sweep(tiny_sweep("nope", steps=2, seeds=(0,)), tmp_path / "one")
    (tmp_path / "one" / "sweep.json").unlink()
    assert set(collect(tmp_path / "one")["encoding_label"]) == {"nope"}  # seeds of one config


def test_a_report_never_replaces_another_sweeps_results(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    run_sweep(tiny_sweep("nope", steps=2), first)
    run_sweep(tiny_sweep("alibi", steps=2), second)
    before = (second / "results.csv").read_bytes()
    result = invoke("report", str(first), "-o", str(second))
    one_sentence_error(result, f"{second} is another sweep's folder", "choose another -o")
    assert (second / "results.csv").read_bytes() == before
    assert invoke("report", str(first), "-o", str(first)).exit_code == 0  # its own folder


def test_recording_the_commit_never_rewrites_the_checkouts_index() -> None:
    """`git status` refreshes a stale index in place; the commit a run records is read without
    writing anything into the checkout."""
    import posbench
    from posbench.experiment.environment import git_commit

    git_dir = _git_of_posbench("rev-parse", "--absolute-git-dir")
    if not git_dir:
        pytest.skip("posbench does not run from a git checkout here")
    # a tracked file whose stat the index no longer matches
    os.utime(Path(posbench.__file__).resolve().parent / "version.py")
    index = Path(git_dir) / "index"
    before = index.stat().st_mtime_ns
    assert git_commit()
    assert index.stat().st_mtime_ns == before


@pytest.mark.parametrize("seeds", [2, 8])
def test_a_sweep_reads_each_stored_run_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeds: int
) -> None:
    """results.csv is rebuilt after every run; a run read and checked once is not read and
    hashed again while its result.json is unchanged (the rebuilds grew with the square of the
    runs)."""
    from collections import Counter

    reads: Counter[str] = Counter()
    measurements, damage = RunFolder.measurements, RunFolder.damage

    def counted_measurements(self: RunFolder) -> pd.DataFrame:
        reads[self.run_id] += 1
        return measurements(self)

    def counted_damage(self: RunFolder) -> str | None:
        reads[f"hash {self.run_id}"] += 1
        return damage(self)

    monkeypatch.setattr(RunFolder, "measurements", counted_measurements)
    monkeypatch.setattr(RunFolder, "damage", counted_damage)
    outcome = run_sweep(tiny_sweep("nope", steps=2, seeds=tuple(range(seeds))), tmp_path / "s")
    assert len(outcome.ran) == seeds
    per_run = [reads[run_id] for run_id in outcome.ran]
    hashed = [reads[f"hash {run_id}"] for run_id in outcome.ran]
    # a constant whatever the number of runs: once for the rebuilds during the sweep, once for
    # the final check; hashed also when the sweep looks for damaged and finished runs
    assert max(per_run) <= 2, reads
    assert max(hashed) <= 4, reads


def test_a_run_records_the_commit_its_process_loaded_not_where_the_checkout_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker imports posbench once and runs for hours while the checkout may move on: its
    runs record the commit read when the code was loaded."""
    from posbench.experiment import environment

    loaded = environment.loaded_commit()
    monkeypatch.setattr(environment, "git_commit", lambda: "f" * 40)  # the checkout moved on
    assert environment.environment("cpu")["git_commit"] == loaded

