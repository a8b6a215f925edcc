"""Fuzzing the sweep TOML and the command line: wrong types, nan and inf, empty lists, huge
numbers, path-like names, unknown keys, broken syntax and non-UTF-8 bytes. Every case ends in
exit 0 or one sentence with exit 2: never a traceback, a hang or a file written outside the
sweep folder. `run --dry-run` checks a sweep exactly as `run` does before it writes, so most
cases cost no training; a second property runs tiny sweeps for real under path-like names."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from posbench.cli import app

BASE: dict[str, Any] = {
    "tasks": [{"name": "copy", "train_lengths": [1, 3], "eval_lengths": [2, 3, 6]}],
    "encodings": ["nope", {"name": "t5", "num_buckets": 8, "max_distance": 16}],
    "seeds": [0],
    "profile": False,
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2},
    "train": {"steps": 2, "batch_size": 4, "warmup_steps": 1},
    "eval": {"n_samples": 8, "batch_size": 8},
}

#: Values no field expects, or expects only at its edges.
ODD_VALUES = st.sampled_from(
    [
        0,
        -1,
        1,
        2**31,
        10**18,
        1.5,
        math.nan,
        math.inf,
        -math.inf,
        1e308,
        "",
        "x",
        "../../x",
        "/tmp/elsewhere",
        "nope",
        "inf",
        [],
        [0],
        [1, 3],
        [3, 1],
        [-1, 2],
        [1, "a"],
        [math.nan],
        {},
        {"name": "nope"},
        {"name": "t5", "num_buckets": math.nan},
        {"name": "rope", "scaling": "yarn", "factor": math.inf},
        {"name": "no_such_encoding"},
        True,
    ]
)

#: (section or None for the top level, key); some exist, some do not.
KEYS = st.sampled_from(
    [
        (None, "tasks"),
        (None, "encodings"),
        (None, "seeds"),
        (None, "name"),
        (None, "profile"),
        (None, "device"),
        (None, "threads"),
        (None, "eval_variants"),
        (None, "no_such_key"),
        ("model", "d_model"),
        ("model", "n_layers"),
        ("model", "n_heads"),
        ("model", "d_ff"),
        ("train", "steps"),
        ("train", "lr"),
        ("train", "batch_size"),
        ("train", "train_mem_len"),
        ("train", "stop_at"),
        ("eval", "n_samples"),
        ("eval", "batch_size"),
        ("eval", "mem_len_factors"),
        ("eval", "no_such_key"),
        ("task", "train_lengths"),
        ("task", "eval_lengths"),
        ("task", "name"),
        ("task", "label"),
        ("task", "train"),
        ("encoding", "name"),
        ("encoding", "num_buckets"),
        ("encoding", "max_distance"),
        ("encoding", "label"),
        ("encoding", "randomize_positions"),
    ]
)


def toml_value(value: Any) -> str:
    """`value` written as TOML (nan and inf included, which JSON cannot say)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"


def toml_document(config: dict[str, Any]) -> str:
    """A sweep TOML file: top-level keys first, then one table per section."""
    top = [f"{k} = {toml_value(v)}" for k, v in config.items() if not isinstance(v, dict)]
    tables = [
        f"[{k}]\n" + "\n".join(f"{kk} = {toml_value(vv)}" for kk, vv in v.items())
        for k, v in config.items()
        if isinstance(v, dict)
    ]
    return "\n".join(top) + "\n\n" + "\n\n".join(tables) + "\n"


