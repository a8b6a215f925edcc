"""The C++ kernels' build and cache: a build killed midway (kill -9) leaves no stale lock and
no compiler behind, a truncated cached library is rebuilt instead of crashing the process, and
a failed build says what went wrong and the fix that fits it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from posbench.kernels import native

BUILD = "from posbench.kernels import native; print(native.band_flash() is not None)"


def _build(extensions: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Build (or load) the band kernel in a fresh process with its own extensions folder."""
    return subprocess.run(
        [sys.executable, "-c", BUILD],
        env=os.environ | {"TORCH_EXTENSIONS_DIR": str(extensions)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _compilers_in(extensions: Path) -> list[str]:
    """Running processes that work in the extensions folder (ninja, c++, cc1plus)."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        text = " ".join(process.info["cmdline"] or []) + " " + (process.info["cwd"] or "")
        if str(extensions) in text:
            found.append(text[:120])
    return found


@pytest.mark.skipif(native.band_flash() is None, reason="no C++ kernel can be built here")
def test_a_build_killed_midway_leaves_nothing_that_blocks_or_breaks_the_next(
    tmp_path: Path,
) -> None:
    extensions = tmp_path / "extensions"
    building = subprocess.Popen(
        [sys.executable, "-c", BUILD],
        env=os.environ | {"TORCH_EXTENSIONS_DIR": str(extensions)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not _compilers_in(extensions) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _compilers_in(extensions), "the build never started its compiler"
    time.sleep(1.0)  # torch's loader holds its lock file now
    building.send_signal(signal.SIGKILL)
    building.wait()
    deadline = time.monotonic() + 15  # the watchdog ends the compiler
    while _compilers_in(extensions) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _compilers_in(extensions), _compilers_in(extensions)
    rerun = _build(extensions)  # hung forever on torch's stale lock before
    assert rerun.returncode == 0 and rerun.stdout.strip() == "True", rerun.stderr
    (library,) = extensions.glob("*/*.so")
    library.write_bytes(library.read_bytes()[: library.stat().st_size // 2])  # a torn cache
    again = _build(extensions)  # SIGBUS (exit -7) on loading it before
    assert again.returncode == 0 and again.stdout.strip() == "True", again.stderr
    assert (library.parent / native.BUILD_RECORD).is_file()


@pytest.mark.parametrize(
    "error, shown, fix",
    [
        (
            RuntimeError("Error building extension: " + "x" * 400 + "\nfatal error: "
                         "writing output: No space left on device\nninja: build stopped"),
            "No space left on device",
            "free disk space there",
        ),
        (
            PermissionError(13, "Permission denied: '/ro/torch_extensions/lock'"),
            "Permission denied",
            "make that folder writable, or set TORCH_EXTENSIONS_DIR to a writable folder",
        ),
        (FileNotFoundError(2, "No such file or directory: 'c++'"), "'c++'", "install g++"),
        (
            RuntimeError("Error building extension\nband_flash.cpp:1: error: expected ';'\n"
                         "ninja: build stopped: subcommand failed."),
            "error: expected ';'",
            "(a damaged build is redone) and run again",  # the cause is not one of ours
        ),
    ],
)  # fmt: skip
def test_a_failed_build_names_its_cause_in_full_and_the_fix_that_fits(
    error: Exception, shown: str, fix: str, tmp_path: Path
) -> None:
    text = native.build_failure(error, tmp_path / "build")
    assert shown in text and fix in text.split("To build it, ")[1], text
    assert f"{native.SWITCH}=0" in text and "\n" not in text


def test_a_failed_build_warns_once_per_sweep_not_once_per_worker(tmp_path: Path) -> None:
    from helpers import TINY_TOML, write_config

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the extensions folder should be\n")
    config = write_config(tmp_path, TINY_TOML.replace("seeds = [0]", "seeds = [0, 1, 2]"))
    command = [sys.executable, "-m", "posbench.cli", "run", "--config", str(config), "--out"]
    command += [str(tmp_path / "out"), "--executor", "processes", "--jobs", "2", "--no-report"]
    done = subprocess.run(
        command,
        env=os.environ | {"TORCH_EXTENSIONS_DIR": str(blocked)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert output.count("could not build its C++ attention kernel") == 1, output
    assert "set TORCH_EXTENSIONS_DIR to a writable folder" in output
