"""Warnings on the command line are one line each, and a broken plugin is reported once, by the
driver, not again by every worker that loads the same folder."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import posbench
from posbench.plugins import PluginWarning, load_worker_plugins
from posbench.warning_lines import warning_line

PACKAGE = Path(posbench.__file__).resolve().parent


def test_posbench_warnings_read_as_written_on_one_line() -> None:
    line = warning_line(
        PluginWarning("plugin x.py failed\n  to load; skipped."),
        PluginWarning,
        str(PACKAGE / "plugins.py"),
    )
    assert line == "warning: plugin x.py failed to load; skipped."


def test_other_warnings_name_their_kind_and_package() -> None:
    path = "/venv/lib/python3.11/site-packages/matplotlib/legend.py"
    line = warning_line(UserWarning("No artists with labels."), UserWarning, path)
    assert line == "warning: No artists with labels. (UserWarning from matplotlib)"
    plugin_line = warning_line(
        RuntimeWarning("overflow"), RuntimeWarning, "/home/u/plugins/mine.py"
    )
    assert plugin_line == "warning: overflow (RuntimeWarning from mine.py)"


def test_the_command_prints_a_broken_plugin_as_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    done = subprocess.run(
        [sys.executable, "-m", "posbench.cli", "--plugins", str(tmp_path), "list", "alibi"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"warning: plugin {tmp_path / 'broken.py'} failed to load (RuntimeError: boom); skipped."
    ]


def test_workers_load_the_drivers_plugins_without_warning_again(tmp_path: Path) -> None:
    (tmp_path / "broken_in_worker.py").write_text("raise RuntimeError('boom')\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_worker_plugins([str(tmp_path)])
    assert [w for w in caught if issubclass(w.category, PluginWarning)] == []
