"""Sweep configuration: the grid of runs and their ids, and options tied to the training length."""

from __future__ import annotations

import dataclasses

import math

import pytest

from posbench.experiment.config import EncodingSpec, RunConfig, run_label
from posbench.experiment.planner import expand_runs

from helpers import tiny_sweep


def test_a_tied_option_that_resolves_to_an_invalid_value_is_one_sentence() -> None:
    from posbench.errors import ConfigError, OptionError
    from posbench.experiment.planner import resolve_sweep

    sweep = dataclasses.replace(
        tiny_sweep(), encodings=(EncodingSpec("t5", {"max_distance": "train/4"}),)
    )
    with pytest.raises((ConfigError, OptionError)) as err:
        resolve_sweep(sweep)
    assert "tied to the training length of task 'copy'" in str(
        err.value
    ) and "max_distance' must be an integer >= 2, got 1" in str(err.value)


def test_grid_expansion_and_distinct_ids() -> None:
    runs = expand_runs(tiny_sweep("nope", "rope", seeds=(0, 1)))
    assert len(runs) == 4 and len({r.run_id for r in runs}) == 4


def test_a_run_config_round_trips_through_its_stored_form() -> None:
    """config.json holds everything a run is recomputed from: loading it gives the same run and
    the same id (an unbounded memory factor survives as "inf")."""
    for run in expand_runs(tiny_sweep("t5", "rope", seeds=(0, 3))):
        again = RunConfig.from_dict(run.to_dict())
        assert again == run and again.run_id == run.run_id
        assert (
            again.eval.mem_len_factors[-1] == math.inf
            and run.to_dict()["eval"]["mem_len_factors"][-1] == "inf"
        )


def test_one_label_for_every_kind_of_run() -> None:
    run = expand_runs(tiny_sweep("rope"))[0]
    assert run.label == run_label("copy", "rope", 0) == "copy / rope / seed 0"
    assert run_label(None, "alibi") == "profile / alibi"
