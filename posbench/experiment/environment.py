"""What a run ran on: versions, device, machine and the posbench source's commit, stored in
each run's env.json for reproducing it."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from posbench.kernels import native
from posbench.kernels.cpu import (
    cpu_model,
    denormals_flushed,
    freed_memory_kept,
    last_level_cache_mib,
)
from posbench.version import __version__


def environment(device: str) -> dict[str, Any]:
    """Versions, device and machine, for reproducing a run."""
    env: dict[str, Any] = {
        "posbench": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        # the SIMD kernels torch picked (AVX2, AVX512, ...): results are bit-for-bit only within one
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_model": cpu_model(),
        "last_level_cache_mib": last_level_cache_mib(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "flush_denormals": denormals_flushed(),
        "freed_memory_kept": freed_memory_kept(),
        "default_dtype": str(torch.get_default_dtype()),
        # whether POSBENCH_NATIVE_KERNELS lets posbench's C++ kernels serve CPU attention; which
        # kernel served each call is counted in result.json's attention_kernels
        "native_kernels_allowed": device.startswith("cpu") and native.enabled(),
        "device": device,
        "git_commit": loaded_commit(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


def git_commit() -> str | None:
    """The commit of the posbench source that runs, when it is a git checkout (an editable
    install; None for an installed wheel), with ``+changes`` when its tracked files differ from
    that commit: what a run must be reproduced from, whatever folder it was started in."""
    source = Path(__file__).resolve().parents[1]  # the posbench package

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                # --no-optional-locks: `git status` would otherwise refresh the checkout's index
                ["git", "--no-optional-locks", *args],
                cwd=source,
                capture_output=True,
                text=True,
                timeout=5,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return f"{commit}+changes" if changed else commit


@functools.cache
def loaded_commit() -> str | None:
    """git_commit() as it was when this process loaded posbench's code: read at import, so a
    checkout that moves on while a long-lived worker runs does not relabel the code it runs."""
    return git_commit()


loaded_commit()  # now, with the code this process runs
