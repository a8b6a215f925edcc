"""The answer at a glance: rank groups from pairwise tests over seeds on constructed data, and
one headline in summary.csv, the terminal table and the report's first screen."""

from __future__ import annotations

import html
import io
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from posbench.report.html import build_report
from posbench.report.overview import GREEDY_AT_2X, PENALTY_AT_2X, overview
from posbench.report.terminal import print_overview

from helpers import tidy


def _accuracy_rows(label: str, beyond: tuple[float, ...], in_dist: float = 1.0) -> list[dict]:
    """A copy run per seed of `label`: exact match and free-running token accuracy in
    distribution (length 8) and at 2x (length 16)."""
    rows = []
    for seed, value in enumerate(beyond):
        base = {"task": "copy", "encoding": label, "encoding_label": label, "seed": seed}
        base |= {"train_len_max": 8, "mem_len": math.nan, "seq_len": math.nan, "note": ""}
        for metric in ("exact_match", "greedy_token_accuracy"):
            rows.append(base | {"metric": metric, "eval_len": 8, "value": in_dist})
            rows.append(base | {"metric": metric, "eval_len": 16, "value": value})
    return rows


def _penalty_rows(label: str, penalties: tuple[float, ...]) -> list[dict]:
    """An lm run per seed of `label`: the penalty at positions 32 (in distribution) and 64
    (2x), and an in-distribution loss on its floor."""
    rows = []
    for seed, value in enumerate(penalties):
        base = {"task": "lm", "encoding": label, "encoding_label": label, "seed": seed}
        base |= {"train_len_max": 32, "mem_len": math.nan, "seq_len": math.nan, "note": ""}
        for position, penalty in ((32, 0.0), (64, value)):
            rows.append(base | {"metric": "lm_penalty", "position": position, "value": penalty})
            rows.append(base | {"metric": "lm_loss", "position": position, "value": 1.5})
        rows.append(base | {"metric": "excess_loss", "eval_len": 32, "value": 0.02})
    return rows


def test_separated_encodings_get_different_groups_and_overlapping_ones_share() -> None:
    frame = tidy(
        _accuracy_rows("alibi", (0.80, 0.81, 0.82))
        + _accuracy_rows("t5", (0.50, 0.51, 0.52))
        + _accuracy_rows("rope", (0.49, 0.50, 0.53))
    )
    table = overview(frame).set_index("encoding_label")
    assert table["headline_metric"].eq(GREEDY_AT_2X.column).all()
    assert table.at["alibi", "rank_group"] == "a" and table.at["alibi", "best"]
    assert table.at["t5", "rank_group"] == table.at["rope", "rank_group"] == "b"
    assert not table.at["t5", "best"] and not table.at["rope", "best"]


def test_overlapping_intervals_that_no_test_separates_share_a_group() -> None:
    """The published copy table had RoPE [0.106, 0.202] in group 2 and Transformer-XL [0.115,
    0.157] and sinusoidal [0.117, 0.144] in group 3: intervals that overlap, in different
    groups. Groups now come from pairwise tests: none separates these three."""
    frame = tidy(
        _accuracy_rows("rope", (0.12, 0.15, 0.19))
        + _accuracy_rows("txl", (0.12, 0.14, 0.15))
        + _accuracy_rows("sinusoidal", (0.12, 0.13, 0.14))
        + _accuracy_rows("alibi", (0.70, 0.74, 0.77))
    )
    table = overview(frame).set_index("encoding_label")
    assert table.at["alibi", "rank_group"] == "a"
    assert table.loc[["rope", "txl", "sinusoidal"], "rank_group"].eq("b").all()


def test_an_evaluation_variant_is_shown_and_not_ranked() -> None:
    """sinusoidal-restart reads sinusoidal's trained models under another evaluation option: it
    must not lead a group or move the others' groups."""
    variant = [
        row | {"encoding": "sinusoidal", "variant_of": f"run{row['seed']}"}
        for row in _accuracy_rows("sinusoidal-restart", (0.95, 0.96, 0.97))
    ]
    frame = tidy(
        _accuracy_rows("sinusoidal", (0.50, 0.51, 0.52))
        + _accuracy_rows("rope", (0.49, 0.50, 0.53))
        + variant
    )
    table = overview(frame).set_index("encoding_label")
    assert pd.isna(table.at["sinusoidal-restart", "rank_group"])
    assert not table.at["sinusoidal-restart", "best"]
    assert table.loc[["sinusoidal", "rope"], "rank_group"].eq("a").all()
    from posbench.report.overview import overview_cells

    assert overview_cells(table.reset_index().iloc[-1].to_dict())["group"] == "variant"


def test_nothing_is_best_where_nothing_is_separated() -> None:
    wide = tidy(_accuracy_rows("alibi", (0.2, 0.8, 0.9)) + _accuracy_rows("t5", (0.5, 0.5, 0.6)))
    table = overview(wide)
    assert list(table["rank_group"]) == ["a", "a"] and not table["best"].any()
    one_seed = overview(tidy(_accuracy_rows("alibi", (0.9,)) + _accuracy_rows("t5", (0.1,))))
    assert list(one_seed["rank_group"]) == ["a", "a"] and not one_seed["best"].any()


