"""Sweeps that ship with posbench as TOML files: `posbench run --suite NAME` runs one.

`default` is what a bare `posbench run` runs; `standard` is the protocol whose results the
README publishes. Each file's first comment line is its description."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from posbench.errors import ConfigError

DEFAULT_SUITE = "default"


def _folder() -> Path:
    return Path(str(resources.files(__package__)))


def list_suites() -> dict[str, str]:
    """Suite name -> its one-line description."""
    suites = {}
    for path in sorted(_folder().glob("*.toml"), key=lambda p: p.stem):
        first = path.read_text(encoding="utf-8").splitlines()[0] if path.stat().st_size else ""
        suites[path.stem] = first.lstrip("# ").strip()
    return suites


def suite_file(name: str) -> Path:
    """The TOML file of suite `name`; an unknown name lists the ones there are."""
    path = _folder() / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"Unknown suite {name!r}; available: {', '.join(list_suites())}.")
    return path
