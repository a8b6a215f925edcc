"""The plugin examples in README.md and docs/plugins.md work when copied: each registers a
name no built-in uses and builds."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
EXAMPLES = [
    (doc, code)
    for doc in ("README.md", "docs/plugins.md")
    for code in BLOCK.findall((ROOT / doc).read_text(encoding="utf-8"))
    if "@register_" in code
]

CHECK = """
import posbench
from posbench.encodings import REGISTRY as ENCODINGS
from posbench.tasks import REGISTRY as TASKS
before = set(ENCODINGS.names()) | set(TASKS.names())
exec(compile(open({path!r}).read(), "example", "exec"))
added = (set(ENCODINGS.names()) | set(TASKS.names())) - before
assert len(added) == 1, added
name = added.pop()
if name in ENCODINGS.names():
    posbench.create_encoding(name, n_heads=2, d_head=4)
else:
    import torch
    task = posbench.create_task(name)
    seq, answer = task.generate(4, 2, torch.Generator().manual_seed(0))
    assert seq.shape == (2, task.sequence_length(4) + 1) and answer.any()
print(name)
"""


@pytest.mark.parametrize(
    "doc,code", EXAMPLES, ids=[f"{d}-{i}" for i, (d, _) in enumerate(EXAMPLES)]
)
def test_plugin_example_registers_and_builds(doc: str, code: str, tmp_path: Path) -> None:
    path = tmp_path / "example.py"
    path.write_text(code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", CHECK.format(path=str(path))], capture_output=True, text=True
    )
    assert done.returncode == 0, f"{doc}: {done.stderr}"


def test_examples_found() -> None:
    """README's encoding example and the plugin guide's encoding and task, so a reworded fence
    cannot hide them."""
    assert sorted(d for d, _ in EXAMPLES) == ["README.md", "docs/plugins.md", "docs/plugins.md"]


def test_the_readme_library_example_runs_as_written(tmp_path: Path) -> None:
    """README's example of posbench as a library (build a model, read a stream whole and
    through the cache) runs when copied, its own assertion included."""
    (code,) = [
        code
        for code in BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
        if "posbench.build_model(" in code
    ]
    path = tmp_path / "example.py"
    path.write_text(code, encoding="utf-8")
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
