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


def test_readme_stays_short_and_its_pages_link_to_files_that_exist() -> None:
    """README.md is a five-minute read (at most 250 lines); it and the pages the findings and
    usage moved to (docs/, reports/*/README.md, CHANGELOG.md) link only to files that exist."""
    import re

    readme = ROOT / "README.md"
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 250
    pages = [readme, ROOT / "CHANGELOG.md", *ROOT.glob("docs/**/*.md")]
    pages += list(ROOT.glob("reports/*/README.md")) + [ROOT / "reports" / "README.md"]
    broken = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in pages
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8"))
        if not target.startswith(("http://", "https://", "mailto:", "#"))
        and not (page.parent / target.partition("#")[0]).exists()
    ]
    assert not broken, broken


def test_the_published_reports_keep_the_clone_light() -> None:
    """reports/ in a checkout: at most 500 files and 30 MB (a suite's runs are one archive)."""
    import subprocess

    tracked = subprocess.run(
        ["git", "ls-files", "reports"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(tracked) <= 500, len(tracked)
    size = sum((ROOT / name).stat().st_size for name in tracked if (ROOT / name).is_file())
    assert size <= 30 * 2**20, f"reports/ holds {size / 2**20:.1f} MB in git"
