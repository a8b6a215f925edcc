"""Sweep archives (a published suite's runs as one .tar.xz): export writes them reproducibly,
report and export read them, and `run --from` takes a published suite's runs so that only the
runs it lacks train."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest
from helpers import invoke, one_sentence_error, tiny_sweep, write_config
from posbench.cli import COPIED_FROM
from posbench.experiment.runner import run_sweep
from posbench.store import MODEL_FILE, RunFolder, export_sweep, opened_sweep


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    assert not run_sweep(tiny_sweep("nope", "alibi", steps=2, seeds=(0, 1)), out).failures
    return out


def test_an_archive_is_reproducible_and_holds_the_export(finished: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "runs.tar.xz", tmp_path / "b" / "runs.tar.xz"
    assert export_sweep(finished, first).exported == 4
    export_sweep(finished, second)
    assert first.read_bytes() == second.read_bytes()  # same runs, same bytes
    export_sweep(finished, tmp_path / "folder")
    with opened_sweep(first) as unpacked:
        assert not list(unpacked.glob(f"*/{MODEL_FILE}"))
        names = sorted(p.relative_to(unpacked).as_posix() for p in unpacked.rglob("*"))
    folder = tmp_path / "folder"
    assert names == sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.name != ".lock"
    )
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["runs.tar.xz"]  # no leftovers


def test_report_and_export_read_an_archive_as_its_folder(finished: Path, tmp_path: Path) -> None:
    archive = tmp_path / "suite" / "runs.tar.xz"
    export_sweep(finished, archive)
    export_sweep(finished, tmp_path / "folder")
    from_archive = invoke("report", str(archive))  # the default: the archive's own folder
    assert from_archive.exit_code == 0, from_archive.output
    from_folder = invoke("report", str(tmp_path / "folder"), "-o", str(tmp_path / "r2"))
    assert from_folder.exit_code == 0, from_folder.output
    for name in ("results.csv", "summary.csv", "by_length.csv"):
        assert (tmp_path / "suite" / name).read_bytes() == (tmp_path / "r2" / name).read_bytes()
    html = (tmp_path / "suite" / "report.html").read_text()
    assert f"posbench report {archive}</code>" in html  # names the archive, not a temp folder
    again = tmp_path / "again"
    assert invoke("export", str(archive), str(again)).exit_code == 0
    pd.testing.assert_frame_equal(
        pd.read_csv(again / "results.csv"), pd.read_csv(tmp_path / "folder" / "results.csv")
    )


def _archive_with(path: Path, name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:xz") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.size = kind, len(data)
        if kind == tarfile.SYMTYPE:
            info.linkname, info.size = "/etc/passwd", 0
            tar.addfile(info)
        else:
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize(
    "name, kind, fragment",
    [
        ("runs/../../evil.txt", tarfile.REGTYPE, "which is not a file of a sweep archive"),
        ("/abs.txt", tarfile.REGTYPE, "which is not a file of a sweep archive"),
        ("runs/link", tarfile.SYMTYPE, "which is not a file of a sweep archive"),
        ("other/file.txt", tarfile.REGTYPE, "which is not a file of a sweep archive"),
    ],
)
def test_an_archive_with_a_member_outside_its_folder_is_refused(
    tmp_path: Path, name: str, kind: bytes, fragment: str
) -> None:
    archive = tmp_path / "bad" / "runs.tar.xz"
    _archive_with(archive, name, kind=kind)
    result = invoke("report", str(archive), "-o", str(tmp_path / "out"))
    one_sentence_error(result, fragment, "posbench export SWEEP")
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out").exists()


def test_a_corrupt_or_missing_archive_is_one_sentence(tmp_path: Path) -> None:
    corrupt = tmp_path / "runs.tar.xz"
    corrupt.write_bytes(b"not xz at all")
    one_sentence_error(invoke("report", str(corrupt)), "is not a readable sweep archive")
    missing = tmp_path / "none" / "runs.tar.xz"
    one_sentence_error(invoke("report", str(missing)), "does not exist")


def test_run_from_a_published_archive_trains_only_the_runs_it_lacks(tmp_path: Path) -> None:
    """The researcher's question, "where does my encoding land?": the suite's published runs
    are taken as they are, only the new encoding trains, and the report ranks all of them."""
    config = write_config(tmp_path)  # nope and t5 on copy, and t5 read again at another option
    variant = ("--eval-variants", "t5:max_distance=32")
    published = tmp_path / "published"
    run = ("run", "--config", str(config), *variant)
    assert invoke(*run, "--out", str(published), "--no-report").exit_code == 0
    archive = tmp_path / "reports" / "tiny" / "runs.tar.xz"
    assert invoke("export", str(published), str(archive)).exit_code == 0
    mine = tmp_path / "mine"
    plugin = ("--plugins", "tests/plugins")  # a plugin encoding, ranked against the published
    args = (*plugin, *run, "--encodings", "*,test_distance_table", "--out", str(mine))
    dry = invoke(*args, "--from", str(archive), "--dry-run")
    assert dry.exit_code == 0 and "would take 3 finished run(s)" in dry.output
    # the plan counts what --from would copy as stored: only the plugin's run trains
    assert "3 training run(s), 2 stored already; 1 evaluation variant(s)" in dry.output
    assert dry.output.count(COPIED_FROM) == 3
    assert not mine.exists()
    result = invoke(*args, "--from", str(archive))
    assert result.exit_code == 0, result.output  # the variant was taken, not redone unweighted
    assert "took 3 finished run(s)" in result.output
    trained = {f.label() for f in map(RunFolder, mine.iterdir()) if (f.path / MODEL_FILE).exists()}
    assert trained == {"copy / test_distance_table / seed 0"}
    frame = pd.read_csv(mine / "report" / "results.csv")  # the report ranks all three
    t5 = "t5(max_distance=16,num_buckets=8)"
    labels = {"nope", t5, f"{t5} [eval max_distance=32]", "test_distance_table"}
    assert set(frame["encoding_label"]) == labels


def test_run_from_runs_of_another_protocol_or_version_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path)
    published = tmp_path / "published"
    assert (
        invoke("run", "--config", str(config), "--out", str(published), "--no-report").exit_code
        == 0
    )
    other = invoke(
        "run", "--config", str(config), "--steps", "4", "--from", str(published),
        "--out", str(tmp_path / "x"),
    )  # fmt: skip
    one_sentence_error(other, "holds none of this sweep's 2 run(s)", "another protocol")
    monkeypatch.setattr("posbench.store.__version__", "0.9.0")
    newer = invoke(
        "run", "--config", str(config), "--from", str(published), "--out", str(tmp_path / "y")
    )
    one_sentence_error(newer, "made by posbench 0.2.0", "whose numbers may differ")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    assert json.loads((published / "sweep.json").read_text())["runs"]


def test_export_to_a_folder_named_like_an_archive_is_one_sentence(
    finished: Path, tmp_path: Path
) -> None:
    (tmp_path / "runs.tar.xz").mkdir()
    result = invoke("export", str(finished), str(tmp_path / "runs.tar.xz"))
    one_sentence_error(result, "is a folder, but its name ends in .tar.xz")
