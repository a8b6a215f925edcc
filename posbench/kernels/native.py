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

import functools
import hashlib
import os
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

from posbench.errors import ConfigError
from posbench.kernels.cpu import process_environment_kept

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


def _build(kernel: str) -> ModuleType | None:
    """Compile (or load the cached build of) csrc/<kernel>.cpp; None, with one warning, where
    it cannot be built."""
    if not enabled():
        return None
    announce = threading.Timer(SLOW_LOAD_SECONDS, _say_building, (kernel,))  # cached: at once
    announce.start()
    try:
        with _build_environment():
            from torch.utils import cpp_extension

            return cpp_extension.load(
                name=extension_name(kernel),
                sources=[str(SOURCES / f"{kernel}.cpp")],
                extra_cflags=compile_flags(torch.backends.cpu.get_cpu_capability()),
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
    except Exception as error:  # no compiler, a torch without MKL's BLAS, ...
        reason = " ".join(f"{type(error).__name__}: {error}".split())[:200]
        warnings.warn(
            f"posbench could not build its C++ attention kernel ({reason}); attention uses its "
            f"torch kernels instead, the same numbers more slowly. Install g++ and ninja to "
            f"build it, or set {SWITCH}=0 to skip the attempt.",
            RuntimeWarning,
        )
        return None
    finally:
        announce.cancel()
