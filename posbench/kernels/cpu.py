"""CPU compute settings: the thread count, float32 denormals flushed to zero on every CPU
thread torch computes on, and freed memory kept for reuse.

Softmax over long rows produces probabilities such as exp(-100) that are denormal in float32;
x86 cores process those tens of times slower, and ALiBi's linear penalty makes them common
(they make its forward and backward pass about twice as slow as attention without positions).
``torch.set_flush_denormal`` sets
FTZ/DAZ for the calling thread only, while torch's kernels run on OpenMP worker threads, so
this runs it once inside an OpenMP parallel region of the runtime torch itself loaded.
TensorFlow flushes denormals on its compute threads by default for the same reason; the effect
on results is below 1e-38 in absolute value. posbench's own blocked kernels do not depend on it
(posbench.kernels.probabilities keeps their probabilities out of the denormal range); torch's
flash kernel, which runs ALiBi's bias, does.

glibc's malloc maps every block over 32 MiB afresh and unmaps it when freed, so each new
(H, L, L) tensor at L = 2048 (64 MiB) pays 16,384 page faults when first written: 20 ms of a
23 ms Toeplitz expansion on this project's 2-core machine, a cost of the allocator, not of the
encoding, that a process linked with jemalloc or tcmalloc (PyTorch's CPU tuning advice) never
pays. ``keep_freed_memory`` raises glibc's mapping and trimming thresholds so those blocks are
reused in posbench's own processes; it changes when memory returns to the system, never a
computed number."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch

_OPENMP_RUNTIMES = ("libgomp", "libiomp5", "libomp")
_applied: set[tuple[int, int, int]] = set()
_CALLBACK_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
#: Freed blocks up to this size stay in the process for reuse (glibc's adaptive threshold stops
#: at 32 MiB).
RETAINED_BYTES = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
#: Set in the environment, these keep glibc's malloc as the caller configured it.
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _loaded_openmp_runtime() -> str | None:
    """Path of the OpenMP runtime mapped into this process, torch's own first (a wheel ships
    one in torch/lib; other packages may have loaded another), or None (not Linux, or none)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    runtimes = sorted(p for p in paths if os.path.basename(p).startswith(_OPENMP_RUNTIMES))
    torch_dir = os.path.dirname(torch.__file__)
    runtimes.sort(key=lambda path: not path.startswith(torch_dir))  # stable: torch's first
    return runtimes[0] if runtimes else None


def _set_on_openmp_workers(n_threads: int, enabled: bool) -> bool:
    """Run torch.set_flush_denormal(enabled) on each thread of an n_threads OpenMP team; False
    when no OpenMP runtime with the GNU entry point is mapped."""
    path = _loaded_openmp_runtime()
    if path is None:
        return False
    runtime = ctypes.CDLL(path)
    if not hasattr(runtime, "GOMP_parallel"):
        return False
    runtime.GOMP_parallel.argtypes = [_CALLBACK_TYPE, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    runtime.GOMP_parallel.restype = None
    callback = _CALLBACK_TYPE(lambda _: torch.set_flush_denormal(enabled))
    runtime.GOMP_parallel(callback, None, n_threads, 0)  # the caller joins the team as thread 0
    return True


def flush_denormals() -> bool:
    """Set flush-to-zero and denormals-are-zero on this thread and torch's CPU workers.

    Idempotent and cheap to repeat; call it again after ``torch.set_num_threads`` changes the
    team. Returns False where the CPU does not support it (then nothing changes).
    ``denormals_flushed`` tells whether the workers were reached too. Library code should use
    ``compute_settings``, which undoes this on exit."""
    if not torch.set_flush_denormal(True):
        return False
    key = (os.getpid(), threading.get_ident(), torch.get_num_threads())
    if key not in _applied and (
        torch.get_num_threads() == 1 or _set_on_openmp_workers(torch.get_num_threads(), True)
    ):
        _applied.add(
            key
        )  # without a reachable OpenMP runtime only this thread flushes: not recorded
    return True


def _stop_flushing(n_threads: int) -> None:
    """Undo flush_denormals on this thread and on an n_threads OpenMP team."""
    torch.set_flush_denormal(False)
    if n_threads > 1:
        _set_on_openmp_workers(n_threads, False)
    _applied.clear()


def flushing_denormals() -> bool:
    """Whether this thread flushes float32 denormals to zero now (1e-30 * 1e-10 gives 0)."""
    return float(torch.tensor(1e-30, dtype=torch.float32) * 1e-10) == 0.0


@functools.cache
def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks up to RETAINED_BYTES for reuse instead of unmapping
    them (see the module docstring); True where it now does. Nothing changes outside glibc or
    where the environment sets MALLOC_VARIABLES (the memory probe maps every block on purpose,
    so that peak RSS follows tensors). Once per process, and only in processes posbench owns
    (the command, the process executor's workers, the benchmarks; not Ray's shared workers):
    glibc cannot go back to its adaptive thresholds, so a library caller's process is left as it
    was. It changes no computed number."""
    return (
        sys.platform.startswith("linux")
        and not any(name in os.environ for name in MALLOC_VARIABLES)
        and _set_malloc_thresholds(RETAINED_BYTES)
    )


def _set_malloc_thresholds(size: int) -> bool:
    """mallopt(M_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD) to size; False without glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, size)) and bool(mallopt(_M_TRIM_THRESHOLD, size))


