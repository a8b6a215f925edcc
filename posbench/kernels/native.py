"""posbench's C++ attention kernels for the CPU (csrc/), each compiled on first use: band_flash.cpp
(causal attention with no bias, a band, a per-distance table, a query-by-table product or a
dense bias) and cope_flash.cpp (CoPE's attention).

Eager torch cannot fuse a position bias into the softmax of causal attention on the CPU: each
block of scores goes through several separate passes, and a bias that needs a gradient keeps
the backward pass off torch's flash kernel. The extension does both in one pass per block of
query rows, with torch's own BLAS and vector types, so a band or per-distance bias (T5,
DeBERTa, KERPLE) costs about what attention without one does.

Each is built with torch's JIT extension loader (g++ and ninja, about 30 s once per machine,
torch version, version of the sources and checkout folder, with one line on stderr saying so;
the result is cached under ~/.cache/torch_extensions). Where one cannot be built or loaded, or
``POSBENCH_NATIVE_KERNELS=0`` is set, `band_flash()` or `cope_flash()` is None and attention
takes its torch kernels: the same numbers, slower."""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from posbench.errors import ConfigError
from posbench.kernels.cpu import process_environment_kept
from posbench.reaper import start_reaper

#: Set to 0 to skip the C++ kernels (no compiler, or to measure the torch kernels).
SWITCH = "POSBENCH_NATIVE_KERNELS"
SOURCES = Path(__file__).resolve().parent / "csrc"

#: Compiler flags for torch's vector types at the CPU capability torch itself runs with.
_CAPABILITY_FLAGS = {
    "AVX512": [
        "-DCPU_CAPABILITY=AVX512",
        "-DCPU_CAPABILITY_AVX512",
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mfma",
    ],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma"],
}


#: A load still running after this long is a build: one line on stderr says so.
SLOW_LOAD_SECONDS = 3.0


def _say_building(kernel: str) -> None:
    print(
        f"posbench: building its C++ attention kernel {kernel} for this machine (once per "
        f"machine, torch version and version of the kernel, about 30 s)",
        file=sys.stderr,
        flush=True,
    )


@contextmanager
def _build_environment() -> Iterator[None]:
    """What torch's loader needs for the build, and nothing left behind after it: `ninja` on
    PATH (the ninja wheel, a dependency, installs it beside the interpreter, which PATH lacks
    when the venv is not activated), then os.environ and sys.path as they were."""
    with process_environment_kept():
        try:
            import ninja

            os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
        except ImportError:
            pass
        yield


def serves(tensor: torch.Tensor) -> bool:
    """Whether the C++ kernels take tensors like this one: on the CPU, in float32 or float64."""
    return tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.float64)


#: The values of POSBENCH_NATIVE_KERNELS that turn the C++ kernels off, and those that leave
#: them on (case-insensitive; unset is on).
SWITCH_OFF, SWITCH_ON = ("0", "false", "off", "no"), ("1", "true", "on", "yes", "")


def enabled() -> bool:
    """Whether the environment allows the C++ kernel (``POSBENCH_NATIVE_KERNELS`` unset or on;
    off is 0, false, off or no). Any other value is a ConfigError, never read as on."""
    value = os.environ.get(SWITCH, "1").strip().lower()
    if value in SWITCH_OFF:
        return False
    if value in SWITCH_ON:
        return True
    raise ConfigError(
        f"{SWITCH}={os.environ[SWITCH]!r} is neither on ({', '.join(SWITCH_ON[:-1])}) nor off "
        f"({', '.join(SWITCH_OFF)}); set it to one of them or unset it."
    )


def compile_flags(capability: str) -> list[str]:
    """g++ flags for a torch CPU capability ("AVX512", "AVX2", or anything else: portable)."""
    vector = _CAPABILITY_FLAGS.get(capability, ["-DCPU_CAPABILITY=DEFAULT"])
    return ["-O3", "-fopenmp", *vector]


