"""The terminal: `posbench inspect` on a run, and on every folder that is not one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from posbench.cli import app


def test_inspect_reads_what_a_run_stored(sweep_dir: Path, tmp_path: Path) -> None:
    run = next(
        p
        for p in sorted(sweep_dir.iterdir())
        if (p / "terms.csv").exists()
        and json.loads((p / "result.json").read_text())["encoding_label"] == "t5"
    )
    stored = CliRunner().invoke(app, ["inspect", str(run)])
    assert stored.exit_code == 0, stored.output
    assert stored.output.startswith("copy / t5 / seed ") and "position" in stored.output
    assert "attention mass by key distance" in stored.output and "in distribution" in stored.output
    assert "reachability" in stored.output
    env = json.loads((run / "env.json").read_text())
    assert env["attention"]  # the backends attention chose, each with why the earlier refused
    for backend, entry in env["attention"].items():
        assert f"attention: {backend} ({entry['calls']} calls)" in stored.output, stored.output
    # a run that evaluated a model another run trained stores no probes
    evaluated = tmp_path / run.name
    shutil.copytree(run, evaluated)
    (evaluated / "terms.csv").unlink()
    record = json.loads((evaluated / "result.json").read_text())
    del record["files"]["terms.csv"]  # as such a run records its files
    (evaluated / "result.json").write_text(json.dumps(record))
    shown = CliRunner().invoke(app, ["inspect", str(evaluated)])
    assert shown.exit_code == 0, shown.output
    assert (
        "score terms: this run stored no probes" in shown.output
        and "attention mass" in shown.output
    )


def test_inspect_on_a_folder_that_is_not_a_training_run_names_the_runs_it_could_mean(
    sweep_dir: Path, tmp_path: Path
) -> None:
    """The first folders `ls` shows a new user (the sweep, a profile, a report) and a typo each
    get one sentence naming training runs to pass instead, and exit 2: never a traceback."""
    profile = next(p for p in sorted(sweep_dir.iterdir()) if p.name.startswith("profile-"))
    training = next(p for p in sorted(sweep_dir.iterdir()) if (p / "terms.csv").exists())
    unfinished = tmp_path / training.name
    shutil.copytree(training, unfinished)
    (unfinished / "result.json").unlink()
    cases = {
        sweep_dir: f"{sweep_dir} is a sweep folder, not one run; "
        f"pass one training run's folder, e.g. {sweep_dir}/",
        profile: f"{profile} is a latency/memory profile (profile / ",
        tmp_path: f"{tmp_path} is not a posbench run folder; "
        "pass one training run's folder, e.g. results/default/<run id>",
        tmp_path / "typo": f"{tmp_path / 'typo'} is not a folder; pass one training run's folder",
        sweep_dir / "damaged": f"{sweep_dir / 'damaged'} is not a folder",
        unfinished: f"{unfinished} (copy / ",
    }
    for folder, sentence in cases.items():
        shown = CliRunner().invoke(app, ["inspect", str(folder)])
        assert shown.exit_code == 2, (folder, shown.output)
        assert "Traceback" not in shown.output and shown.output.count("error:") == 1
        assert sentence in " ".join(shown.output.split()), shown.output
    shown = CliRunner().invoke(app, ["inspect", str(profile)])
    assert "not a training run: its numbers are in" in " ".join(shown.output.split())
    assert "/ seed " in shown.output  # it names training runs of the same sweep
    assert "has not finished" in CliRunner().invoke(app, ["inspect", str(unfinished)]).output


def test_tables_are_never_cut_when_the_output_is_piped(sweep_dir: Path, tmp_path: Path) -> None:
    """Off a terminal (CI, a pipe, a file) the headline keeps every cell whole, intervals
    included, instead of cutting them at 80 columns."""
    shown = CliRunner().invoke(app, ["report", str(sweep_dir), "-o", str(tmp_path / "report")])
    assert shown.exit_code == 0, shown.output
    assert " ± " in shown.output and "…" not in shown.output
