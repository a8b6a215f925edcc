"""Published findings the suite can check, each compared with what a sweep measured.

Every check reads only the tidy results and says plainly whether the tiny models agree with
the paper, disagree (with the numbers), or could not be compared (what is missing). Nothing
here adjusts a protocol: a disagreement is a result."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pandas as pd
from scipy import stats

AGREES, PARTLY, DISAGREES, NOT_MEASURED = "agrees", "partly agrees", "disagrees", "not measured"
#: Rank agreement (Spearman's rho) at or above which an ordering counts as reproduced.
RANK_AGREEMENT = 0.6
#: A penalty within this many nats of zero counts as flat.
FLAT_PENALTY = 0.05


@dataclass(frozen=True)
class Verdict:
    """One published finding against this sweep."""

    finding: str
    source: str
    published: str
    measured: str
    verdict: str


@dataclass(frozen=True)
class Finding:
    finding: str
    source: str
    published: str
    check: Callable[[pd.DataFrame], tuple[str, str]]  # frame -> (measured, verdict)

    def against(self, frame: pd.DataFrame) -> Verdict:
        measured, verdict = self.check(frame)
        return Verdict(self.finding, self.source, self.published, measured, verdict)


# ---- Kazemnejad et al. 2023: copy past the training length -----------------------------------
#: Exact match on unseen lengths, copy with random tokens, mean of 3 seeds (their Table/results).
KAZEMNEJAD_COPY = {"t5": 0.420, "alibi": 0.331, "nope": 0.305, "sinusoidal": 0.028, "rope": 0.011}


def _unseen_exact_match(frame: pd.DataFrame, task: str) -> pd.Series:
    """Per built-in encoding (by name, default options only): mean exact match over lengths
    past the longest training length up to twice it, full context, all seeds."""
    rows = frame[(frame["task"] == task) & (frame["metric"] == "exact_match") & frame["mem_len"].isna()
                 & (frame["encoding_label"] == frame["encoding"])]
    rows = rows[(rows["eval_len"] > rows["train_len_max"]) & (rows["eval_len"] <= 2 * rows["train_len_max"])]
    return rows.groupby("encoding")["value"].mean()


def _rank_verdict(published: dict[str, float], measured: pd.Series, what: str) -> tuple[str, str]:
    common = [name for name in published if name in measured.index and not math.isnan(measured[name])]
    if len(common) < 3:
        return f"needs at least 3 of {', '.join(published)}; this sweep has {', '.join(common) or 'none'}", NOT_MEASURED
    values = [measured[name] for name in common]
    numbers = ", ".join(f"{name} {measured[name]:.2f}" for name in sorted(common, key=lambda n: -measured[n]))
    if len(set(values)) == 1:
        return f"{what}: every encoding {values[0]:.2f}, so no order can be compared", NOT_MEASURED
    rho = float(stats.spearmanr([published[n] for n in common], values).statistic)
    verdict = AGREES if rho >= RANK_AGREEMENT else PARTLY if rho > 0 else DISAGREES
    return f"{what}: {numbers} (Spearman rho {rho:+.2f} with the published order)", verdict


def _kazemnejad_order(frame: pd.DataFrame) -> tuple[str, str]:
    return _rank_verdict(KAZEMNEJAD_COPY, _unseen_exact_match(frame, "copy"), "copy exact match, lengths L..2L")


def _nope_beats_rotary(frame: pd.DataFrame) -> tuple[str, str]:
    measured = _unseen_exact_match(frame, "copy")
    good = [n for n in ("nope", "t5", "alibi") if n in measured.index]
    poor = [n for n in ("rope", "sinusoidal") if n in measured.index]
    if not good or not poor:
        return "needs nope, t5 or alibi and rope or sinusoidal on copy", NOT_MEASURED
    low, high = min(measured[n] for n in good), max(measured[n] for n in poor)
    text = ", ".join(f"{n} {measured[n]:.2f}" for n in good + poor)
    if max(measured[good + poor]) == 0:
        return f"{text}: all zero past the training length", NOT_MEASURED
    verdict = AGREES if low > high else PARTLY if max(measured[n] for n in good) > high else DISAGREES
    return text, verdict


# ---- Press et al. 2022 (ALiBi), Figure 1: loss past the training length ------------------------
#: Published degradation past L: sinusoidal worst, then rotary, then T5; ALiBi flat (rank, high = worse).
ALIBI_FIGURE_1 = {"sinusoidal": 4.0, "rope": 3.0, "t5": 2.0, "alibi": 1.0}


#: The penalty (nats) above which the loss counts as broken at a position.
BROKEN_PENALTY = 0.1


def _lm_penalties(frame: pd.DataFrame) -> pd.DataFrame:
    """Per built-in encoding on lm: mean penalty by position (rows) over seeds."""
    rows = frame[(frame["task"] == "lm") & (frame["metric"] == "lm_penalty") & (frame["encoding_label"] == frame["encoding"])]
    return rows.pivot_table(index="eval_len", columns="encoding", values="value", aggfunc="mean")


def _longest_penalty(frame: pd.DataFrame) -> pd.Series:
    table = _lm_penalties(frame)
    return table.iloc[-1] if not table.empty else pd.Series(dtype=float)


def _alibi_order(frame: pd.DataFrame) -> tuple[str, str]:
    """Rank by how soon the loss breaks past the training length (the first position whose
    penalty exceeds BROKEN_PENALTY; never is best), ties by the penalty at the longest position."""
    table = _lm_penalties(frame)
    if table.empty:
        return _rank_verdict(ALIBI_FIGURE_1, pd.Series(dtype=float), "")
    train_max = frame.loc[frame["task"] == "lm", "train_len_max"].max()
    past = table[table.index > train_max]
    breaks, scores = {}, {}
    for name in past.columns:
        broken = past.index[past[name] > BROKEN_PENALTY]
        breaks[name] = float(broken[0]) if len(broken) else math.inf
    order = sorted(breaks, key=lambda n: (breaks[n], -past[n].iloc[-1]))  # worst first
    for rank, name in enumerate(order):
        scores[name] = float(len(order) - rank)
    measured, verdict = _rank_verdict(ALIBI_FIGURE_1, pd.Series(scores), "lm loss breaks (penalty > 0.1 nats) at")
    detail = ", ".join(f"{n} {'never' if math.isinf(breaks[n]) else int(breaks[n])} ({past[n].iloc[-1]:+.2f} at {int(past.index[-1])})"
                       for n in order if n in ALIBI_FIGURE_1)
    return (f"lm loss breaks (penalty > {BROKEN_PENALTY} nats) at: {detail}" + measured[measured.find(" (Spearman"):]
            if "Spearman" in measured else measured), verdict


def _alibi_flat(frame: pd.DataFrame) -> tuple[str, str]:
    penalty = _longest_penalty(frame)
    if "alibi" not in penalty.index:
        return "needs alibi on the lm task", NOT_MEASURED
    value = float(penalty["alibi"])
    verdict = AGREES if abs(value) <= FLAT_PENALTY else DISAGREES
    return f"alibi penalty at the longest position {value:+.3f} nats (flat means within {FLAT_PENALTY})", verdict


# ---- Dai et al. 2019 (Transformer-XL): memory extends the usable context -----------------------
#: The task trained through a cache, preferred for the memory check when the sweep has it.
MEMORY_TASK = "lm-memory"


def _txl_memory(frame: pd.DataFrame) -> tuple[str, str]:
    rows = frame[(frame["encoding"] == "txl") & (frame["metric"] == "loss") & frame["mem_len"].notna()
                 & (frame["mem_len"] != math.inf) & (frame["encoding_label"] == frame["encoding"])]
    if rows.empty or rows["mem_len"].nunique() < 2:
        return "needs txl evaluated through at least two memory lengths", NOT_MEASURED
    present = set(rows["task"])
    task = MEMORY_TASK if MEMORY_TASK in present else "lm" if "lm" in present else sorted(present)[0]
    rows = rows[rows["task"] == task]
    rows = rows[rows["eval_len"] == rows["eval_len"].max()]
    by_memory = rows.groupby("mem_len")["value"].mean()
    none, longest = by_memory.iloc[0], by_memory.iloc[-1]
    steps = ", ".join(f"{value:.3f} with memory {int(m)}" for m, value in by_memory.items())
    text = f"{task}, length {int(rows['eval_len'].max())}: loss {steps}"
    return text, AGREES if longest < none else DISAGREES


#: The label the suites give the sinusoidal variant that restarts its positions per segment.
RESTART_LABEL = "sinusoidal-restart"
RELATIVE = ("txl", "t5", "deberta", "rope")
#: How far (token accuracy) restarting must fall below the relative encodings to count as failing.
RESTART_GAP = 0.3


def _restart_confusion(frame: pd.DataFrame) -> tuple[str, str]:
    """lookback at the training lengths through an unbounded memory: the answer is always in
    the memory, so only the positions of cached keys decide."""
    rows = frame[(frame["task"] == "lookback") & (frame["metric"] == "token_accuracy")]
    rows = rows[rows["eval_len"].astype(float) <= rows["train_len_max"].astype(float)]
    cached = rows[rows["mem_len"] == math.inf].groupby("encoding_label")["value"].mean()
    whole = rows[rows["mem_len"].isna()].groupby("encoding_label")["value"].mean()
    relative = [n for n in RELATIVE if n in cached.index]
    if RESTART_LABEL not in cached.index or not relative:
        return f"needs {RESTART_LABEL} and a relative encoding on lookback through a memory", NOT_MEASURED
    restart, others = float(cached[RESTART_LABEL]), float(cached[relative].mean())
    text = (f"lookback token accuracy at the training lengths through an unbounded memory: {RESTART_LABEL} {restart:.2f} "
            f"(whole sequences {whole.get(RESTART_LABEL, math.nan):.2f}), "
            + ", ".join(f"{n} {cached[n]:.2f}" for n in relative)
            + (f", sinusoidal with continuing positions {cached['sinusoidal']:.2f}" if "sinusoidal" in cached.index else ""))
    verdict = AGREES if others - restart >= RESTART_GAP else DISAGREES if restart >= others - 0.05 else PARTLY
    return text, verdict


# ---- Ruoss et al. 2023: randomized positions ------------------------------------------------------
#: How suites label an encoding trained with randomized positions: its name plus this suffix,
#: beside the same encoding with default options (its name as label).
RANDOM_SUFFIX = "+random"
#: A gain (token accuracy, 0..1) within this of zero counts as no difference.
GAIN_MARGIN = 0.02


def _randomized_gain(frame: pd.DataFrame) -> tuple[str, str]:
    """Token accuracy past the training length (full context, mean over lengths and seeds),
    randomized minus plain, for each encoding and task that has both."""
    rows = frame[(frame["metric"] == "token_accuracy") & frame["mem_len"].isna() & frame["task"].notna()]
    rows = rows[rows["eval_len"].astype(float) > rows["train_len_max"].astype(float)]
    means = rows.groupby(["task", "encoding_label"])["value"].mean()
    pairs = []
    for (task, label), value in means.items():
        plain = label.removesuffix(RANDOM_SUFFIX)
        if label.endswith(RANDOM_SUFFIX) and (task, plain) in means.index:
            pairs.append((task, plain, float(means[(task, plain)]), float(value)))
    if not pairs:
        return f"needs an encoding labelled NAME{RANDOM_SUFFIX} beside NAME on the same task", NOT_MEASURED
    gains = [randomized - plain for _, _, plain, randomized in pairs]
    mean_gain = sum(gains) / len(gains)
    text = ("token accuracy past the training length, plain -> randomized: "
            + ", ".join(f"{name} on {task} {plain:.2f} -> {randomized:.2f}" for task, name, plain, randomized in pairs)
            + f"; mean gain {100 * mean_gain:+.1f} points over {len(pairs)} pair(s)")
    if mean_gain < GAIN_MARGIN:
        return text, DISAGREES
    return text, AGREES if min(gains) > -GAIN_MARGIN else PARTLY


FINDINGS: tuple[Finding, ...] = (
    Finding("NoPE, T5 and ALiBi copy past the training length better than RoPE and sinusoidal",
            "Kazemnejad et al. 2023, decoder-only, train <= 20, test 21..40, 3 seeds",
            "exact match on unseen lengths: T5 0.420, ALiBi 0.331, NoPE 0.305, sinusoidal 0.028, RoPE 0.011",
            _nope_beats_rotary),
    Finding("The order of encodings on copy past the training length",
            "Kazemnejad et al. 2023 (random-token copy)",
            "T5 > ALiBi > NoPE > sinusoidal > RoPE", _kazemnejad_order),
    Finding("Loss past the training length degrades most for sinusoidal, then rotary, then T5; ALiBi least",
            "Press et al. 2022 (ALiBi), Figure 1, WikiText-103",
            "sinusoidal breaks within tens of tokens, rotary within a few hundred, T5 slowly, ALiBi flat",
            _alibi_order),
    Finding("ALiBi's loss stays flat far past the training length",
            "Press et al. 2022 (ALiBi), Figure 1", "flat or improving to several times L", _alibi_flat),
    Finding("A longer memory lowers Transformer-XL's loss (its context exceeds the segment)",
            "Dai et al. 2019 (Transformer-XL)", "relative effective context 450% longer than a vanilla Transformer",
            _txl_memory),
    Finding("Absolute positions restarted in every segment confuse cached tokens with current ones; relative positions do not",
            "Dai et al. 2019 (Transformer-XL), section 3.3",
            "reusing cached states whose absolute positions restart per segment leaves the model unable to tell "
            "the memory's positions from the current segment's; relative encodings keep retrieval through the memory",
            _restart_confusion),
    Finding("Randomized positions improve accuracy past the training length",
            "Ruoss et al. 2023, 15 algorithmic tasks, encoder, train <= 40, test 41..500, M = 2048",
            "+12.0 points mean accuracy over the 15 tasks (best of 10 seeds per setting)",
            _randomized_gain),
)


def check_findings(frame: pd.DataFrame) -> list[Verdict]:
    """Every published finding against the sweep's stored results."""
    return [finding.against(frame) for finding in FINDINGS]
