"""The literature verdict rule's error rate, measured by simulation: results in which the
compared encodings do not differ (every encoding's seeds drawn from one distribution; a memory
that changes nothing; ALiBi's penalty exactly at the edge of "flat"), run through
check_findings as a report runs them, at a report's seed count. A verdict other than
"inconclusive" or "not measured" on such results is a false one."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from posbench.report.literature import (
    AGREES,
    FLAT_PENALTY,
    MEMORY_TASK,
    PARTLY,
    RESTART_LABEL,
    check_findings,
)
from posbench.report.summary import RANDOM_SUFFIX
from posbench.store import COLUMNS

#: Simulated reports per calibration: the rate's 95% upper bound is about 1.5% at zero false
#: verdicts out of 200 reports' worth.
SIMULATIONS = 200


@dataclass(frozen=True)
class Calibration:
    """Out of `simulations` simulated reports with no true difference, each with `tested`
    verdicts that took a test: how many verdicts said "agrees" or "partly agrees"
    (false_agrees), how many said anything but "inconclusive" (false_verdicts), and how many
    reports had at least one false verdict (reports_with_false)."""

    seeds: int
    simulations: int
    tested: int
    false_agrees: int
    false_verdicts: int
    reports_with_false: int

    @property
    def false_agree_rate(self) -> float:
        return self.false_agrees / max(1, self.simulations * self.tested)

    @property
    def family_rate(self) -> float:
        """The share of simulated reports with any false verdict."""
        return self.reports_with_false / max(1, self.simulations)

    @property
    def family_upper(self) -> float:
        """The one-sided 95% Clopper-Pearson upper bound of family_rate."""
        k, n = self.reports_with_false, self.simulations
        return 1.0 if k == n else float(stats.beta.ppf(0.95, k + 1, n - k))

    def sentence(self) -> str:
        return (
            f"Calibration: on {self.simulations} simulated reports with no true difference and "
            f"{self.seeds} seeds per encoding ({self.tested} tested verdicts each), the rule said "
            f'"agrees" or "partly agrees" {self.false_agrees} times in '
            f"{self.simulations * self.tested} verdicts (rate {self.false_agree_rate:.2%}); "
            f"{self.reports_with_false} reports had any verdict other than inconclusive (rate "
            f"{self.family_rate:.1%}, 95% upper bound {self.family_upper:.1%})."
        )


def _rows(task: str, label: str, seed: int, train_len_max: int, **fields) -> dict:
    encoding = label.removesuffix(RANDOM_SUFFIX).removesuffix("-restart")
    return {
        "task": task,
        "encoding": encoding,
        "encoding_label": label,
        "seed": seed,
        "train_len_max": train_len_max,
        "mem_len": math.nan,
        **fields,
    }


def null_results(seeds: int, rng: np.random.Generator) -> pd.DataFrame:
    """A results frame in which no finding is true by construction, with every task the
    checks read: copy (five encodings' unseen exact match from one Beta distribution), lm
    (four encodings' penalties from one distribution, centred on the flat margin), lm-memory
    (Transformer-XL's loss the same at every memory), lookback (relative encodings and the
    restarted sinusoidal from one distribution), a randomized twin per encoding, and a text
    task (four encodings' whole-text losses past L from one distribution centred on their loss
    at L: no order, and ALiBi's perplexity ratio at the edge of 1)."""
    rows: list[dict] = []
    for seed in range(seeds):
        for name in ("t5", "alibi", "nope", "sinusoidal", "rope"):
            base = _rows("copy", name, seed, 8, metric="exact_match")
            rows += [base | {"eval_len": 8, "value": 1.0}]
            rows += [base | {"eval_len": 16, "value": float(rng.beta(2, 3))}]
        for name in ("sinusoidal", "rope", "t5", "alibi"):
            base = _rows("lm", name, seed, 64, metric="lm_penalty", eval_len=512)
            slope = float(rng.normal(FLAT_PENALTY, 0.03))
            rows += [
                base | {"position": p, "value": slope * (p - 64) / 448 + rng.normal(0, 0.005)}
                for p in (128, 256, 384, 512)
            ]
            rows += [_rows("lm", name, seed, 64, metric="excess_loss", eval_len=64, value=0.02)]
        level = float(rng.normal(2.5, 0.05))
        for memory in (0.0, 16.0, 32.0, 64.0):
            rows.append(
                _rows(MEMORY_TASK, "txl", seed, 64, metric="loss", eval_len=256)
                | {"mem_len": memory, "value": level + float(rng.normal(0, 0.02))}
            )
        rows.append(
            _rows(MEMORY_TASK, "txl", seed, 64, metric="excess_loss", eval_len=64, value=0.02)
        )
        for label in ("txl", "t5", "rope", "sinusoidal", RESTART_LABEL):
            base = _rows("lookback", label, seed, 12, metric="token_accuracy", eval_len=12)
            rows += [base | {"value": 1.0}, base | {"mem_len": math.inf, "value": rng.beta(5, 2)}]
        for name in ("sinusoidal", "rope", "t5", "alibi"):
            level = float(rng.normal(1.9, 0.02))
            rows.append(_rows("text", name, seed, 64, metric="text_loss", eval_len=64, value=level))
            rows += [
                _rows("text", name, seed, 64, metric="text_loss", eval_len=64 * m)
                | {"value": level + float(rng.normal(0, 0.02))}
                for m in (2, 4, 8, 16)
            ]
        for label in ("rope", "nope", "rope" + RANDOM_SUFFIX, "nope" + RANDOM_SUFFIX):
            base = _rows("odds_first", label, seed, 8, metric="token_accuracy")
            rows += [base | {"eval_len": 8, "value": 1.0}]
            rows += [base | {"eval_len": 16, "value": float(rng.beta(2, 3))}]
    return pd.DataFrame(rows).reindex(columns=COLUMNS)


@functools.cache
def calibrate(seeds: int, simulations: int = SIMULATIONS, seed: int = 0) -> Calibration:
    """The verdict rule on `simulations` null results at `seeds` seeds per encoding."""
    rng = np.random.default_rng(seed)
    false_agrees = false_verdicts = reports = 0
    tested = 0
    for _ in range(simulations):
        verdicts = [v for v in check_findings(null_results(seeds, rng)) if v.method]
        tested = len(verdicts)
        said = [v.verdict for v in verdicts]
        false_agrees += sum(v in (AGREES, PARTLY) for v in said)
        wrong = sum(v not in ("inconclusive", "not measured") for v in said)
        false_verdicts += wrong
        reports += wrong > 0
    return Calibration(seeds, simulations, tested, false_agrees, false_verdicts, reports)