def mutated(mutations: list[tuple[tuple[str | None, str], Any]]) -> dict[str, Any]:
    config = json.loads(json.dumps(BASE))
    for (section, key), value in mutations:
        if section is None:
            config[key] = value
        elif section == "task":
            config["tasks"][0][key] = value
        elif section == "encoding":
            config["encodings"][1][key] = value
        else:
            config[section][key] = value
    return config


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def assert_exit_0_or_one_sentence(result: Result) -> None:
    """Exit 0, or exit 2 with one line `error: ...`; no exception escaped the command."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{type(result.exception).__name__}: {result.output}")
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and result.output.rstrip().endswith(errors[0].rstrip()), (
            result.output
        )


def run_in(folder: Path, *args: str) -> Result:
    """The command line run with `folder` as the working directory."""
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return CliRunner().invoke(app, list(args), catch_exceptions=True)
    finally:
        os.chdir(cwd)


FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,  # the same cases on every machine: a failure reproduces
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.timeout(600, method="thread")
@FUZZ
@given(mutations=st.lists(st.tuples(KEYS, ODD_VALUES), min_size=1, max_size=3))
def test_any_sweep_toml_is_checked_or_refused_in_one_sentence(
    tmp_path_factory: pytest.TempPathFactory, mutations: list
) -> None:
    work = tmp_path_factory.mktemp("fuzz")
    (work / "sweep.toml").write_text(toml_document(mutated(mutations)))
    before = files_under(work.parent)
    result = run_in(work, "run", "--config", "sweep.toml", "--dry-run")
    assert_exit_0_or_one_sentence(result)
    assert files_under(work.parent) == before  # a dry run writes nothing, anywhere


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe not utf-8 \x80",
        b"tasks = [",
        b"[model]\nd_model = 16\n[model]\nd_model = 8\n",
        b"encodings = 'nope'\ntasks = 'copy'\nseeds = 0\n",
        b"",
        b"\x00\x01\x02",
    ],
)
def test_broken_toml_files_are_one_sentence(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "sweep.toml").write_bytes(content)
    result = run_in(tmp_path, "run", "--config", "sweep.toml", "--dry-run")
    assert_exit_0_or_one_sentence(result)


FLAG_VALUES = st.sampled_from(
    [
        "0",
        "-1",
        "1",
        "nan",
        "inf",
        "-inf",
        "1e309",
        "99999999999999999999",
        "",
        " ",
        "abc",
        "1,,2",
        "0,0",
        "../x",
        "/tmp/x",
        "nope,",
        "t5:num_buckets=nan",
        "rope:scaling=yarn,factor=inf",
        "rope:scaling=yarn",
        "t5:no_such_option=1",
        "cuda:7",
        "ümlaut",
    ]
)
FLAGS = st.sampled_from(
    [
        "--steps",
        "--seeds",
        "--encodings",
        "--tasks",
        "--device",
        "--threads",
        "--train-mem-len",
        "--eval-variants",
        "--jobs",
        "--executor",
        "--name",
        "--out",
    ]
)


@pytest.mark.timeout(600, method="thread")
@FUZZ
@given(flags=st.lists(st.tuples(FLAGS, FLAG_VALUES), min_size=1, max_size=3))
def test_any_run_flags_are_checked_or_refused_in_one_sentence(
    tmp_path_factory: pytest.TempPathFactory, flags: list
) -> None:
    work = tmp_path_factory.mktemp("fuzz")
    (work / "sweep.toml").write_text(toml_document(BASE))
    before = files_under(work.parent)
    args = [part for flag, value in flags for part in (flag, value)]
    result = run_in(work, "run", "--config", "sweep.toml", *args, "--dry-run")
    if result.exit_code == 2 and "Usage:" in result.output:  # click's own message, e.g. a
        assert "Traceback" not in result.output  # non-integer --steps: one boxed sentence
        return
    assert_exit_0_or_one_sentence(result)
    assert files_under(work.parent) == before


@pytest.mark.timeout(600, method="thread")
@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(["../../escape", "/tmp/absolute", "a/b", "ok-name", "..", "ü n i"]),
    label=st.sampled_from(["../up", "a/b", "<b>", "plain", "..", "/abs"]),
)
@example(name="ok-name", label="../up")  # both run for real: the label is only a display name
@example(name="ok-name", label="/abs")
def test_real_runs_under_path_like_names_write_only_inside_their_folders(
    tmp_path_factory: pytest.TempPathFactory, name: str, label: str
) -> None:
    work = tmp_path_factory.mktemp("fuzz")
    config = mutated([((None, "name"), name), (("encoding", "label"), label)])
    config["encodings"] = config["encodings"][1:]  # one run: t5 under the label
    (work / "sweep.toml").write_text(toml_document(config))

    def beside_work() -> set[str]:
        return {p for p in files_under(work.parent) if Path(p).parts[0] != work.name}

    outside = beside_work()
    result = run_in(work, "run", "--config", "sweep.toml", "--no-report")
    assert_exit_0_or_one_sentence(result)
    assert beside_work() == outside
    assert not Path(name).is_absolute() or not Path(name).exists()
    written = files_under(work) - {"sweep.toml"}
    if result.exit_code == 0:
        assert written and all(path.split(os.sep)[0] == "results" for path in written)
    else:
        assert not written
