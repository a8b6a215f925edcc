"""The front page of a folder of reports: every report linked with its record."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from helpers import (
    headless_chromium,
    invoke,
    needs_chromium,
    one_sentence_error,
    open_page,
    tidy,
    tiny_sweep,
)
from posbench.errors import ResultsError
from posbench.experiment.runner import run_sweep
from posbench.report.html import REPORT_RECORD, _report_record, build_report
from posbench.report.index import (
    HEADLINE_END,
    HEADLINE_START,
    build_index,
    headline_markdown,
    headline_table,
    read_reports,
)
from posbench.version import __version__


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of two reports: one of a finished sweep, one built before report.json."""
    root = tmp_path_factory.mktemp("index")
    run_sweep(tiny_sweep("nope", "alibi", steps=2, seeds=(0, 1)), root / "sweep")
    build_report(root / "sweep", root / "reports" / "tiny")
    build_report(root / "sweep", root / "reports" / "older")
    (root / "reports" / "older" / REPORT_RECORD).unlink()
    return root / "reports"


def test_a_report_records_what_the_index_shows(reports: Path) -> None:
    record = json.loads((reports / "tiny" / REPORT_RECORD).read_text())
    assert record["name"] == "tiny" and record["built_by"] == __version__
    assert record["runs"] == 4 and record["failed"] == 0 and record["missing"] == 0
    assert record["compute_seconds"] > 0 and record["commits"]
    tasks = {row["task"] for row in record["effective_lengths"]}
    assert tasks == {"copy"}
    assert {row["encoding"] for row in record["effective_lengths"]} == {"nope", "alibi"}


def test_the_index_links_every_report_with_its_record(reports: Path) -> None:
    html = build_index(reports).read_text()
    assert 'href="tiny/report.html"' in html and 'href="older/report.html"' in html
    assert "4 finished" in html and f"by posbench {__version__}" in html
    assert "wrote no report.json" in html  # the older report, listed all the same
    assert not re.search(r'(src|href)="(https?:)?//', html)  # self-contained: nothing fetched
    assert [r.folder for r in read_reports(reports)] == ["older", "tiny"]


def _front_page_record(reports: Path, name: str, **fields: object) -> tuple[Path, dict]:
    """A report folder holding a stub page and a record with `fields` over empty defaults."""
    folder = reports / name
    folder.mkdir(parents=True)
    (folder / "report.html").write_text("<title>posbench report</title>")
    record: dict = dict.fromkeys(("about", "built", "built_by"), "")
    record |= dict.fromkeys(("runs", "failed", "missing"), 0)
    record |= {"posbench_versions": [], "commits": [], "compute_seconds": 1.0}
    record |= {"effective_lengths": [], "mrr": []} | fields
    (folder / REPORT_RECORD).write_text(json.dumps(record))
    return folder, record


def test_the_index_lists_only_encodings_that_learned_the_task(tmp_path: Path) -> None:
    def length(encoding: str, value: float, learned: bool) -> dict:
        row = {"task": "lm", "encoding": encoding, "value": value, "low": None, "high": None}
        return row | {"learned": learned}

    lengths = [length("alibi", 512, False), length("txl", 256, True)]
    folder, record = _front_page_record(tmp_path / "reports", "lm", effective_lengths=lengths)
    (task,) = read_reports(tmp_path / "reports")[0].best_by_task
    assert task == {"task": "lm", "best": "effective length: txl 256"}
    record["effective_lengths"] = [length("alibi", 512, False)]
    (folder / REPORT_RECORD).write_text(json.dumps(record))
    (task,) = read_reports(tmp_path / "reports")[0].best_by_task
    assert task["best"] == "no encoding learned the task in distribution"


def test_tasks_no_encoding_learned_take_one_line(tmp_path: Path) -> None:
    """A suite mostly not learned says so in one line, not one per task."""
    rows = [
        {"task": task, "encoding": "txl", "value": 9.0, "low": None, "high": None}
        | {"learned": task == "a"}
        for task in ("a", "b", "c", "d")
    ]
    _front_page_record(tmp_path / "reports", "suite", effective_lengths=rows)
    lines = read_reports(tmp_path / "reports")[0].best_by_task
    assert lines == [
        {"task": "a", "best": "effective length: txl 9"},
        {"task": "3 of 4 tasks", "best": "no encoding learned the task in distribution: b, c, d"},
    ]


def test_the_mrr_row_says_a_sweep_of_sizes_averages_each_tasks_sizes(tmp_path: Path) -> None:
    mrr = [{"encoding": "t5", "value": 0.5, "low": None}]
    folder, record = _front_page_record(tmp_path / "reports", "sizes", mrr=mrr)
    assert (
        "<th>across tasks</th><td>MRR: t5 0.50</td>"
        in build_index(tmp_path / "reports").read_text()
    )
    record["scale"] = ["copy: the ranking holds."]
    (folder / REPORT_RECORD).write_text(json.dumps(record))
    page = build_index(tmp_path / "reports").read_text()
    assert "<th>across tasks (each task&#39;s sizes averaged)</th><td>MRR: t5 0.50</td>" in page


