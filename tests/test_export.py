"""Exported sweeps: run records without trained weights, that a report reads and a sweep
resumes from; and evaluation-time variants evaluated as soon as their base run is stored."""

from __future__ import annotations

import dataclasses
import errno
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from helpers import fail_fsync_for, invoke, one_sentence_error, tiny_sweep
from posbench.errors import ResultsError
from posbench.experiment.compute import SilentReporter
from posbench.experiment.planner import expand_runs
from posbench.experiment.outcome import SweepOutcome
from posbench.experiment.runner import run_sweep
from posbench.experiment.planner import variant_jobs
from posbench.experiment.variants import parse_variants
from posbench.report.html import build_report
from posbench.store import MODEL_FILE, MODEL_NOT_KEPT, RunFolder, export_sweep

VARIANT = "rope:scaling=linear,factor=2"


def _sweep():
    return dataclasses.replace(
        tiny_sweep("rope", "nope", steps=2), eval_variants=parse_variants(VARIANT)
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny sweep with one evaluation-time variant (read-only for the tests)."""
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    assert not run_sweep(_sweep(), out).failures
    return out


def _rows(folder: Path) -> pd.DataFrame:
    frame = pd.read_csv(folder / "results.csv")
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def _resume_without(finished: Path, tmp_path: Path, run_id: str) -> tuple[Path, SweepOutcome]:
    """Export the finished sweep, drop one run from the export, and run the sweep there."""
    dest = tmp_path / "runs"
    export_sweep(finished, dest)
    shutil.rmtree(dest / run_id)
    return dest, run_sweep(_sweep(), dest)


def test_an_export_keeps_every_record_but_the_weights(finished: Path, tmp_path: Path) -> None:
    dest = tmp_path / "runs"
    summary = export_sweep(finished, dest)
    assert summary.exported == 3 and summary.unfinished == 0
    assert not list(dest.glob(f"*/{MODEL_FILE}"))
    pd.testing.assert_frame_equal(_rows(dest), _rows(finished))
    for folder in dest.iterdir():
        if not folder.is_dir():
            continue
        exported, original = RunFolder(folder), RunFolder(finished / folder.name)
        assert exported.is_finished() and exported.damage() is None
        kept = original.result()["files"].get(MODEL_FILE)
        assert exported.result().get(MODEL_NOT_KEPT) == kept  # the weights' checksum stays
        assert exported.model_kept() is (kept is None)
    report = build_report(dest, tmp_path / "report")
    assert not report.missing and "rope [eval scaling=linear,factor=2]" in report.html.read_text()


def test_a_sweep_resumes_from_an_export_and_trains_only_what_it_lacks(
    finished: Path, tmp_path: Path
) -> None:
    sweep = _sweep()
    nope = next(run for run in expand_runs(sweep) if run.encoding.name == "nope")
    dest, outcome = _resume_without(finished, tmp_path, nope.run_id)
    assert outcome.ran == [nope.run_id] and not outcome.failures and not outcome.missing
    assert (dest / nope.run_id / MODEL_FILE).is_file()
    pd.testing.assert_frame_equal(_rows(dest), _rows(finished))


def test_a_variant_whose_base_was_exported_without_weights_is_a_named_failure(
    finished: Path, tmp_path: Path
) -> None:
    sweep = _sweep()
    (job,) = variant_jobs(sweep, expand_runs(sweep))
    dest, outcome = _resume_without(finished, tmp_path, job.run_id)
    assert "exported without its trained weights" in outcome.failures[job.label]
    assert not outcome.ran
    with pytest.raises(ResultsError, match="exported without its trained weights; run its sweep"):
        RunFolder(dest / job.base.run_id).model_bytes()


def test_a_variant_is_evaluated_as_soon_as_its_base_run_is_stored(tmp_path: Path) -> None:
    class Recorder(SilentReporter):
        def __init__(self) -> None:
            self.events: list[str] = []

        def note(self, text: str) -> None:
            self.events.append(text)

        def run_finished(self, run, status: str, seconds: float) -> None:
            self.events.append(f"finished {run.label}")

    sweep = _sweep()  # rope trains first, then nope
    reporter = Recorder()
    run_sweep(sweep, tmp_path / "sweep", reporter=reporter)
    order = [e for e in reporter.events if e.startswith("finished")]
    assert order == [
        "finished copy / rope / seed 0",
        "finished copy / rope [eval scaling=linear,factor=2] / seed 0",
        "finished copy / nope / seed 0",
    ]


def test_export_command_refuses_a_folder_that_is_not_a_sweep(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    result = invoke("export", str(tmp_path / "notes"), str(tmp_path / "runs"))
    one_sentence_error(result, "is not a posbench sweep folder", "--out folder")
    assert not (tmp_path / "runs").exists()


def test_export_command_refuses_to_export_a_sweep_into_itself(finished: Path) -> None:
    result = invoke("export", str(finished), str(finished))
    one_sentence_error(result, "is the sweep folder itself")


def test_export_command_refuses_a_folder_of_other_files(finished: Path, tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    result = invoke("export", str(finished), str(tmp_path / "mine"))
    one_sentence_error(result, "already holds files that are not a posbench sweep")
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "keep me"


def test_export_command_says_what_it_wrote(finished: Path, tmp_path: Path) -> None:
    result = invoke("export", str(finished), str(tmp_path / "runs"))
    assert result.exit_code == 0, result.output
    assert "exported 3 finished run(s)" in result.output
    assert "0 run(s) of the sweep not finished" in result.output
    marker = json.loads((tmp_path / "runs" / "sweep.json").read_text())
    assert marker == json.loads((finished / "sweep.json").read_text())


def test_export_command_refuses_a_file_as_its_destination(finished: Path, tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("not a folder")
    result = invoke("export", str(finished), str(tmp_path / "runs"))
    one_sentence_error(result, "DEST", "is a file, not a folder")


@pytest.mark.parametrize("name", ["result.json", "sweep.json", "results.csv"])
def test_export_onto_a_full_disk_names_dest_not_out(
    finished: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    fail_fsync_for(monkeypatch, name, errno.ENOSPC)
    result = invoke("export", str(finished), str(tmp_path / "copy"))
    text = one_sentence_error(result, "No space left on the device", "choose another DEST")
    assert "--out" not in text


def test_report_onto_a_file_is_one_sentence(finished: Path, tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("mine\n")
    result = invoke("report", str(finished), "-o", str(target))
    one_sentence_error(result, "is a file, and -o takes the folder a report is written into")
    assert target.read_text() == "mine\n"