def extension_name(kernel: str = "band_flash") -> str:
    """A build's name, with the torch version and a digest of the C++ sources (the shared
    header included) in it: a build never outlives its torch or its code."""
    digest = hashlib.sha256()
    for path in sorted(SOURCES.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    torch_version = re.sub(r"\W", "_", torch.__version__)
    return f"posbench_{kernel}_{torch_version}_{digest.hexdigest()[:10]}"


@functools.cache
def band_flash() -> ModuleType | None:
    """The compiled band kernel (``forward``, ``backward``), or None where it is switched off or
    cannot be built here; a failed build warns and attention takes its torch kernels."""
    return _build("band_flash")


@functools.cache
def cope_flash() -> ModuleType | None:
    """The compiled CoPE kernel (``forward``, ``backward``), or None as for `band_flash`."""
    return _build("cope_flash")


@torch.compiler.assume_constant_result
def built(kernel: str) -> bool:
    """Whether `kernel` ("band_flash" or "cope_flash") is built here (building or loading it on
    first use). A constant to torch.compile, which then traces the kernel's operator alone,
    not its build."""
    return (band_flash() if kernel == "band_flash" else cope_flash()) is not None


class KernelBuildWarning(RuntimeWarning):
    """A C++ kernel could not be built: attention takes torch's kernels."""


def build_for(encodings: Collection[str]) -> None:
    """Build (or load) the kernels runs of these encodings use, in the driver before its workers
    start: a failure warns here once, and workers, which build or load them again, stay quiet
    about it (see quiet_workers)."""
    band_flash()
    if "cope" in encodings:
        cope_flash()


def quiet_workers() -> None:
    """In a worker process: leave kernel build failures to the driver, which warned once."""
    warnings.simplefilter("ignore", KernelBuildWarning)


def build_directory(kernel: str) -> Path:
    """Where `kernel`'s build lives: a folder named after the build (extension_name) under
    torch's extension root (``$TORCH_EXTENSIONS_DIR``, else ~/.cache/torch_extensions/...)."""
    with process_environment_kept():  # importing the loader puts setuptools' vendor on sys.path
        from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    return Path(root) / extension_name(kernel)


#: The record posbench writes beside a finished build: the library's size and SHA-256.
BUILD_RECORD = "posbench_build.json"
#: posbench's own lock on a build folder (an flock, released when its holder dies).
BUILD_LOCK = "posbench_build.lock"


def _library(directory: Path) -> Path:
    return directory / f"{directory.name}.so"


def _recorded(directory: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((directory / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _verified(directory: Path) -> bool:
    """Whether the folder holds a whole build: its library matches the size and digest
    recorded when it was built (loading a truncated library kills the process with SIGBUS)."""
    record, library = _recorded(directory), _library(directory)
    if record is None or not library.is_file() or library.stat().st_size != record.get("bytes"):
        return False
    return hashlib.sha256(library.read_bytes()).hexdigest() == record.get("sha256")


def _record_build(directory: Path) -> None:
    library = _library(directory).read_bytes()
    record = {"bytes": len(library), "sha256": hashlib.sha256(library).hexdigest()}
    temporary = directory / f".{BUILD_RECORD}.{os.getpid()}"
    temporary.write_text(json.dumps(record))
    temporary.replace(directory / BUILD_RECORD)


@contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Hold posbench's lock on the build folder. Every posbench build takes it first, so a lock
    file torch's loader left behind (its holder killed mid-build) is stale once this is held."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / BUILD_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # waits for a live build by another process
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _clear(directory: Path) -> None:
    """Remove an unverified build (torn, truncated, or from before records were kept) and the
    lock torch's loader may have left, so the loader builds afresh."""
    for path in directory.iterdir():
        if path.name == BUILD_LOCK:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _build(kernel: str) -> ModuleType | None:
    """Compile (or load the verified cached build of) csrc/<kernel>.cpp; None, with one
    warning, where it cannot be built. A build killed midway leaves nothing that blocks or
    breaks the next: posbench's lock dies with its holder, a build without a matching record is
    cleared and redone, and a watchdog ends the compiler if posbench is killed while it runs."""
    if not enabled():
        return None
    announce = threading.Timer(SLOW_LOAD_SECONDS, _say_building, (kernel,))  # cached: at once
    announce.start()
    directory = build_directory(kernel)
    try:
        with _build_environment(), _build_lock(directory):
            from torch.utils import cpp_extension

            fresh = not _verified(directory)
            if fresh:
                _clear(directory)
            watchdog = start_reaper(os.getpid()) if fresh else None
            try:
                module = cpp_extension.load(
                    name=extension_name(kernel),
                    sources=[str(SOURCES / f"{kernel}.cpp")],
                    extra_cflags=compile_flags(torch.backends.cpu.get_cpu_capability()),
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(directory),
                    verbose=False,
                )
            finally:
                if watchdog is not None:
                    watchdog.kill()
                    watchdog.wait()
            if not _verified(directory):  # built now (torch's loader rebuilds on its own
                _record_build(directory)  # when the sources' path or flags changed)
            return module
    except Exception as error:  # no compiler, no disk space, a torch without MKL's BLAS, ...
        warnings.warn(build_failure(error, directory), KernelBuildWarning)
        return None
    finally:
        announce.cancel()


#: What a failed build's message says, and the fix for it, first match wins.
_BUILD_FIXES = (
    (("No space left",), "free disk space there"),
    (
        ("Permission denied", "Read-only file system", "Not a directory", "File exists"),
        "make that folder writable, or set TORCH_EXTENSIONS_DIR to a writable folder",
    ),
    (
        (
            "not found",
            "No such file or directory: 'c++'",
            "No such file or directory: 'ninja'",
            "Ninja is required",
        ),
        "install g++ and ninja",
    ),
)


#: The lines of a failed build's output that say what went wrong.
TELLING = re.compile(
    r"error|not found|No space|denied|Read-only|Not a directory|File exists", re.IGNORECASE
)


def build_failure(error: BaseException, directory: Path) -> str:
    """One warning for a failed build: the lines of the compiler's output that say what went
    wrong (never cut short), and the fix that fits them."""
    text = f"{type(error).__name__}: {error}"
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if TELLING.search(line)]
    reason = "; ".join(dict.fromkeys(telling[-3:] or lines[-3:]))
    fix = next(
        (fix for needles, fix in _BUILD_FIXES if any(n in text for n in needles)),
        f"delete {directory} (a damaged build is redone) and run again",
    )
    return (
        f"posbench could not build its C++ attention kernel in {directory} ({reason}); "
        f"attention uses its torch kernels instead, the same numbers more slowly. To build it, "
        f"{fix}; or set {SWITCH}=0 to skip the attempt."
    )
