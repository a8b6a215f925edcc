"""The literature section's verdicts, computed from stored-result frames that agree and that
disagree with the published findings."""
from __future__ import annotations

import math

import pandas as pd

from posbench.report.literature import AGREES, DISAGREES, NOT_MEASURED, check_findings


def _copy(values: dict[str, float]) -> list[dict]:
    rows = []
    for encoding, value in values.items():
        for seed in (0, 1):
            base = {"task": "copy", "encoding": encoding, "encoding_label": encoding, "seed": seed,
                    "train_len_max": 8, "mem_len": math.nan, "metric": "exact_match"}
            rows += [base | {"eval_len": 8, "value": 1.0}, base | {"eval_len": 16, "value": value},
                     base | {"eval_len": 32, "value": 0.0}]
    return rows


def _lm(penalties: dict[str, float]) -> list[dict]:
    """Penalties growing linearly past L = 64 to `v` at position 512."""
    return [{"task": "lm", "encoding": e, "encoding_label": e, "seed": 0, "train_len_max": 64, "mem_len": math.nan,
             "metric": "lm_penalty", "eval_len": p, "value": v * max(p - 64, 0) / 448}
            for e, v in penalties.items() for p in (32, 64, 128, 256, 384, 512)]


def _txl(losses: dict[float, float]) -> list[dict]:
    return [{"task": "lm", "encoding": "txl", "encoding_label": "txl", "seed": 0, "train_len_max": 64,
             "mem_len": m, "metric": "loss", "eval_len": 512, "value": v} for m, v in losses.items()]


def _lookback(cached: dict[str, float]) -> list[dict]:
    """Token accuracy 1.0 on whole sequences and `cached[label]` through an unbounded memory."""
    rows = []
    for label, value in cached.items():
        base = {"task": "lookback", "encoding": label.split("-")[0], "encoding_label": label, "seed": 0,
                "train_len_max": 12, "metric": "token_accuracy", "eval_len": 12}
        rows += [base | {"mem_len": math.nan, "value": 1.0}, base | {"mem_len": math.inf, "value": value},
                 base | {"mem_len": 0.0, "value": 0.06}]
    return rows


def _verdicts(rows: list[dict]) -> dict[str, tuple[str, str]]:
    return {v.finding: (v.verdict, v.measured) for v in check_findings(pd.DataFrame(rows))}


def test_results_that_agree() -> None:
    verdicts = _verdicts(
        _copy({"t5": 0.5, "alibi": 0.4, "nope": 0.35, "sinusoidal": 0.05, "rope": 0.02})
        + _lm({"sinusoidal": 1.2, "rope": 0.3, "t5": 0.05, "alibi": 0.01}) + _txl({0: 2.9, 64: 2.6, 128: 2.5})
        + _lookback({"sinusoidal-restart": 0.1, "txl": 1.0, "rope": 0.98, "sinusoidal": 1.0})
        + _randomized({"rope": 0.3, "rope+random": 0.6})
    )
    assert {verdict for verdict, _ in verdicts.values()} == {AGREES}, verdicts
    copy_order = verdicts["The order of encodings on copy past the training length"][1]
    assert "t5 0.50" in copy_order and "rho +1.00" in copy_order
    lm_order = verdicts["Loss past the training length degrades most for sinusoidal, then rotary, then T5; ALiBi least"][1]
    assert lm_order.startswith("lm loss breaks (penalty > 0.1 nats) at: sinusoidal 128 (+1.20 at 512), rope 256")


def test_results_that_disagree_say_so_with_the_numbers() -> None:
    verdicts = _verdicts(
        _copy({"t5": 0.0, "alibi": 0.05, "nope": 0.01, "sinusoidal": 0.3, "rope": 0.6})
        + _lm({"sinusoidal": 0.0, "rope": 0.1, "t5": 0.3, "alibi": 0.9}) + _txl({0: 2.5, 128: 2.9})
        + _lookback({"sinusoidal-restart": 0.99, "t5": 0.97}) + _randomized({"rope": 0.5, "rope+random": 0.4})
    )
    assert {verdict for verdict, _ in verdicts.values()} == {DISAGREES}, verdicts
    flat = verdicts["ALiBi's loss stays flat far past the training length"][1]
    assert "+0.900 nats" in flat
    memory = verdicts["A longer memory lowers Transformer-XL's loss (its context exceeds the segment)"][1]
    assert "2.500 with memory 0" in memory and "2.900 with memory 128" in memory
    restart = verdicts["Absolute positions restarted in every segment confuse cached tokens with current ones; relative positions do not"][1]
    assert "sinusoidal-restart 0.99 (whole sequences 1.00), t5 0.97" in restart


def test_memory_check_prefers_the_task_trained_through_a_cache() -> None:
    trained_through_cache = [row | {"task": "lm-memory"} for row in _txl({0: 2.9, 32: 2.5})]
    verdicts = _verdicts(_txl({0: 2.5, 128: 2.9}) + trained_through_cache)
    verdict, measured = verdicts["A longer memory lowers Transformer-XL's loss (its context exceeds the segment)"]
    assert verdict == AGREES and measured.startswith("lm-memory, length 512: loss 2.900 with memory 0, 2.500 with memory 32")


def test_missing_results_are_not_measured() -> None:
    verdicts = _verdicts(_copy({"t5": 0.0, "nope": 0.0, "rope": 0.0, "alibi": 0.0}))
    assert {verdict for verdict, _ in verdicts.values()} == {NOT_MEASURED}, verdicts


def _randomized(accuracies: dict[str, float]) -> list[dict]:
    """Token accuracy 1.0 at the training length and `accuracies[label]` past it, two seeds."""
    rows = []
    for label, value in accuracies.items():
        for seed in (0, 1):
            base = {"task": "copy", "encoding": label.removesuffix("+random"), "encoding_label": label, "seed": seed,
                    "train_len_max": 8, "mem_len": math.nan, "metric": "token_accuracy"}
            rows += [base | {"eval_len": 8, "value": 1.0}, base | {"eval_len": 16, "value": value},
                     base | {"eval_len": 16, "mem_len": 8.0, "value": 0.0}]
    return rows


RANDOMIZED = "Randomized positions improve accuracy past the training length"


def test_randomized_positions_are_paired_with_the_plain_encoding_by_label() -> None:
    verdict, measured = _verdicts(_randomized({"rope": 0.3, "rope+random": 0.6, "sinusoidal": 0.2,
                                               "sinusoidal+random": 0.25}))[RANDOMIZED]
    assert verdict == AGREES
    assert measured.endswith("rope on copy 0.30 -> 0.60, sinusoidal on copy 0.20 -> 0.25; mean gain +17.5 points over 2 pair(s)")
    verdict, measured = _verdicts(_randomized({"rope": 0.5, "rope+random": 0.49, "alibi": 0.9, "alibi+random": 0.5}))[RANDOMIZED]
    assert verdict == DISAGREES and "mean gain -20.5 points" in measured
    assert _verdicts(_randomized({"rope+random": 0.6}))[RANDOMIZED][0] == NOT_MEASURED