def test_the_mrr_row_says_how_many_tasks_each_encoding_was_ranked_on(tmp_path: Path) -> None:
    mrr = [{"encoding": "nope", "value": 0.67, "low": 0.17, "high": 1.0, "tasks": 1}]
    mrr += [{"encoding": "t5", "value": 0.58, "low": 0.24, "high": 0.71, "tasks": 2}]
    _front_page_record(tmp_path / "reports", "tasks", mrr=mrr)
    (report,) = read_reports(tmp_path / "reports")
    assert (
        report.best_mrr == "nope 0.67 [0.17, 1.00] over 1 task, t5 0.58 [0.24, 0.71] over 2 tasks"
    )


def test_a_report_records_how_many_tasks_each_mrr_ranks(tmp_path: Path) -> None:
    scores = {("a", "x"): 0.9, ("a", "y"): 0.5, ("a", "z"): 0.1, ("b", "x"): 0.2, ("b", "y"): 0.8}
    rows = [
        {"task": task, "encoding_label": label, "seed": seed, "metric": "greedy_token_accuracy"}
        | {"mem_len": math.nan, "eval_len": length, "train_len_max": 8}
        | {"value": value if length > 8 else 1.0}
        for (task, label), value in scores.items()
        for seed in (0, 1)
        for length in (8, 16)
    ]
    record = _report_record(tmp_path, tmp_path / "out", tidy(rows), {}, [], [], [])
    assert {row["encoding"]: row["tasks"] for row in record["mrr"]} == {"x": 2, "y": 2, "z": 1}


def test_a_corrupt_record_and_an_empty_folder_are_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsError, match="holds no report"):
        build_index(tmp_path / "empty")
    broken = tmp_path / "reports" / "broken"
    broken.mkdir(parents=True)
    (broken / "report.html").write_text("<title>posbench report</title>")
    (broken / REPORT_RECORD).write_text("{not json")
    result = invoke("index", str(tmp_path / "reports"))
    one_sentence_error(result, "report.json is corrupt", "rebuild that report")
    (broken / REPORT_RECORD).write_text("[1, 2]")
    result = invoke("index", str(tmp_path / "reports"))
    one_sentence_error(result, "is not a posbench report record", "lacks about")
    result = invoke("index", str(tmp_path / "nowhere"))
    one_sentence_error(result, "is not a folder")


def test_the_index_never_overwrites_a_page_of_the_users(reports: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a").mkdir()
    (mine / "a" / "report.html").write_text("<title>posbench report</title>")
    (mine / "index.html").write_text("<html>my own page</html>")
    with pytest.raises(ResultsError, match="was not written by posbench"):
        build_index(mine)
    assert (mine / "index.html").read_text() == "<html>my own page</html>"


def test_the_published_index_lists_every_published_report() -> None:
    published = Path("reports")
    html = (published / "index.html").read_text()
    for folder in sorted(p.name for p in published.iterdir() if (p / "report.html").is_file()):
        assert f'href="{folder}/report.html"' in html, folder


@needs_chromium
@pytest.mark.parametrize("which", ["built", "published"])
def test_the_index_in_a_real_headless_browser(reports: Path, which: str, tmp_path: Path) -> None:
    page = build_index(reports) if which == "built" else Path("reports/index.html")
    with headless_chromium() as driver:
        open_page(driver, page)
        links = driver.execute_script(
            "return Array.from(document.links).map(a => a.getAttribute('href'))"
        )
        assert links and all(link.endswith("/report.html") for link in links)
        overflow = driver.execute_script(
            "return document.documentElement.scrollWidth > window.innerWidth"
        )
        assert not overflow
        errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == [], json.dumps(errors)
        screenshot = tmp_path / f"index-{which}.png"
        assert driver.save_screenshot(str(screenshot))
        print(f"screenshot: {screenshot}")
        if which == "built":
            return  # its reports rank no encodings across tasks: no headline table
        # the first screen of a 1280 x 800 window leads with the cross-suite table
        box = driver.execute_script(
            "const t = document.querySelector('table.headline');"
            "return t && [t.getBoundingClientRect().top, t.getBoundingClientRect().right,"
            " document.querySelector('table') === t]"
        )
        assert box is not None, "no headline table"
        top, right, first = box
        assert first and top < 800 and right <= 1280, box


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("mrr", 5, "mrr is 5, not a list"),
        ("compute_seconds", "a lot", 'compute_seconds is "a lot", not a number'),
        ("runs", 2.5, "runs is 2.5, not a whole number"),
        ("mrr", [{"encoding": "nope", "value": "high"}], 'value = "high", not a number or null'),
        ("effective_lengths", ["copy"], 'effective_lengths holds "copy", not a row'),
    ],
)
def test_a_record_with_a_wrong_typed_field_is_one_sentence(
    reports: Path, tmp_path: Path, field: str, value: object, fragment: str
) -> None:
    import shutil

    copy = tmp_path / "reports"
    shutil.copytree(reports / "tiny", copy / "tiny")
    record = json.loads((copy / "tiny" / REPORT_RECORD).read_text())
    (copy / "tiny" / REPORT_RECORD).write_text(json.dumps(record | {field: value}))
    result = invoke("index", str(copy))
    one_sentence_error(result, "is not a posbench report record", fragment, "rebuild that report")


