"""The results store: one reader and writer of run and sweep folders, checksums, and stores
written by posbench 0.1 (read into today's columns without touching their files)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

import pandas as pd

from posbench.experiment.config import TaskSpec
from posbench.experiment.evaluation import POSITION_METRICS
from posbench.experiment.runner import run_sweep
from posbench.store import (
    COLUMNS,
    MEASUREMENTS_FILE,
    RESULT_FILE,
    RunFolder,
    collect,
    current_columns,
    run_folders,
)

from helpers import tiny_sweep


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
    """The committed results.csv files (README's numbers) are migrated with the store."""
    published = sorted(Path("reports").glob("*/results.csv"))
    assert published
    for path in published:
        frame = pd.read_csv(
            path, keep_default_na=False, na_values=[""], dtype={"note": str}, nrows=50
        )
        assert list(frame.columns) == COLUMNS, path
