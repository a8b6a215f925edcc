"""CPU settings: denormals are flushed on torch's worker threads, not only the calling one, and
freed memory is reused instead of mapped afresh."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from posbench.kernels.cpu import MALLOC_VARIABLES

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


FAULTS = textwrap.dedent(
    """
    import resource
    import torch
    from posbench.kernels.cpu import freed_memory_kept, keep_freed_memory

    def page_faults_of_a_fresh_64_mib_tensor():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(1 << 24)  # written, then freed
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    keep_freed_memory()
    for _ in range(3):  # glibc settles where it puts the block in the first few
        page_faults_of_a_fresh_64_mib_tensor()
    print(freed_memory_kept(), sum(page_faults_of_a_fresh_64_mib_tensor() for _ in range(6)))
    """
)


def _huge_pages_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as setting:
            return "[always]" in setting.read()
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
@pytest.mark.parametrize("environment", [{}, {"MALLOC_MMAP_THRESHOLD_": "65536"}])
def test_freed_memory_is_reused_unless_the_environment_sets_malloc(
    environment: dict[str, str],
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in MALLOC_VARIABLES} | environment
    out = subprocess.run(
        [sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True, env=env
    ).stdout.split()
    kept, faults = out[0] == "True", int(out[1])
    pages = (1 << 26) // 4096  # 16,384 pages of 4 KiB per tensor; six tensors measured
    if environment:  # the memory probe's setting: every block mapped afresh
        assert not kept
        assert faults >= 5 * pages or _huge_pages_always(), (  # 2 MiB pages fault 512x less
            f"{faults} page faults for six tensors of {pages} pages each"
        )
    else:  # later tensors reuse the pages of earlier ones; glibc now and then maps one or two
        # of the six afresh (0 faults in 24 of 26 probes here, 1 or 2 tensors' worth in 2),
        # where without reuse all six fault
        assert kept and faults < 3 * pages, f"{faults} page faults, {pages} pages per tensor"


def test_last_level_cache_is_the_largest_level_in_sysfs(tmp_path) -> None:
    from posbench.kernels.cpu import last_level_cache_mib

    for name, level, size in [
        ("index0", "1", "48K"),
        ("index2", "2", "2048K"),
        ("index3", "3", "491520K"),
        ("index9", "4", "broken"),  # unreadable sizes are skipped
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "level").write_text(level + "\n")
        (tmp_path / name / "size").write_text(size + "\n")
    assert last_level_cache_mib(tmp_path) == 480.0
    assert last_level_cache_mib(tmp_path / "absent") is None


def test_cpu_model_is_the_kernels_model_name() -> None:
    from posbench.kernels.cpu import cpu_model

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        pytest.skip("no /proc/cpuinfo on this system")
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    assert cpu_model() == (names[0] if names else None)