def configure_cpu(threads: int | None = None) -> None:
    """Compute on `threads` CPU threads (None keeps torch's choice), denormals flushed on each.

    The one place posbench sets torch's thread count, so the flush follows every change."""
    if threads:
        torch.set_num_threads(threads)
    flush_denormals()


#: The default dtype every run computes in, whatever the caller's.
RUN_DTYPE = torch.float32


@contextmanager
def compute_settings(threads: int | None = None) -> Iterator[None]:
    """``configure_cpu`` for the duration of a block, with float32 as torch's default dtype
    (a run's numbers never depend on what its caller set, and one run id is one computation);
    afterwards torch's thread count, default dtype and the denormal mode of this thread and the
    OpenMP workers are as they were, so library callers find their process as they left it."""
    old_threads = torch.get_num_threads()
    old_dtype = torch.get_default_dtype()
    was_flushing = flushing_denormals()
    configure_cpu(threads)
    torch.set_default_dtype(RUN_DTYPE)
    try:
        yield
    finally:
        torch.set_default_dtype(old_dtype)
        team = max(old_threads, torch.get_num_threads())
        if not was_flushing:
            _stop_flushing(team)
        torch.set_num_threads(old_threads)


@contextmanager
def process_environment_kept() -> Iterator[None]:
    """os.environ and sys.path as they were after the block: torch sets TORCHINDUCTOR_CACHE_DIR
    when it first imports its compiler (an operation on the meta device does), and importing its
    C++ extension loader puts setuptools' vendored packages on sys.path; a library caller finds
    neither."""
    environment, path = dict(os.environ), list(sys.path)
    try:
        yield
    finally:
        for name in set(os.environ) - set(environment):
            del os.environ[name]
        os.environ.update(environment)
        sys.path[:] = path


def freed_memory_kept() -> bool:
    """Whether ``keep_freed_memory`` took effect in this process (recorded in env.json)."""
    return keep_freed_memory.cache_info().currsize > 0 and keep_freed_memory()


def denormals_flushed() -> bool:
    """Whether this process flushes denormals on all its torch threads (recorded in env.json)."""
    return os.getpid() in {key[0] for key in _applied}


def cpu_model() -> str | None:
    """The CPU's model name as the kernel reports it (/proc/cpuinfo); None where it does not.
    Timing ratios depend on it: the same code read T5's fwd+bwd at 1.14x NoPE's on one 2-core
    machine and at 1.30x on another (README's speed tables)."""
    try:
        with open("/proc/cpuinfo") as info:
            names = (line.split(":", 1)[1] for line in info if line.startswith("model name"))
            return next((name.strip() for name in names), None)
    except OSError:
        return None


#: Where Linux describes the caches of CPU 0, one index* folder per cache.
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_MIB_PER_UNIT = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}  # sysfs sizes read "48K", "2048K", ...


def last_level_cache_mib(cache_dir: Path = CACHE_DIR) -> float | None:
    """Size of the CPU's largest cache level in MiB (sysfs; as a virtual machine reports it),
    None where unknown: decoding slows for every encoding alike once the cache of keys and
    values outgrows it."""
    sizes: dict[int, float] = {}
    for index in cache_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if size[-1:] in _MIB_PER_UNIT and size[:-1].isdigit():
            sizes[level] = int(size[:-1]) * _MIB_PER_UNIT[size[-1]]
    return sizes[max(sizes)] if sizes else None
