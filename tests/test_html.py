"""The HTML report: CSVs against stored results, every HTML section, escaping, bad folders, and a
real headless browser opening the file with the network off."""

from __future__ import annotations

import json
import math
import re
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from posbench.cli import app
from posbench.errors import ResultsError
from posbench.plugins import load_plugin_dir
from posbench.report.html import build_report
from posbench.store import collect
from posbench.experiment.runner import run_sweep

from helpers import EVIL, headless_chromium, needs_chromium, open_page, tidy, tiny_sweep

SECTIONS = (
    "glance",
    "tasks",
    "literature",
    "length",
    "cache",
    "cost",
    "bias",
    "diagnostics",
    "problems",
    "config",
)


@pytest.fixture(scope="module")
def report(sweep_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    return build_report(sweep_dir, tmp_path_factory.mktemp("report"))


def test_csvs_match_the_stored_results(sweep_dir: Path, report) -> None:
    stored = collect(sweep_dir)
    written = pd.read_csv(
        report.results_csv, keep_default_na=False, na_values=[""], dtype={"note": str}
    )
    assert list(written.columns) == list(stored.columns)
    assert len(written) == len(stored)
    summary = pd.read_csv(report.by_length_csv)
    assert {
        "task",
        "encoding_label",
        "metric",
        "eval_len",
        "mem_len",
        "mean",
        "std",
        "n_seeds",
    } <= set(summary.columns)
    row = summary[
        (summary["encoding_label"] == "t5")
        & (summary["metric"] == "token_accuracy")
        & (summary["eval_len"] == 3)
        & summary["mem_len"].isna()
    ].iloc[0]
    raw = stored[
        (stored["encoding_label"] == "t5")
        & (stored["metric"] == "token_accuracy")
        & (stored["eval_len"] == 3)
        & stored["mem_len"].isna()
    ]["value"]
    assert row["mean"] == pytest.approx(raw.mean()) and row["std"] == pytest.approx(raw.std())
    assert row["n_seeds"] == 2


def test_every_section_is_present_with_images(report) -> None:
    html = report.html.read_text()
    for section in SECTIONS:
        assert f'id="{section}"' in html
    assert html.count("data:image/png;base64,") >= 5  # length, cache, costs, biases
    assert "No profiling results" not in html
    assert "http://" not in html and "https://" not in html  # nothing fetched from a network
    figures = re.findall(r"<figure[^>]*><img.*?</figure>", html, flags=re.S)
    assert figures and all("<figcaption>" in figure for figure in figures)  # says what to see


def test_diagnostics_are_in_the_report(report) -> None:
    html = report.html.read_text()
    assert 'alt="score terms of t5"' in html and 'alt="attention mass by key distance"' in html
    assert (report.html.parent / "figures" / "attention_distance.png").exists()


def test_names_from_plugins_are_escaped(report) -> None:
    html = report.html.read_text()
    assert EVIL not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_partial_and_corrupt_sweeps(sweep_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(sweep_dir, broken)
    runs = sorted(
        p
        for p in broken.iterdir()
        if (p / "result.json").exists() and not p.name.startswith("profile")
    )
    (runs[0] / "result.json").unlink()  # unfinished
    (runs[1] / "measurements.csv").write_bytes(b"\x00\xff garbage")  # damaged: its checksum differs
    (runs[2] / "result.json").write_text("{not json")  # corrupt marker: counts as unfinished
    written = build_report(broken, tmp_path / "out")
    html = written.html.read_text()
    assert "Partial sweep" in html and len(written.missing) == 3  # a damaged run is not finished
    assert any(str(runs[1] / "measurements.csv") in p and "SHA-256" in p for p in written.problems)


def test_a_sweeps_stated_differences_are_listed_under_the_literature(report) -> None:
    html = report.html.read_text()
    section = html[html.index('id="literature"') : html.index('id="length"')]
    assert '<h3 id="differences">' in section
    assert "<li>Size: &lt;b&gt;tiny&lt;/b&gt;; theirs is large.</li>" in section
    assert "<li>Seeds: two.</li>" in section


def test_empty_or_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="holds no finished posbench runs"):
        build_report(tmp_path, tmp_path / "out")
    result = CliRunner().invoke(app, ["report", str(tmp_path / "absent")])
    assert (
        result.exit_code == 2
        and "is not a folder" in result.output
        and "Traceback" not in result.output
    )


@needs_chromium
def test_report_in_a_real_headless_browser(report) -> None:
    with headless_chromium() as driver:
        open_page(driver, report.html)
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth])"
        )
        assert len(images) >= 5
        assert all(complete and width > 0 for _, complete, width in images), images
        table = "document.querySelector('#tasks table')"
        column = f"return Array.from({table}.tBodies[0].rows).map(r => r.cells[0].textContent)"
        driver.execute_script(f"{table}.querySelector('th:nth-child(1)').click()")
        labels = driver.execute_script(column)
        assert labels == sorted(labels, key=str.lower)  # sorted by encoding, a click away
        driver.execute_script(f"{table}.querySelector('th:nth-child(1)').click()")
        assert driver.execute_script(column) == labels[::-1]
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == [], json.dumps(errors)
    _check_layout_at_1280(report.html, "fixture")


