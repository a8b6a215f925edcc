"""README's Quickstart and .ci/run stay in step."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ci_runs_readme_test_command_verbatim() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    command = ci_lines[-1]
    assert "pytest" in command
    assert command in (ROOT / "README.md").read_text().splitlines()
    # the venv is made and torch installed by that command alone, once
    assert [line for line in ci_lines if "venv" in line and not line.startswith("#")] == [
        "rm -rf .venv",
        command,
    ]
    assert sum("pip install torch" in line for line in ci_lines) == 1


def test_local_plugin_folders_are_not_packages() -> None:
    # a package named `encodings` would shadow Python's codec package
    assert not (ROOT / "encodings" / "__init__.py").exists()
    assert not (ROOT / "tasks" / "__init__.py").exists()
