"""The training loop on a few steps: schedule, loss, recurrence, divergence, early stopping."""

from __future__ import annotations

import math

import pytest
import torch

import posbench
from posbench.experiment import training
from posbench.experiment.config import TrainConfig
from posbench.experiment.training import Diverged, learning_rate, train

from helpers import small_model


def test_schedule_warms_up_then_decays_to_zero() -> None:
    config = TrainConfig(steps=100, lr=1.0, warmup_steps=10)
    assert learning_rate(0, config) == pytest.approx(0.1)
    assert learning_rate(9, config) == pytest.approx(1.0)
    assert learning_rate(55, config) == pytest.approx(0.5, abs=0.02)
    assert learning_rate(99, config) < 0.01


def test_training_reduces_loss_and_is_reproducible() -> None:
    task = posbench.create_task("copy", train_lengths=[1, 4])
    config = TrainConfig(steps=60, batch_size=16, lr=3e-3, warmup_steps=5)
    first = train(small_model(vocab=task.vocab_size), task, config, seed=0)
    again = train(small_model(vocab=task.vocab_size), task, config, seed=0)
    assert first.losses == again.losses
    assert first.losses[-1][1] < first.losses[0][1]


def test_fused_adamw_trains_the_model_the_per_parameter_loop_trains(monkeypatch) -> None:
    task = posbench.create_task("copy", train_lengths=[1, 4])
    config = TrainConfig(steps=40, batch_size=16, lr=3e-3, warmup_steps=5)
    torch.manual_seed(0)
    fused = small_model(vocab=task.vocab_size)
    looped = small_model(vocab=task.vocab_size)
    looped.load_state_dict(fused.state_dict())
    train(fused, task, config, seed=0)
    monkeypatch.setattr(training, "FUSED_ADAMW_DEVICES", ())
    train(looped, task, config, seed=0)
    for (name, a), b in zip(fused.named_parameters(), looped.parameters()):
        assert torch.allclose(a, b, atol=1e-4), name


@pytest.mark.parametrize("encoding", ["txl", "rope", "sinusoidal"])
def test_recurrent_training_through_the_cache(encoding: str) -> None:
    task = posbench.create_task("copy", train_lengths=[3, 6])
    config = TrainConfig(steps=4, batch_size=4, warmup_steps=1, train_mem_len=4)
    result = train(small_model(encoding, task.vocab_size), task, config, seed=0)
    assert math.isfinite(result.final_loss)


def test_divergence_is_detected() -> None:
    task = posbench.create_task("copy")
    model = small_model(vocab=task.vocab_size)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    with pytest.raises(Diverged, match="step 0"):
        train(model, task, TrainConfig(steps=3, batch_size=2, warmup_steps=1), seed=0)


def test_early_stopping_checks_every_n_steps_and_records_when_it_passed() -> None:
    import dataclasses

    from posbench.experiment.config import TrainConfig
    from posbench.model import build_model
    from posbench.tasks import create_task
    from posbench.experiment.training import train

    task = create_task("copy", train_lengths=[1, 3])
    config = TrainConfig(steps=40, batch_size=4, warmup_steps=1, check_every=5)
    asked: list[int] = []
    model = build_model("nope", task.vocab_size, 16, 1, 2)
    result = train(
        model, task, config, 0, should_stop=lambda steps: asked.append(steps) or steps >= 15
    )
    assert asked == [5, 10, 15] and result.steps_done == 15 and result.steps_to_threshold == 15
    assert model.training  # the check may evaluate; training mode is restored
    never = train(
        build_model("nope", task.vocab_size, 16, 1, 2),
        task,
        dataclasses.replace(config, steps=12),
        0,
        should_stop=lambda steps: False,
    )
    assert never.steps_done == 12 and never.steps_to_threshold is None


def test_a_run_records_steps_to_threshold_or_why_not(tmp_path, monkeypatch) -> None:
    import dataclasses
    import math

    import pandas as pd

    from posbench.experiment import compute
    from posbench.experiment.runner import run_sweep

    from helpers import tiny_sweep

    sweep = tiny_sweep("nope", steps=30)
    reached = dataclasses.replace(
        sweep, train=dataclasses.replace(sweep.train, stop_at=0.5, check_every=10)
    )
    with monkeypatch.context() as patch:  # a model that already meets the threshold with margin
        patch.setattr(compute, "validation_exact_match", lambda *args: (0.6, 0.55))
        frame = pd.read_csv(run_sweep(reached, tmp_path / "a").results_csv)
    assert frame.loc[frame["metric"] == "steps_to_threshold", "value"].tolist() == [10]
    capped = dataclasses.replace(
        sweep, train=dataclasses.replace(sweep.train, stop_at=1.0, check_every=10)
    )
    frame = pd.read_csv(
        run_sweep(capped, tmp_path / "b").results_csv, keep_default_na=False, na_values=[""]
    )
    row = frame[frame["metric"] == "steps_to_threshold"].iloc[0]
    assert math.isnan(row["value"]) and row["note"] == "not reached within 30 steps"


