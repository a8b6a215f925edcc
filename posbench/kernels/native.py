"""posbench's C++ attention kernel for the CPU (csrc/band_flash.cpp), compiled on first use.

Eager torch cannot fuse a position bias into the softmax of causal attention on the CPU: each
block of scores goes through several separate passes, and a bias that needs a gradient keeps
the backward pass off torch's flash kernel. The extension does both in one pass per block of
query rows, with torch's own BLAS and vector types, so a band or per-distance bias (T5,
DeBERTa, KERPLE) costs about what attention without one does.

It is built with torch's JIT extension loader (g++ and ninja, about 30 s once per machine and
torch version, with one line on stderr saying so; the result is cached under
~/.cache/torch_extensions). Where it
cannot be built or loaded, or ``POSBENCH_NATIVE_KERNELS=0`` is set, `band_flash()` is None
and attention takes its torch kernels: the same numbers, slower."""

from __future__ import annotations

import functools
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

#: Set to 0 to skip the C++ kernel (no compiler, or to measure the torch kernels).
SWITCH = "POSBENCH_NATIVE_KERNELS"
SOURCE = Path(__file__).resolve().parent / "csrc" / "band_flash.cpp"

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


def _say_building() -> None:
    print(
        "posbench: building its C++ attention kernel for this machine (once per machine and "
        "torch version, about 30 s)",
        file=sys.stderr,
        flush=True,
    )


@contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch's loader runs `ninja` from PATH; the ninja wheel (a dependency) installs it beside
    the interpreter, which PATH lacks when the venv is not activated. Put there for the build."""
    try:
        import ninja
    except ImportError:
        yield
        return
    before = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, before])
    try:
        yield
    finally:
        os.environ["PATH"] = before


def enabled() -> bool:
    """Whether the environment allows the C++ kernel (``POSBENCH_NATIVE_KERNELS`` is not 0)."""
    return os.environ.get(SWITCH, "1").strip() != "0"


def compile_flags(capability: str) -> list[str]:
    """g++ flags for a torch CPU capability ("AVX512", "AVX2", or anything else: portable)."""
    vector = _CAPABILITY_FLAGS.get(capability, ["-DCPU_CAPABILITY=DEFAULT"])
    return ["-O3", "-fopenmp", *vector]


def extension_name() -> str:
    """The build's name, with the torch version in it: a build never outlives its torch."""
    return "posbench_band_flash_" + re.sub(r"\W", "_", torch.__version__)


@functools.cache
def band_flash() -> ModuleType | None:
    """The compiled kernel (``forward``, ``backward``), or None where it is switched off or
    cannot be built here; a failed build warns once and attention takes its torch kernels."""
    if not enabled():
        return None
    from torch.utils import cpp_extension

    announce = threading.Timer(SLOW_LOAD_SECONDS, _say_building)  # a cached build loads at once
    announce.start()
    try:
        with _ninja_on_path():
            return cpp_extension.load(
                name=extension_name(),
                sources=[str(SOURCE)],
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
