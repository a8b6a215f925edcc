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
    assert (library.parent / native.BUILD_RECORD).is_file()


@pytest.mark.skipif(native.band_flash() is None, reason="no C++ kernel can be built here")
def test_a_torn_cached_library_is_never_loaded_but_cleared_and_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached library cut short (loading it killed the process with SIGBUS) is cleared before
    torch's loader runs, so the loader builds afresh; the new build gets its record. The
    loader here is torch's stand-in, which copies the real build in as a compile would."""
    from torch.utils import cpp_extension

    built = native.build_directory("band_flash")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = native.build_directory("band_flash")
    directory.mkdir()
    library = directory / f"{directory.name}.so"
    whole = (built / f"{built.name}.so").read_bytes()
    library.write_bytes(whole[: len(whole) // 2])  # a torn cache, recorded as whole
    (directory / native.BUILD_RECORD).write_text((built / native.BUILD_RECORD).read_text())
    (directory / "band_flash.o").write_bytes(b"stale")
    loaded: list[list[str]] = []

    def load(**options: object) -> str:
        loaded.append(sorted(p.name for p in directory.iterdir()))
        library.write_bytes(whole)
        return "module"

    monkeypatch.setattr(cpp_extension, "load", load)
    assert native._build("band_flash") == "module"
    assert loaded == [[native.BUILD_LOCK]]  # the torn build and its objects were gone
    assert native._verified(directory)
    assert native._build("band_flash") == "module" and len(loaded) == 2  # cached: kept as is
    assert (directory / f"{directory.name}.so").read_bytes() == whole


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