def test_nanogpt_settings_cosine_to_min_lr_beta2_and_decay_groups() -> None:
    """The optimiser can be nanoGPT's: cosine decay to min_lr, AdamW's beta2, and weight decay
    on weights only (biases and LayerNorm gains undecayed)."""
    from posbench.experiment.training import parameter_groups

    config = TrainConfig(steps=100, lr=1e-3, min_lr=1e-4, warmup_steps=10)
    assert learning_rate(99, config) == pytest.approx(1e-4, rel=0.01)  # the last step
    assert learning_rate(10, config) == pytest.approx(1e-3)
    model = posbench.build_model("learned", vocab_size=8, d_model=16, n_layers=1, n_heads=2)
    decayed, undecayed = parameter_groups(model, TrainConfig(decay_matrices_only=True))
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.dim() >= 2 for p in decayed["params"]) and decayed["weight_decay"] == 0.01
    assert undecayed["weight_decay"] == 0.0
    assert {names[id(p)] for p in undecayed["params"]} >= {"ln_f.weight", "ln_f.bias"}
    assert len(decayed["params"]) + len(undecayed["params"]) == len(list(model.parameters()))
    (one,) = parameter_groups(model, TrainConfig())  # the default: one group, as before
    assert len(one["params"]) == len(list(model.parameters()))
    from posbench.errors import OptionError
    from posbench.validation import check_dataclass

    with pytest.raises(OptionError, match="beta2.*< 1"):
        check_dataclass(TrainConfig, {"beta2": 1.0}, "[train]")


def test_tied_embeddings_share_one_parameter() -> None:
    model = posbench.build_model("nope", vocab_size=8, d_model=16, n_layers=1, tie_embeddings=True)
    assert model.head.weight is model.tok_emb.weight
    assert float(model.tok_emb.weight.detach().std()) == pytest.approx(0.02, rel=0.3)
    untied = posbench.build_model("nope", vocab_size=8, d_model=16, n_layers=1)
    assert sum(p.numel() for p in untied.parameters()) - sum(
        p.numel() for p in model.parameters()
    ) == 8 * 16


def test_settings_added_later_leave_stored_run_ids_unchanged() -> None:
    """A run id is a digest of the run's config: the settings added after runs were stored
    stay out of it at their defaults (so published runs keep their ids) and enter it otherwise."""
    import dataclasses

    from posbench.experiment.config import ADDED_AFTER_RUNS_WERE_STORED
    from posbench.experiment.planner import expand_runs
    from helpers import tiny_sweep

    (run, _) = expand_runs(tiny_sweep())
    data = run.to_dict()
    for section, defaults in ADDED_AFTER_RUNS_WERE_STORED.items():
        assert not set(defaults) & set(data[section])
    nanogpt = dataclasses.replace(run, train=dataclasses.replace(run.train, beta2=0.99))
    assert nanogpt.to_dict()["train"]["beta2"] == 0.99 and nanogpt.run_id != run.run_id
    tied = dataclasses.replace(run, model=dataclasses.replace(run.model, tie_embeddings=True))
    assert tied.run_id != run.run_id and tied.model.tag().endswith(" tied")
    assert type(run).from_dict(nanogpt.to_dict()) == nanogpt


def test_the_published_standard_runs_keep_the_ids_the_planner_computes(tmp_path) -> None:
    """Every training run the standard suite plans today is one its published archive holds:
    no setting added since changed a stored run's id."""
    import json

    from posbench.experiment.config import load_config_file
    from posbench.experiment.planner import plan_sweep
    from posbench.store import opened_sweep
    from posbench.suites import suite_file

    sweep, _ = load_config_file(suite_file("standard"))
    planned = {run.run_id for run in plan_sweep(sweep, tmp_path / "plan").runs}
    with opened_sweep(posbench_root() / "reports" / "standard" / "runs.tar.xz") as folder:
        stored = set(json.loads((folder / "sweep.json").read_text())["runs"])
    assert planned and planned <= stored, sorted(planned - stored)[:5]


def posbench_root():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


def test_learned_positions_start_at_the_chosen_scale_and_the_default_draws_as_before() -> None:
    from posbench.encodings import create_encoding

    torch.manual_seed(0)
    default = create_encoding("learned", n_heads=2, d_head=8, max_positions=512)
    torch.manual_seed(0)
    plain = torch.nn.Embedding(512, 16)  # what the default drew before init_std existed
    assert torch.equal(default.table.weight, plain.weight)
    gpt2 = create_encoding("learned", n_heads=2, d_head=8, max_positions=512, init_std=0.02)
    assert float(gpt2.table.weight.detach().std()) == pytest.approx(0.02, rel=0.1)