def test_a_penalty_ranks_lower_first() -> None:
    table = overview(
        tidy(_penalty_rows("alibi", (0.01, 0.02, 0.03)) + _penalty_rows("rope", (1.0, 1.1, 1.2)))
    ).set_index("encoding_label")
    assert table["headline_metric"].eq(PENALTY_AT_2X.column).all()
    assert table.at["alibi", "rank_group"] == "a" and table.at["alibi", "best"]
    assert table.at["rope", "rank_group"] == "b"
    assert table.at["alibi", "value"] == pytest.approx(0.02)


def test_a_model_that_did_not_learn_is_not_ranked() -> None:
    frame = tidy(
        _accuracy_rows("nope", (0.95, 0.96, 0.97), in_dist=0.4)
        + _accuracy_rows("alibi", (0.5, 0.51, 0.52))
    )
    table = overview(frame).set_index("encoding_label")
    assert not table.at["nope", "learned"] and pd.isna(table.at["nope", "rank_group"])
    assert table.at["alibi", "rank_group"] == "a"
    assert not table.at["alibi", "best"]  # alone among the ranked: separated from nobody


def _model_rows(label: str, penalties: tuple[float, ...], trained: float) -> list[dict]:
    """`_penalty_rows` of `label`, each seed's model with final training loss `trained`."""
    rows = _penalty_rows(label, penalties)
    for seed in range(len(penalties)):
        base = {k: v for k, v in rows[0].items() if k not in ("position", "eval_len")}
        rows.append(base | {"seed": seed, "metric": "train_loss_final", "value": trained})
    return rows


def test_a_label_that_repeats_the_headline_of_the_same_models_says_so() -> None:
    frame = tidy(
        _model_rows("sinusoidal", (1.0, 1.1, 1.2), trained=1.61)
        + _model_rows("sinusoidal-restart", (1.0, 1.1, 1.2), trained=1.61)  # its variant
        + _model_rows("rope", (1.0, 1.1, 1.2), trained=1.62)  # equal headline, other models
        + _model_rows("rope-scaled", (1.0, 1.1, 1.3), trained=1.62)  # same models, not equal
    )
    table = overview(frame).set_index("encoding_label")
    assert table.at["sinusoidal-restart", "same_as"] == "sinusoidal"
    assert table.loc[["sinusoidal", "rope", "rope-scaled"], "same_as"].eq("").all()
    console = Console(file=io.StringIO(), width=200, color_system=None)
    print_overview(console, overview(frame))
    printed = console.file.getvalue()
    assert "sinusoidal-restart (= sinusoidal)" in printed and "(= X): the same headline" in printed


def _expected_text(row: pd.Series) -> str:
    """The headline cell written from summary.csv's numbers, independently of the code that
    prints it."""
    digits = 2 if row["headline_metric"] == GREEDY_AT_2X.column else 3
    untrained = " †" if row["untrained_share"] > 0 else ""  # NaN: no indexed parameters
    if pd.isna(row["low"]):
        return f"{row['value']:.{digits}f}{untrained}"
    below, above = row["value"] - row["low"], row["high"] - row["value"]
    if abs(below - above) > 1e-9:  # cut at a bound of the metric
        interval = f"[{row['low']:.{digits}f}, {row['high']:.{digits}f}]"
        return f"{row['value']:.{digits}f} {interval}{untrained}"
    return f"{row['value']:.{digits}f} ± {(row['high'] - row['low']) / 2:.{digits}f}{untrained}"


def test_summary_csv_the_terminal_and_the_report_carry_the_same_headline(
    sweep_dir: Path, tmp_path: Path
) -> None:
    report = build_report(sweep_dir, tmp_path / "report")
    summary = pd.read_csv(report.summary_csv)
    assert len(summary) == summary[["task", "encoding_label"]].drop_duplicates().shape[0] > 0
    console = Console(file=io.StringIO(), width=200, color_system=None)
    print_overview(console, report.overview)
    terminal = console.file.getvalue().splitlines()
    page = report.html.read_text()
    glance = page[page.index('<section id="glance">') : page.index('<section id="tasks">')]
    cells = {
        html.unescape(label): (html.unescape(value), group)
        for label, value, group in re.findall(
            r'<td class="label">(.*?)</td><td[^>]*>(.*?)</td><td>(.*?)</td>', glance
        )
    }
    for row in summary.to_dict("records"):
        text = _expected_text(pd.Series(row))
        group = str(row["rank_group"]) if not pd.isna(row["rank_group"]) else "-"
        label = row["encoding_label"]
        if isinstance(row["same_as"], str):
            label += f" (= {row['same_as']})"
        assert cells[label] == (text, group), label
        line = next(line for line in terminal if f" {label} " in line)
        assert re.search(rf"{re.escape(text)}\s*│\s*{re.escape(group)}\s*│", line), line
