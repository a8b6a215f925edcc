"""Library use leaves the caller's process as it found it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from posbench.experiment.runner import run_sweep
from posbench.store import collect, run_folders

from helpers import tiny_sweep

PROBE = textwrap.dedent(
    """
    import os, sys, tempfile
    from pathlib import Path
    sys.path.insert(0, "tests")
    import torch
    from helpers import tiny_sweep
    from posbench.experiment.runner import run_sweep
    from posbench.kernels.cpu import freed_memory_kept

    def denormals():  # a parallel op: every worker thread's mode shows
        return int((torch.full((1 << 22,), 1e-30) * 1e-10).count_nonzero())

    import posbench

    torch.set_num_threads(2)
    torch.manual_seed(123)
    model = posbench.build_model("rope", vocab_size=8, d_model=16, n_layers=1, n_heads=2)
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 8)
    before = (denormals(), torch.get_num_threads(), torch.get_rng_state().clone(), os.umask(0o027))
    os.umask(0o027)
    with tempfile.TemporaryDirectory() as out:
        outcome = run_sweep(tiny_sweep("nope", "alibi"), Path(out) / "sw")
        mode = oct(os.stat(outcome.results_csv).st_mode & 0o777)
    after = (denormals(), torch.get_num_threads(), torch.get_rng_state(), os.umask(0o027))
    print(before[0], after[0], before[1], after[1], bool(torch.equal(before[2], after[2])),
    oct(after[3]), mode, freed_memory_kept())
    """
)


def test_a_sweep_leaves_threads_denormals_rng_umask_and_malloc_unchanged() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    denormals_before, denormals_after, threads_before, threads_after, same_rng, umask = out[:6]
    mode, malloc_changed = out[6:]
    assert denormals_before == denormals_after == str(1 << 22)  # still not flushed, on every thread
    assert threads_before == threads_after == "2"
    assert same_rng == "True"
    assert umask == "0o27"
    assert mode == "0o640"  # files honour the caller's umask (0666 & ~027)
    assert malloc_changed == "False"  # the posbench command's own processes raise its thresholds


def test_a_run_computes_in_float32_whatever_the_callers_default_dtype(tmp_path: Path) -> None:
    """One run id is one computation: under torch.set_default_dtype(float64) a library call
    gives the CLI's numbers, records float32, and leaves the caller's default as it was."""
    run_sweep(tiny_sweep("alibi", steps=3), tmp_path / "plain")
    torch.set_default_dtype(torch.float64)
    try:
        run_sweep(tiny_sweep("alibi", steps=3), tmp_path / "float64")
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    plain, wide = collect(tmp_path / "plain"), collect(tmp_path / "float64")
    assert plain["value"].equals(wide["value"])
    assert all(
        f.env()["default_dtype"] == "torch.float32" for f in run_folders(tmp_path / "float64")
    )


TRACES = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from pathlib import Path
    sys.path.insert(0, "tests")
    environment, path = dict(os.environ), list(sys.path)
    import posbench.report.html  # the report's modules
    after_import = list(sys.path)
    from helpers import tiny_sweep
    from posbench.experiment.runner import run_sweep
    from posbench.kernels import native
    native.band_flash(), native.cope_flash()  # the C++ kernels, built or loaded from the cache
    with tempfile.TemporaryDirectory() as out:
        run_sweep(tiny_sweep("nope", "alibi", "cope"), Path(out) / "sw")
    print(json.dumps({
        "import": [p for p in after_import if p not in path],
        "path": [p for p in sys.path if p not in path],
        "environment": sorted(k for k in os.environ if os.environ[k] != environment.get(k)),
    }))
    """
)


def test_library_use_leaves_no_traces_in_the_environment_or_sys_path() -> None:
    import json

    out = subprocess.run(
        [sys.executable, "-c", TRACES], capture_output=True, text=True, check=True
    ).stdout.splitlines()[-1]
    assert json.loads(out) == {"import": [], "path": [], "environment": []}
