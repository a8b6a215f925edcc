"""Sweeps: tidy results, resume, atomic writes, failures that do not stop the sweep."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from posbench.experiment.config import RunConfig, SweepConfig
from posbench.plugins import load_plugin_dir
from posbench.store import COLUMNS, RunFolder, read_json
from posbench.experiment.runner import load_run, run_sweep
from posbench.kernels import dispatch, native
from posbench.kernels.cpu import cpu_model

from helpers import tiny_sweep


def test_sweep_writes_tidy_results_and_run_folders(tmp_path: Path) -> None:
    outcome = run_sweep(tiny_sweep("nope", "rope"), tmp_path / "sw")
    assert len(outcome.ran) == 2 and not outcome.failures
    frame = pd.read_csv(outcome.results_csv)
    assert list(frame.columns) == COLUMNS
    assert set(frame["encoding"]) == {"nope", "rope"}
    assert set(frame["train_len_max"]) == {3}
    full = frame[
        (frame["metric"] == "exact_match") & frame["mem_len"].isna() & frame["eval_len"].notna()
    ]
    assert sorted(full["eval_len"].unique()) == [2, 3, 6]
    assert full["value"].between(0, 1).all()
    assert math.inf in set(frame["mem_len"].dropna())
    for run_id in outcome.ran:
        folder = tmp_path / "sw" / run_id
        for name in (
            "config.json",
            "measurements.csv",
            "env.json",
            "log.txt",
            "model.pt",
            "result.json",
        ):
            assert (folder / name).is_file(), name
        config = RunConfig.from_dict(read_json(folder / "config.json"))
        assert config.run_id == run_id  # the folder name is the hash of the stored config
        result = read_json(folder / "result.json")
        assert 0 < result["cpu_seconds"] <= result["seconds"] * torch.get_num_threads() + 0.5
        env = read_json(folder / "env.json")
        assert env["torch"] == torch.__version__
        assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
        assert env["cpu_model"] == cpu_model() and "last_level_cache_mib" in env
        assert env["native_kernels_allowed"] is native.enabled()
        served = result["attention_kernels"]  # what computed the numbers, counted per call
        assert served and all(n > 0 for n in served.values()), served
        chosen = env["attention"]  # the dispatcher's backend, and why the earlier ones refused
        assert chosen and all(entry["calls"] > 0 for entry in chosen.values()), chosen
        for backend, entry in chosen.items():
            names = [b.name for b in dispatch.BACKENDS]
            assert set(entry["refused"]) == set(names[: names.index(backend)]), entry
            assert all(reason for reason in entry["refused"].values())


def test_rerun_skips_and_reproduces_results(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    first = run_sweep(tiny_sweep(), out)
    csv = first.results_csv.read_text()
    again = run_sweep(tiny_sweep(), out)
    assert again.ran == [] and sorted(again.skipped) == sorted(first.ran)
    assert again.results_csv.read_text() == csv
    forced = run_sweep(tiny_sweep(), out, force=True)
    assert sorted(forced.ran) == sorted(first.ran)
    assert forced.results_csv.read_text() == csv  # same config and seed, same numbers


def test_resume_after_a_kill_redoes_only_unfinished_runs(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    first = run_sweep(tiny_sweep("nope", "rope", "alibi"), out)
    killed = first.ran[1]
    # a kill mid-run leaves no result.json (written last) and maybe a stray temp file
    (out / killed / "result.json").unlink()
    (out / killed / ".measurements.csv.123.tmp").write_text("half a fi")
    (out / killed / "measurements.csv").write_text("truncated")
    resumed = run_sweep(tiny_sweep("nope", "rope", "alibi"), out)
    assert resumed.ran == [killed]
    assert pd.read_csv(resumed.results_csv).equals(pd.read_csv(first.results_csv))


def test_run_is_reproducible_from_its_stored_config(tmp_path: Path) -> None:
    outcome = run_sweep(tiny_sweep("t5"), tmp_path / "sw")
    run, model = load_run(tmp_path / "sw" / outcome.ran[0])
    assert run.encoding.name == "t5" and run.seed == 0
    tokens = torch.randint(0, 11, (2, 6))
    assert model(tokens).shape == (2, 6, 11)


def test_failing_run_is_recorded_and_sweep_carries_on(tmp_path: Path) -> None:
    load_plugin_dir(Path("tests/plugins"))
    outcome = run_sweep(tiny_sweep("nope", "test_exploding", "rope"), tmp_path / "sw")
    assert len(outcome.ran) == 3
    assert list(outcome.failures) == ["copy / test_exploding / seed 0"]
    assert "boom in embed" in next(iter(outcome.failures.values()))
    frame = pd.read_csv(outcome.results_csv)
    assert set(frame["encoding"]) == {"nope", "rope"}
    failed = [
        r for r in outcome.ran if RunFolder(tmp_path / "sw" / r).result()["status"] == "error"
    ]
    assert "Traceback" in (tmp_path / "sw" / failed[0] / "log.txt").read_text()
    # an errored run is redone on the next invocation, finished ones are not
    again = run_sweep(tiny_sweep("nope", "test_exploding", "rope"), tmp_path / "sw")
    assert again.ran == failed


def test_foreign_output_folder_is_refused(tmp_path: Path) -> None:
    from posbench.errors import ResultsError

    (tmp_path / "mine.txt").write_text("someone's notes")
    with pytest.raises(ResultsError, match="not a posbench sweep"):
        run_sweep(tiny_sweep(), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def _stopping_twins(task: str, options: dict, stop: dict) -> SweepConfig:
    """`task` twice with one training: the task itself checks every 10 steps whether to stop
    (`stop`); TASK-fixed trains all 40 steps."""
    import dataclasses

    from posbench.experiment.config import TaskSpec

    return dataclasses.replace(
        tiny_sweep("sinusoidal", steps=40),
        tasks=(
            TaskSpec(task, options, stop | {"check_every": 10}),
            TaskSpec(task, options, label=f"{task}-fixed"),
        ),
    )


COPY = {"train_lengths": [1, 4], "eval_lengths": [4, 8]}


def test_a_fixed_budget_run_takes_the_model_of_a_twin_that_never_stopped(tmp_path: Path) -> None:
    from posbench.experiment.compute import RunJob, compute_run
    from posbench.experiment.planner import expand_runs
    from posbench.store import state_from_bytes

    sweep = _stopping_twins("copy", COPY, {"stop_at": 1.0})  # never reached in 40 steps
    outcome = run_sweep(sweep, tmp_path / "s")
    runs = {run.task.display(): run for run in expand_runs(sweep)}
    twin, fixed = (RunFolder(tmp_path / "s" / runs[k].run_id) for k in ("copy", "copy-fixed"))
    assert twin.result()["steps_done"] == 40
    log = (fixed.path / "log.txt").read_text()
    assert "its early stopping never triggered" in log and "trained 40 steps" not in log
    reused = fixed.model_state()
    assert all(torch.equal(reused[k], v) for k, v in twin.model_state().items())
    # and training it from its own config gives those weights, bit for bit
    trained = state_from_bytes(compute_run(RunJob(runs["copy-fixed"]), threads=1).model_state)
    assert all(torch.equal(reused[k], v) for k, v in trained.items())
    assert fixed.table("terms.csv") is not None  # the twin's training probes come along
    assert outcome.took_twin_model == [runs["copy-fixed"].run_id]
    # the same model under the same evaluation: its rows are the twin's, not evaluated again
    assert f"evaluation taken from run {runs['copy'].run_id}" in log
    assert not any(
        k.startswith("evaluation") and v > 0.5 for k, v in fixed.result()["time_split"].items()
    )

    def evaluated(folder: RunFolder) -> pd.DataFrame:
        rows = folder.measurements()
        rows = rows[~rows["metric"].isin(("steps_to_threshold", "train_loss_final"))]
        return rows.sort_values(["metric", "eval_len", "mem_len"]).reset_index(drop=True)

    pd.testing.assert_frame_equal(evaluated(fixed), evaluated(twin))
    assert (fixed.path / "answer_positions.csv").read_bytes() == (
        twin.path / "answer_positions.csv"
    ).read_bytes()


def test_a_fixed_budget_run_trains_itself_when_its_twin_stopped_early(tmp_path: Path) -> None:
    from posbench.experiment.planner import expand_runs

    lm = {"train_lengths": [8, 8], "eval_lengths": [8, 16]}
    sweep = _stopping_twins("lm", lm, {"stop_within": 100.0})  # near enough at the first check
    outcome = run_sweep(sweep, tmp_path / "s")
    runs = {run.task.display(): run for run in expand_runs(sweep)}
    twin = RunFolder(tmp_path / "s" / runs["lm"].run_id)
    fixed = RunFolder(tmp_path / "s" / runs["lm-fixed"].run_id)
    assert twin.result()["steps_done"] < 40
    assert "trained 40 steps" in (fixed.path / "log.txt").read_text()
    assert outcome.took_twin_model == []


def test_a_dry_run_names_the_twin_a_fixed_budget_run_may_take_its_model_from(
    tmp_path: Path,
) -> None:
    from helpers import invoke

    result = invoke(
        "run", "--suite", "randomized", "--encodings", "rope", "--tasks", "copy*", "--seeds",
        "0", "--dry-run", "--out", str(tmp_path / "s"),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "copy-fixed / rope / seed 0" in line)
    assert "run after its twin: copy / rope / seed 0 trains the same steps" in line
    assert not (tmp_path / "s").exists()


@pytest.mark.skipif(native.cope_flash() is None, reason="CoPE's C++ kernel cannot be built here")
def test_each_run_records_the_kernels_that_served_its_attention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CoPE's C++ kernel unavailable while the band kernel works: the run says CoPE ran in
    torch (env.json's old flag said the C++ kernels ran)."""
    from posbench.kernels import served

    first = run_sweep(tiny_sweep("cope", steps=2), tmp_path / "native")
    (used,) = [read_json(tmp_path / "native" / r / "result.json") for r in first.ran]
    assert served.CPP_COPE in used["attention_kernels"], used["attention_kernels"]
    monkeypatch.setattr(native, "cope_flash", lambda: None)
    second = run_sweep(tiny_sweep("cope", steps=2), tmp_path / "torch")
    (used,) = [read_json(tmp_path / "torch" / r / "result.json") for r in second.ran]
    kernels = used["attention_kernels"]
    assert served.TORCH_COPE in kernels and served.CPP_COPE not in kernels, kernels


def test_each_run_records_where_its_time_went_and_the_report_shows_it(tmp_path: Path) -> None:
    from posbench.report.html import build_report

    outcome = run_sweep(tiny_sweep("nope", steps=2), tmp_path / "sw")
    (run_id,) = outcome.ran
    result = read_json(tmp_path / "sw" / run_id / "result.json")
    split = result["time_split"]
    assert {"setup", "training", "evaluation, full context", "diagnostics", "storing"} <= set(split)
    assert "evaluation, free-running decoding" in split and "evaluation, caches" in split
    assert all(seconds >= 0 for seconds in split.values())
    computed = sum(v for part, v in split.items() if part != "storing")
    assert computed == pytest.approx(result["seconds"], abs=0.01 + 1e-3 * len(split)), split
    html = build_report(tmp_path / "sw", tmp_path / "report").html.read_text()
    assert "Where the time went" in html and '<td class="name">training</td>' in html