#: Published reports still in the layout of an earlier protocol: #19 and #24 republish them
#: from their suites, and each leaves this list as it is republished.
PUBLISHED = sorted(p.parent.name for p in Path("reports").glob("*/report.html"))
#: Where the browser tests leave their screenshots (git ignores it).
SCREENSHOTS = Path("test-output") / "screenshots"

#: The text of every table cell led by a number (not prose: a td of class name) whose text
#: runs over more than one line.
WRAPPED_NUMBERS = """
return Array.from(document.querySelectorAll("td:not(.name)"))
  .filter(td => /^[-+]?[0-9.]/.test(td.textContent.trim()))
  .filter(td => {
    const range = document.createRange();
    range.selectNodeContents(td);
    const tops = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top)));
    return tops.size > 1;
  })
  .map(td => td.textContent.trim());
"""


def _check_layout_at_1280(page: Path, name: str) -> None:
    """Open a report at 1280 px: nothing wider than the window, no number wrapped inside its
    cell, and a screenshot of the first screen in test-output/screenshots/."""
    with headless_chromium(1280, 900) as driver:
        open_page(driver, page)
        width = driver.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert width[0] <= width[1], f"{page} is {width[0]} px wide at a window of {width[1]}"
        wrapped = driver.execute_script(WRAPPED_NUMBERS)
        assert wrapped == [], f"{page}: numbers wrapped inside their cells: {wrapped[:5]}"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(SCREENSHOTS / f"{name}-1280.png"))


@needs_chromium
@pytest.mark.parametrize("name", PUBLISHED)
def test_published_reports_fit_1280_pixels(name: str) -> None:
    _check_layout_at_1280(Path("reports") / name / "report.html", name)


def test_noisy_latency_is_marked_in_the_overview(sweep_dir: Path) -> None:
    from posbench.report.overview import overview, overview_cells

    frame = collect(sweep_dir)
    ratio_rows = frame["metric"] == "latency_fwdbwd_ratio"
    frame.loc[ratio_rows, "note"] = ""
    frame.loc[ratio_rows & (frame["encoding"] == "alibi"), "note"] = (
        "noisy: other processes used 1.0 cores"
    )
    cells = {
        r["encoding_label"]: overview_cells(r)["latency"]
        for r in overview(frame).to_dict("records")
    }
    assert cells["alibi"].endswith("x (noisy)")
    assert all(text.endswith("x") for label, text in cells.items() if label != "alibi")


def test_building_a_report_leaves_matplotlib_as_it_found_it(
    report, sweep_dir: Path, tmp_path: Path
) -> None:
    import matplotlib

    backend, params = matplotlib.get_backend(), dict(matplotlib.rcParams)
    build_report(sweep_dir, tmp_path / "again")
    assert matplotlib.get_backend() == backend
    assert dict(matplotlib.rcParams) == params


def test_report_needs_no_plugin_of_the_sweep(tmp_path: Path) -> None:
    """Reports are built from stored results only: a fresh interpreter that cannot import the
    sweep's plugin encoding still draws every picture."""
    import subprocess
    import sys

    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "vanishing.py").write_text(
        textwrap.dedent(
            '''
        from posbench import PositionalEncoding, register_encoding

        @register_encoding("test_vanishing")
        class Vanishing(PositionalEncoding):
            """A plugin that will not be importable when the report is built."""
            relative = True

            def position_bias(self, q_span, k_span, layer, device):
                return -0.1 * self.relative_positions(q_span, k_span, device).abs().float()[None]
        '''
        )
    )
    load_plugin_dir(plugins)
    run_sweep(tiny_sweep("test_vanishing", "alibi"), tmp_path / "sw")
    (plugins / "vanishing.py").unlink()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "posbench.cli",
            "report",
            str(tmp_path / "sw"),
            "-o",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped" not in result.stderr
    html = (tmp_path / "r" / "report.html").read_text()
    assert "test_vanishing" in html and html.count('alt="bias') >= 2


