"""The command line: listing, a tiny run, and one clear sentence with exit code 2 for every
user mistake, with nothing written or lost."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from posbench.encodings import BUILTINS

from helpers import TINY_TOML, invoke


def test_help_and_list() -> None:
    assert invoke("--help").exit_code == 0
    result = invoke("list")
    assert result.exit_code == 0
    # every built-in, the repository's plugin folders, and tasks
    for name in (*BUILTINS, "gaussian_window", "copy", "rotate", "bucket_sort"):
        assert name in result.output
    assert "randomize_positions" in " ".join(
        result.output.split()
    )  # the option every encoding takes


def test_run_from_config_then_rerun_skips(tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text(TINY_TOML)
    out = tmp_path / "out"
    first = invoke("run", "--config", str(config), "--out", str(out))
    assert first.exit_code == 0, first.output
    assert "ran 2 run(s)" in first.output and str(out / "results.csv") in first.output
    frame = pd.read_csv(out / "results.csv")
    assert set(frame["encoding_label"]) == {"nope", "t5(max_distance=16,num_buckets=8)"}
    second = invoke("run", "--config", str(config), "--out", str(out))
    assert "ran 0 run(s), skipped 2" in second.output


def test_flags_override_config(tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text(TINY_TOML)
    out = tmp_path / "out"
    result = invoke(
        "run", "--config", str(config), "--out", str(out), "--encodings", "t5,rope", "--seeds", "1"
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(out / "results.csv")
    # t5 keeps the options the config gave it; seeds replaced
    assert set(frame["encoding_label"]) == {"rope", "t5(max_distance=16,num_buckets=8)"}
    assert set(frame["seed"]) == {1}


def _assert_user_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    text = " ".join(lines)
    for fragment in fragments:
        assert fragment in text, text


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--encodings", "txll"], ["Unknown encoding 'txll'", "Did you mean txl"]),
        (["--tasks", "cpy"], ["Unknown task 'cpy'", "copy"]),
        (["--encodings", "zz*"], ["No encoding matches 'zz*'"]),
        (["--seeds", "1,x"], ["--seeds takes comma-separated integers"]),
        (["--steps", "0"], ["--steps must be at least 1"]),
        (["--device", "cuda"], []),
    ],
)
def test_bad_flags(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    out = tmp_path / "out"
    result = invoke("run", "--out", str(out), *args)
    if args[0] == "--device":
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
        fragments = ["CUDA is not available", "--device cpu"]
    _assert_user_error(result, *fragments)
    assert not out.exists()


@pytest.mark.parametrize(
    "toml,fragments",
    [
        ("tasks = [\n", ["is not valid TOML"]),
        ('colour = "red"\n', ["Unknown key 'colour'"]),
        ("[train]\nstepz = 3\n", ["Unknown key 'stepz'", "[train]"]),
        (
            'encodings = [{ name = "t5", num_bucket = 8 }]\n',
            ["Unknown option 'num_bucket'", "num_buckets"],
        ),
        (
            'tasks = [{ name = "copy", train_lengths = [0, 4] }]\n',
            ["train_lengths", "1 <= lo <= hi"],
        ),
        (
            'encodings = [{ name = "learned", max_positions = 4 }]\ntasks = ["copy"]\n',
            ["trains on sequences of 16 tokens", "represents positions 0..3 only"],
        ),
        ('seeds = ["a"]\n', ["option 'seeds' must be a list of integers >= 0"]),
    ],
)
def test_bad_config(tmp_path: Path, toml: str, fragments: list[str]) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    out = tmp_path / "out"
    _assert_user_error(invoke("run", "--config", str(config), "--out", str(out)), *fragments)
    assert not out.exists()


def test_missing_config_file(tmp_path: Path) -> None:
    _assert_user_error(invoke("run", "--config", str(tmp_path / "nope.toml")), "does not exist")


def test_foreign_output_folder_keeps_its_files(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("precious")
    config = tmp_path / "sweep.toml"
    config.write_text(TINY_TOML)
    result = invoke("run", "--config", str(config), "--out", str(tmp_path))
    _assert_user_error(result, "not a posbench sweep", "another --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.toml", "thesis.tex"]


def test_failed_run_exits_nonzero_with_summary(tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text(TINY_TOML.replace('"nope"', '"nope", "test_exploding"'))
    result = invoke(
        "--plugins", "tests/plugins", "run", "--config", str(config), "--out", str(tmp_path / "out")
    )
    assert result.exit_code == 1
    assert "FAILED copy / test_exploding / seed 0" in result.output
