"""Every published report rebuilds byte for byte from its exported runs, by the command its
report.json records (`posbench report reports/<suite>/runs.tar.xz`, with `--link-figures` and
`--probe` where it used them), but for the build date in report.json: the
report is a function of the stored runs and the code, nothing else. The suites whose report
takes more than a few seconds (the verdict rule's calibration simulates 200 reports) are
marked slow: `pytest -m slow tests/test_rebuild.py` checks them all."""

from __future__ import annotations

import json
import shlex
from contextlib import ExitStack
from pathlib import Path

import pytest

from posbench.report.html import build_report
from posbench.store import opened_sweep

REPORTS = Path("reports")
PUBLISHED = sorted(p.parent.name for p in REPORTS.glob("*/runs.tar.xz"))
#: The published suites whose report builds in seconds: checked by the default test run.
QUICK = {"nanogpt-anchor"}


def _recorded_options(published: Path) -> tuple[list[str], Path | None]:
    """The linked figures and the probe archive of the command the report records."""
    words = shlex.split(json.loads((published / "report.json").read_text())["command"])
    assert words[:3] == ["posbench", "report", str(published / "runs.tar.xz")], words
    options = dict(zip(words[3::2], words[4::2]))  # posbench report ARCHIVE [--flag value]...
    linked = [name for name in options.get("--link-figures", "").split(",") if name]
    probe = options.get("--probe")
    return linked, None if probe is None else Path(probe)


def _without_build_date(data: bytes) -> dict:
    record = json.loads(data)
    record.pop("built")
    return record


@pytest.mark.parametrize(
    "suite",
    [s if s in QUICK else pytest.param(s, marks=pytest.mark.slow) for s in PUBLISHED],
)
def test_a_published_report_rebuilds_byte_for_byte_from_its_runs(
    suite: str, tmp_path: Path
) -> None:
    published = REPORTS / suite
    archive = published / "runs.tar.xz"
    linked, probe = _recorded_options(published)
    out = tmp_path / suite  # the report is named after its folder
    with ExitStack() as opened:
        sweep_dir = opened.enter_context(opened_sweep(archive))
        probe_dir = None if probe is None else opened.enter_context(opened_sweep(probe))
        build_report(sweep_dir, out, linked, probe_dir, source=archive, probe_source=probe)
    for name in ("report.html", "summary.csv", *(f"figures/{f}.png" for f in linked)):
        assert (out / name).read_bytes() == (published / name).read_bytes(), (
            f"{published / name} is not what `posbench report {archive}` builds today: "
            "rebuild the report and commit it"
        )
    rebuilt, committed = ((d / "report.json").read_bytes() for d in (out, published))
    assert _without_build_date(rebuilt) == _without_build_date(committed)


def test_the_default_test_run_rebuilds_at_least_one_published_report() -> None:
    assert QUICK <= set(PUBLISHED)