def test_the_headline_table_rows_are_configurations_across_reports(tmp_path: Path) -> None:
    """Two reports label the same configuration differently (T5 fitted is `t5` in one and
    `t5-fitted` in the other; T5 at its defaults is `t5-paper` and `t5`): one row each. An
    encoding run but ranked on no task shows "-", one not run is blank."""
    fitted = {"name": "t5", "options": {"max_distance": "train/4", "num_buckets": "train/4"}}
    paper = {"name": "t5", "options": {}}
    row = {"value": 0.5, "low": 0.4, "high": 0.6, "tasks": 2}
    _front_page_record(
        tmp_path / "reports",
        "a",
        encodings=[fitted | {"label": "t5"}, paper | {"label": "t5-paper"}],
        mrr=[row | {"encoding": "t5"}, row | {"encoding": "t5-paper", "value": 0.25}],
    )
    _front_page_record(
        tmp_path / "reports",
        "b",
        encodings=[paper | {"label": "t5"}, fitted | {"label": "t5-fitted"}]
        + [{"name": "alibi", "options": {}, "label": "alibi"}],
        mrr=[row | {"encoding": "t5-fitted", "value": 0.75}, row | {"encoding": "t5"}],
    )
    table = headline_table(read_reports(tmp_path / "reports"))
    assert table.reports == ["a", "b"]
    assert dict(table.rows) == {
        "t5": ["0.25 [0.40, 0.60] (2)", "0.50 [0.40, 0.60] (2)"],
        "t5 (max_distance=train/4, num_buckets=train/4)": [
            "0.50 [0.40, 0.60] (2)",
            "0.75 [0.40, 0.60] (2)",
        ],
        "alibi": ["", "-"],
    }
    page = build_index(tmp_path / "reports").read_text()
    assert "<th>t5 (max_distance=train/4, num_buckets=train/4)</th>" in page
    _front_page_record(
        tmp_path / "reports", "c", mrr=[row | {"encoding": "t5"}], probes_learning_rate=True
    )  # a learning-rate probe pools its rates: not a column
    one_seed = row | {"low": None, "high": None}
    _front_page_record(tmp_path / "reports", "d", mrr=[one_seed | {"encoding": "t5"}])
    # one seed gives no interval: a pattern to confirm (the default run), not a column
    assert headline_table(read_reports(tmp_path / "reports")).reports == ["a", "b"]


def test_index_writes_the_headline_table_into_a_readme(tmp_path: Path) -> None:
    mrr = [{"encoding": "t5", "value": 0.5, "low": 0.4, "high": 0.6, "tasks": 2}]
    _front_page_record(tmp_path / "reports", "suite", mrr=mrr)
    readme = tmp_path / "README.md"
    readme.write_text("# title\n<!-- headline:start -->\nold\n<!-- headline:end -->\nafter\n")
    result = invoke("index", str(tmp_path / "reports"), "--readme", str(readme))
    assert result.exit_code == 0, result.output
    assert readme.read_text() == (
        "# title\n<!-- headline:start -->\n"
        "| encoding | [suite](reports/suite/README.md) |\n| --- | ---: |\n"
        "| `t5` | 0.50 [0.40, 0.60] (2) |\n"
        "<!-- headline:end -->\nafter\n"
    )
    readme.write_text("no markers\n")
    bad = invoke("index", str(tmp_path / "reports"), "--readme", str(readme))
    one_sentence_error(bad, "has no lines <!-- headline:start -->", "add them")
    assert readme.read_text() == "no markers\n"


def test_the_readme_headline_table_is_the_published_reports() -> None:
    """README's cross-suite table is what `posbench index reports --readme README.md` writes
    from the committed report records, so it cannot drift from them."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text(encoding="utf-8")
    block = text[text.index(HEADLINE_START) + len(HEADLINE_START) : text.index(HEADLINE_END)]
    expected = headline_markdown(headline_table(read_reports(root / "reports")))
    assert block == "\n" + expected
