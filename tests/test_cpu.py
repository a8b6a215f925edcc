"""CPU settings: denormals are flushed on torch's worker threads, not only the calling one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import torch
    from posbench.kernels.cpu import configure_cpu, denormals_flushed

    def denormal_results():
        # 1e-30 * 1e-10 = 1e-40 is denormal in float32; a parallel op spreads it over all threads
        return int((torch.full((1 << 22,), 1e-30) * 1e-10).count_nonzero())

    torch.set_num_threads(2)
    before = denormal_results()
    configure_cpu(2)
    print(before, denormal_results(), denormals_flushed(), torch.get_num_threads())
    """
)


def test_configure_cpu_flushes_denormals_on_every_worker_thread() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    before, after, flushed, threads = int(out[0]), int(out[1]), out[2], int(out[3])
    assert before == 1 << 22  # denormals survive by default
    assert (after, flushed, threads) == (
        0,
        "True",
        2,
    )  # every chunk, the workers' included, flushed


SCOPED = textwrap.dedent(
    """
    import torch
    from posbench.kernels.cpu import compute_settings, denormals_flushed

    def denormal_results():
        return int((torch.full((1 << 22,), 1e-30) * 1e-10).count_nonzero())

    torch.set_num_threads(2)
    with compute_settings(1):
        inside = denormal_results(), torch.get_num_threads(), denormals_flushed()
    with compute_settings(2):
        inside2 = denormal_results()
    print(*inside, inside2, denormal_results(), torch.get_num_threads())
    """
)


def test_compute_settings_restore_threads_and_denormals_on_every_thread() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCOPED], capture_output=True, text=True, check=True
    ).stdout.split()
    inside, threads_inside, flushed, inside2, after, threads_after = out
    assert (int(inside), int(threads_inside), flushed, int(inside2)) == (0, 1, "True", 0)
    assert int(after) == 1 << 22 and int(threads_after) == 2  # the caller's process as it was
