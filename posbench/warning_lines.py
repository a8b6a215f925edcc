"""Warnings on the command line as one line each, `warning: <message>`, instead of Python's
two-line form with a source path and a code line, which tell a user of the command nothing."""

from __future__ import annotations

import sys
import warnings
from contextlib import suppress
from pathlib import Path
from typing import TextIO

PACKAGE_DIR = Path(__file__).resolve().parent


def warning_line(message: Warning | str, category: type[Warning], filename: str) -> str:
    """One line for a warning: posbench's own as written, anyone else's with its kind and the
    package that raised it (matplotlib, torch, a plugin file)."""
    text = " ".join(str(message).split())
    path = Path(filename).resolve()
    if path.is_relative_to(PACKAGE_DIR):
        return f"warning: {text}"
    parts = path.parts
    origin = parts[parts.index("site-packages") + 1] if "site-packages" in parts else path.name
    return f"warning: {text} ({category.__name__} from {origin})"


def show_warnings_as_lines() -> None:
    """From now on this process prints every warning as `warning_line` on stderr."""

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        with suppress(OSError):  # stderr closed: a warning is not worth a crash
            (file or sys.stderr).write(warning_line(message, category, filename) + "\n")

    warnings.showwarning = show
