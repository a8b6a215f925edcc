"""Memory: what is free on a device now, the peak a computation adds (measured, never
estimated), and whether a longer measurement would fit."""

from __future__ import annotations

from typing import Any, Callable

import psutil
import torch

#: How peak memory is measured, as reports state it.
MEMORY_METHOD = (
    "CPU: peak resident set (VmHWM) of a fresh child process, reset through /proc/self/clear_refs "
    "before each forward+backward, minus the resident set before it, with glibc's mmap threshold "
    "fixed at 64 KiB so freed tensors leave the resident set. CUDA: "
    "torch.cuda.max_memory_allocated "
    "minus the memory allocated before the measurement."
)

#: Share of the memory available now that a measurement may be expected to take.
MEMORY_HEADROOM = 0.8


def available_bytes(device: str) -> int | None:
    """Bytes free on `device` now (None where it cannot be told)."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    if device == "cpu":
        return psutil.virtual_memory().available
    return None


def parameter_count(vocab_size: int, d_model: int, n_layers: int, d_ff: int | None) -> int:
    """Parameters of the decoder, from its sizes alone (embedding and head, and per layer the
    four attention projections and the feed-forward pair), before any encoding's own."""
    ff = d_ff or 4 * d_model
    return 2 * vocab_size * d_model + n_layers * (4 * d_model * d_model + 2 * d_model * ff)


#: Bytes per parameter that training holds: the float32 weight, its gradient and AdamW's two
#: moments.
TRAINING_BYTES_PER_PARAMETER = 16


def too_big(measured: tuple[int, float] | None, length: int, device: str) -> str | None:
    """Why forward+backward at `length` is skipped, when the peak measured at a shorter length
    (length, MiB), grown quadratically, would not fit the memory available now; else None. A
    length that would take the machine down is recorded as n/a, never attempted."""
    free = available_bytes(device)
    if measured is None or free is None:
        return None
    available = free / 2**20
    shorter, peak = measured
    predicted = peak * (length / shorter) ** 2
    if predicted <= MEMORY_HEADROOM * available:
        return None
    return (
        f"would need about {predicted / 1024:.1f} GiB (grown quadratically from {peak:.0f} MiB at "
        f"L={shorter}), "
        f"more than the {available / 1024:.1f} GiB available; measure shorter lengths"
    )


def peak_or_none(fn: Callable[[], Any], device: str) -> float | None:
    """The peak memory `fn` adds, or None where this system cannot measure it."""
    try:
        return measure_peak_mb(fn, device)
    except OSError:
        return None


def _proc_kb(field_name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise OSError(f"{field_name} not in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset this process's resident high-water mark (Linux >= 4.0); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def measure_peak_mb(fn: Callable[[], Any], device: str = "cpu") -> float:
    """Peak memory (MiB) that `fn` adds above what is held when it starts."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    if not reset_peak_rss():
        raise OSError(
            "this system cannot reset the resident high-water mark (/proc/self/clear_refs)"
        )
    base = _proc_kb("VmRSS")
    fn()
    return (_proc_kb("VmHWM") - base) / 1024
