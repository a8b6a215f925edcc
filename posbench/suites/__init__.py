"""Sweeps that ship with posbench as TOML files: `posbench run --suite NAME` runs one.

`default` is what a bare `posbench run` runs; `standard` is the protocol whose results the
README publishes. Each file's first comment sentence is its description."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from posbench.errors import ConfigError

DEFAULT_SUITE = "default"


def _folder() -> Path:
    return Path(str(resources.files(__package__)))


def list_suites() -> dict[str, str]:
    """Suite name -> its description: the first sentence of its leading comment, which may
    run over several comment lines."""
    suites = {}
    for path in sorted(_folder().glob("*.toml"), key=lambda p: p.stem):
        words: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            text = line.lstrip("#").strip()
            if not line.startswith("#") or not text:
                break
            words.append(text)
            if text.endswith("."):
                break
        suites[path.stem] = " ".join(words)
    return suites


def suite_file(name: str) -> Path:
    """The TOML file of suite `name`; an unknown name lists the ones there are."""
    path = _folder() / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"Unknown suite {name!r}; available: {', '.join(list_suites())}.")
    return path