def test_linked_figures_are_shown_from_files_and_embedded_nowhere(
    sweep_dir: Path, tmp_path: Path
) -> None:
    """A published report holds each figure once: the ones its README shows as files that
    report.html refers to, the rest embedded."""
    import base64

    written = build_report(sweep_dir, tmp_path / "published", ["accuracy_vs_length_copy"])
    html = written.html.read_text()
    linked = (written.out_dir / "figures" / "accuracy_vs_length_copy.png").read_bytes()
    assert 'src="figures/accuracy_vs_length_copy.png"' in html
    assert base64.b64encode(linked).decode() not in html
    other = (written.out_dir / "figures" / "cost_memory.png").read_bytes()
    assert base64.b64encode(other).decode() in html  # the rest stay embedded
    with pytest.raises(
        ResultsError,
        match="--link-figures names no figure of this report: nonesuch; its figures are",
    ):
        build_report(sweep_dir, tmp_path / "bad", ["nonesuch"])


def test_published_reports_commit_each_figure_once() -> None:
    """Every committed PNG of reports/ is one README.md or a suite's page (reports/*/README.md)
    shows, and its report.html refers to it instead of embedding it; every image those pages
    show is committed."""
    import base64
    import re
    import subprocess

    committed = subprocess.run(
        ["git", "ls-files", "reports/*/figures/*.png"], capture_output=True, text=True, check=True
    ).stdout.split()
    shown = set(re.findall(r"reports/[\w-]+/figures/[\w.-]+\.png", Path("README.md").read_text()))
    for page in Path("reports").glob("*/README.md"):
        shown |= {
            f"reports/{page.parent.name}/figures/{name}"
            for name in re.findall(r"\]\(figures/([\w.-]+\.png)\)", page.read_text())
        }
    assert set(committed) == shown
    for png in map(Path, committed):
        html = (png.parent.parent / "report.html").read_text()
        assert f'src="figures/{png.name}"' in html
        assert base64.b64encode(png.read_bytes()).decode() not in html


def test_report_never_marks_a_model_that_did_not_learn_its_task_as_best(tmp_path) -> None:
    from posbench.report.overview import overview

    def rows(label: str, in_dist: float, beyond: float) -> list[dict]:
        out = []
        for seed, offset in enumerate((-0.01, 0.0, 0.01)):  # 3 seeds: intervals separate
            base = {
                "task": "copy",
                "encoding": label,
                "encoding_label": label,
                "seed": seed,
                "train_len_max": 8,
                "mem_len": math.nan,
                "seq_len": math.nan,
                "note": "",
            }
            out += [
                base | {"metric": m, "eval_len": 8, "value": in_dist}
                for m in ("exact_match", "greedy_token_accuracy")
            ] + [
                base | {"metric": m, "eval_len": 16, "value": beyond + offset}
                for m in ("exact_match", "greedy_token_accuracy")
            ]
        return out

    table = overview(
        tidy(rows("nope", 0.5, 0.9) + rows("alibi", 1.0, 0.6) + rows("rope", 1.0, 0.1))
    ).set_index("encoding_label")
    assert not table.at["nope", "learned"] and not table.at["nope", "best"]
    assert pd.isna(table.at["nope", "rank_group"])  # unranked, although its number is highest
    assert table.at["alibi", "best"] and list(table["rank_group"].dropna()) == ["a", "b"]


@pytest.mark.parametrize("spread, bold", [(0.01, True), (0.45, False)])
def test_bold_marks_only_an_encoding_separated_from_the_rest(spread: float, bold: bool) -> None:
    from posbench.report.html import _task_tables

    rows = []
    for label, at_2x in (("alibi", 0.5), ("t5", 0.3)):
        for seed, offset in enumerate((-spread, 0.0, spread)):
            common = {"task": "copy", "encoding": label, "encoding_label": label, "seed": seed}
            common |= {"model": "d64 L4 H4", "train_len_max": 16, "metric": "exact_match"}
            rows.append(common | {"eval_len": 16, "value": 1.0})
            rows.append(common | {"eval_len": 32, "value": at_2x + offset})
    (table,) = _task_tables(tidy(rows), {})
    cells = {row["label"]: row["cells"]["at_2x"]["best"] for row in table["rows"]}
    assert cells == {"alibi": bold, "t5": False}


