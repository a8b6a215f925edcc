"""The report's figures: colours per label, PNG output, and what each plot draws where."""

from __future__ import annotations

import base64
import math

import pytest

from posbench.report import plots

from helpers import tidy


def _lm_rows() -> list[dict]:
    base = {
        "task": "lm",
        "encoding": "rope",
        "encoding_label": "rope",
        "train_len_max": 32,
        "mem_len": math.nan,
        "eval_len": 64,
    }
    return [
        base | {"seed": seed, "metric": metric, "position": p, "value": value + seed / 100}
        for seed in (0, 1)
        for p in (16, 32, 48, 64)
        for metric, value in (
            ("lm_loss", 2.0 + p / 64),
            ("lm_loss_window", 2.0),
            ("lm_penalty", p / 64),
        )
    ]


def test_colours_are_fixed_per_label_whatever_the_order() -> None:
    one = plots.colour_map(["rope", "alibi", "zzz-plugin", "t5"])
    other = plots.colour_map(["zzz-plugin", "t5", "rope", "alibi"])
    assert one == other and len(set(one.values())) == 4
    assert list(one)[-1] == "zzz-plugin"  # built-ins first, in their usual order


def test_a_randomized_twin_shares_its_encodings_colour_and_is_dashed() -> None:
    colours = plots.colour_map(["rope", "rope+random", "alibi", "txl+random"])
    assert colours["rope+random"] == colours["rope"]
    assert colours["txl+random"] not in (colours["rope"], colours["alibi"])  # no plain twin here
    assert len(set(colours.values())) == 3
    assert plots.line_style("rope+random") == "--" and plots.line_style("rope") == "-"


def test_loss_by_position_is_drawn_at_token_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    """x is each row's position (eval_len is the length evaluated, the same for all of them);
    y the mean over seeds."""
    drawn = []
    monkeypatch.setattr(plots, "to_png", lambda fig: drawn.append(fig) or "png")
    assert plots.loss_vs_position(tidy(_lm_rows()), "lm", plots.colour_map(["rope"])) == "png"
    loss, penalty = drawn[0].axes
    assert list(loss.lines[0].get_xdata()) == [16, 32, 48, 64]
    assert list(penalty.lines[0].get_ydata()) == pytest.approx(
        [p / 64 + 0.005 for p in (16, 32, 48, 64)]
    )
    assert plots.loss_vs_position(tidy(_lm_rows()), "copy", plots.colour_map(["rope"])) is None


def test_accuracy_against_length_draws_free_running_accuracy_where_the_task_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The figure shows the headline's token accuracy (free-running), not the teacher-forced
    one, beside exact match; a task without free-running rows shows what it stored."""
    drawn = []
    monkeypatch.setattr(plots, "to_png", lambda fig: drawn.append(fig) or "png")
    base = {"task": "copy", "encoding": "rope", "encoding_label": "rope", "seed": 0}
    base |= {"train_len_max": 8, "mem_len": math.nan}
    rows = [
        base | {"eval_len": n, "metric": metric, "value": value}
        for n in (8, 16)
        for metric, value in (
            ("exact_match", 0.5),
            ("token_accuracy", 0.9),
            ("greedy_token_accuracy", 0.4),
        )
    ]
    colours = plots.colour_map(["rope"])
    plots.accuracy_vs_length(tidy(rows), "copy", colours)
    exact, token = drawn[0].axes
    assert token.get_title() == "free-running token accuracy"
    assert list(token.lines[0].get_ydata()) == pytest.approx([0.4, 0.4])
    teacher_forced = [r for r in rows if r["metric"] != "greedy_token_accuracy"]
    plots.accuracy_vs_length(tidy(teacher_forced), "copy", colours)
    assert drawn[1].axes[1].get_title() == "token accuracy, teacher-forced"


def test_figures_are_base64_png() -> None:
    png = base64.b64decode(
        plots.loss_vs_position(tidy(_lm_rows()), "lm", plots.colour_map(["rope"]))
    )
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_the_overview_heatmap_has_a_panel_per_headline_metric(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One panel per headline metric, encodings down and tasks across, each cell labelled with
    its value and rank group; an unlearned cell says so; an empty overview draws nothing."""
    import pandas as pd

    from posbench.report.overview import GREEDY_AT_2X, PENALTY_AT_2X

    rows = [
        ("copy", "alibi", GREEDY_AT_2X, 0.74, True, 1),
        ("copy", "rope", GREEDY_AT_2X, 0.15, True, 2),
        ("lm", "alibi", PENALTY_AT_2X, 0.011, False, pd.NA),
        ("lm", "rope", PENALTY_AT_2X, 1.743, True, 1),
    ]
    table = pd.DataFrame(
        [
            {"task": t, "encoding_label": e, "headline_metric": m.column, "value": v}
            | {"learned": learned, "rank_group": g, "best": False}
            for t, e, m, v, learned, g in rows
        ]
    )
    drawn = []
    monkeypatch.setattr(plots, "to_png", lambda fig: drawn.append(fig) or "png")
    assert plots.overview_heatmap(table) == "png"
    panels = [ax for ax in drawn[0].axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == [GREEDY_AT_2X.title, PENALTY_AT_2X.title]
    texts = [[t.get_text() for t in ax.texts] for ax in panels]
    assert texts == [["0.74 (1)", "0.15 (2)"], ["not learned", "1.743 (1)"]]
    assert plots.overview_heatmap(table.iloc[0:0]) is None


def test_a_share_s_band_stays_inside_0_and_1() -> None:
    import pandas as pd

    from posbench.report.plots import _mean_interval

    rows = pd.DataFrame(
        {"eval_len": [16, 16, 16], "metric": "exact_match", "value": [0.0, 0.0, 0.9]}
    )
    band = _mean_interval(rows, "eval_len").iloc[0]
    assert band["low"] == 0.0 and band["high"] == 1.0  # the t interval is 0.3 -/+ 1.29
    loss = rows.assign(metric="loss")
    assert _mean_interval(loss, "eval_len").iloc[0]["low"] < 0


def test_the_overview_heatmap_makes_room_for_long_labels() -> None:
    """An encoding label with options and a variant runs to 50-odd characters; beside it one
    task's cells, none learned, still get room: matplotlib lays the figure out without
    collapsing an axis (it warns when it has to)."""
    import warnings

    import pandas as pd

    from posbench.report.overview import GREEDY_AT_2X

    long = "t5(max_distance=16,num_buckets=8) [eval max_distance=32]"
    table = pd.DataFrame(
        [
            {"task": "copy", "encoding_label": e, "headline_metric": GREEDY_AT_2X.column}
            | {"value": v, "learned": False, "rank_group": pd.NA, "best": False}
            for e, v in [("nope", 0.02), (long, 0.1), ("test_distance_table", 0.1)]
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied ..." fails the test
        assert base64.b64decode(plots.overview_heatmap(table)).startswith(b"\x89PNG")