def test_bold_follows_the_pairwise_test_and_never_marks_a_variant() -> None:
    from posbench.report.html import _task_tables
    from posbench.report.overview import overview

    # 5 seeds, sd 0.08: the 95% intervals [0.40, 0.60] and [0.25, 0.45] overlap, yet Welch's
    # test separates the means (p ~ 0.02), so alibi is best by the overview's rule
    spread = 0.08 * np.array([-1.265, -0.632, 0.0, 0.632, 1.265])
    rows = []
    for label, at_2x, variant in (("alibi", 0.5, None), ("t5", 0.35, None), ("t5-x", 0.9, "r")):
        for seed, offset in enumerate(spread):
            common = {"task": "copy", "encoding": label, "encoding_label": label, "seed": seed}
            common |= {"train_len_max": 16, "variant_of": variant}
            for metric in ("exact_match", "greedy_token_accuracy"):
                rows.append(common | {"metric": metric, "eval_len": 16, "value": 1.0})
                rows.append(common | {"metric": metric, "eval_len": 32, "value": at_2x + offset})
    frame = tidy(rows)
    (table,) = _task_tables(frame, {})
    cells = {row["label"]: row["cells"]["at_2x"]["best"] for row in table["rows"]}
    assert cells == {"alibi": True, "t5": False, "t5-x": False}
    best = overview(frame).set_index("encoding_label")["best"]
    assert best.to_dict() == {"alibi": True, "t5": False, "t5-x": False}


def test_figures_of_labels_that_differ_in_unsafe_characters_keep_apart() -> None:
    from posbench.report.html import _figure_files

    tasks = [
        {"name": name, "length_plot": name, "cache_plot": None, "position_plot": None}
        for name in ("c+1", "c_1", "copy")
    ]
    context = {"tasks": tasks, "text": [], "costs": {}, "scale": None, "diagnostics": {}}
    files = _figure_files(context, ["accuracy_vs_length_copy"])
    assert sorted(files.values()) == ["c+1", "c_1", "copy"]  # one file each, none overwritten
    assert files["accuracy_vs_length_c_1"] == "c_1" and files["accuracy_vs_length_copy"] == "copy"
    (plus,) = [name for name, png in files.items() if png == "c+1"]
    assert re.fullmatch(r"accuracy_vs_length_c_1_[0-9a-f]{6}", plus)


def test_the_environment_table_shows_every_distinct_value_with_its_run_count(
    tmp_path: Path,
) -> None:
    from posbench.experiment.runner import run_sweep
    from posbench.report.html import build_report
    from posbench.version import __version__

    out = tmp_path / "sweep"
    run_sweep(tiny_sweep("nope", "alibi", steps=2), out)
    older = sorted(out.glob("*/env.json"))[0]
    older.write_text(json.dumps(json.loads(older.read_text()) | {"posbench": "0.1.9"}))
    html = build_report(out, tmp_path / "report").html.read_text()
    counts = {f"{__version__} (1 run)", "0.1.9 (1 run)"}
    assert any(f"<td class=\"name\">{a}; {b}</td>" in html for a in counts for b in counts)
    assert f"<td class=\"name\">{torch.__version__}</td>" in html  # one value: shown once


def test_the_environment_table_counts_runs_by_the_evaluation_protocol_that_scored_them(
    tmp_path: Path,
) -> None:
    from posbench.experiment.evaluation import EVALUATION_PROTOCOL
    from posbench.experiment.runner import run_sweep
    from posbench.report.html import build_report

    out = tmp_path / "sweep"
    run_sweep(tiny_sweep("nope", "alibi", steps=2), out)
    html = build_report(out, tmp_path / "report").html.read_text()
    assert f'evaluation protocol</th><td class="name">{EVALUATION_PROTOCOL}</td>' in html
    older = sorted(out.glob("*/result.json"))[0]  # as a run stored before runs recorded it
    result = json.loads(older.read_text())
    result.pop("evaluation_protocol")
    older.write_text(json.dumps(result))
    html = build_report(out, tmp_path / "report").html.read_text()
    counts = [f"{EVALUATION_PROTOCOL} (1 run)", "1 (1 run)"]
    assert f"{counts[0]}; {counts[1]}" in html or f"{counts[1]}; {counts[0]}" in html
