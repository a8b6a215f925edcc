"""Published findings the suite can check, each compared with what a sweep measured.

Every check reads only the tidy results of the task it names and says plainly whether the tiny
models agree with the paper, disagree (with the numbers), or could not be compared (what is
missing). Each verdict carries its uncertainty over seeds: the check is repeated on seed
bootstrap replicates (each encoding's seeds drawn with replacement, per task) and says "agrees"
or "disagrees" only when at least AGREEMENT_NEEDED of the replicates do; otherwise
"inconclusive". One seed gives no replicates that differ, so it is inconclusive too. Nothing
here adjusts a protocol: a disagreement is a result."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import pandas as pd
from scipy import stats

from posbench.experiment.config import UNLEARNED_EXCESS
from posbench.report.published import published_numbers, unseen_scores
from posbench.report.summary import (
    RANDOM_SUFFIX,
    comparison_kind,
    deepmind_scores,
    learned_in_distribution,
    token_accuracy_rows,
    token_metric,
)

AGREES, PARTLY, DISAGREES, NOT_MEASURED = "agrees", "partly agrees", "disagrees", "not measured"
INCONCLUSIVE = "inconclusive"
#: Rank agreement (Spearman's rho) at or above which an ordering counts as reproduced: over five
#: encodings, the published order or one adjacent swap (a random order gets there 4% of the time).
RANK_AGREEMENT = 0.9
#: Seed bootstrap replicates per verdict, and the share of them that must agree (or disagree).
BOOTSTRAP_REPLICATES = 200
AGREEMENT_NEEDED = 0.9
#: A finding about a suite of tasks (Ruoss et al.'s gain, Deletang et al.'s unsolved classes)
#: is judged only when at least this share of its (task, encoding) pairs learned their task in
#: distribution: below it, the verdict would rest on the few models the budget happened to train.
JUDGED_SHARE_NEEDED = 0.5
#: The metrics the checks read (the rest of a results frame is dropped before resampling).
CHECKED_METRICS = (
    "exact_match",
    "token_accuracy",
    "greedy_token_accuracy",
    "loss",
    "lm_penalty",
    "excess_loss",
    "steps_to_threshold",  # tells equal accuracy from equal compute
)
#: A penalty within this many nats of zero counts as flat.
FLAT_PENALTY = 0.05


@dataclass(frozen=True)
class Verdict:
    """One published finding against this sweep: the verdict over seed bootstrap replicates
    and the share of replicates whose own verdict was "agrees" (NaN when not measured)."""

    finding: str
    source: str
    published: str
    measured: str
    verdict: str
    agreement: float = math.nan


@dataclass(frozen=True)
class Finding:
    finding: str
    source: str
    published: str
    check: Callable[[pd.DataFrame], tuple[str, str]]  # frame -> (measured, verdict)
    #: The tasks the check reads (None: every task, paired within each).
    tasks: tuple[str, ...] | None = None

    def against(
        self, frame: pd.DataFrame, replicates: int = BOOTSTRAP_REPLICATES, seed: int = 0
    ) -> Verdict:
        """The check on the observed results, then on seed bootstrap replicates of them."""
        frame = _checked_rows(frame, self.tasks)
        measured, observed = self.check(frame)
        if observed == NOT_MEASURED:
            return Verdict(self.finding, self.source, self.published, measured, observed)
        seeds = frame.groupby(["task", "encoding_label"])["seed"].nunique()
        if seeds.min() < 2:
            return Verdict(
                self.finding,
                self.source,
                self.published,
                f"{measured}; one seed for some encoding, so seed variance is unknown ({observed} "
                "on that seed)",
                INCONCLUSIVE,
                1.0 if observed == AGREES else 0.0,
            )
        outcomes = [self.check(sample)[1] for sample in seed_bootstrap(frame, replicates, seed)]
        shares = {v: outcomes.count(v) / len(outcomes) for v in (AGREES, PARTLY, DISAGREES)}
        if shares[AGREES] >= AGREEMENT_NEEDED:
            verdict = AGREES
        elif shares[DISAGREES] >= AGREEMENT_NEEDED:
            verdict = DISAGREES
        elif shares[AGREES] + shares[PARTLY] >= AGREEMENT_NEEDED:
            verdict = PARTLY
        else:
            verdict = INCONCLUSIVE
        text = (
            f"{measured}; over {replicates} seed-bootstrap replicates {shares[AGREES]:.0%} agree, "
            f"{shares[PARTLY]:.0%} partly, {shares[DISAGREES]:.0%} disagree"
        )
        return Verdict(self.finding, self.source, self.published, text, verdict, shares[AGREES])


def _checked_rows(frame: pd.DataFrame, tasks: tuple[str, ...] | None) -> pd.DataFrame:
    """The rows a check may read: trained runs of its tasks, the metrics checks use."""
    rows = frame[frame["task"].notna() & frame["metric"].isin(CHECKED_METRICS)]
    if tasks is not None:
        rows = rows[rows["task"].isin(tasks)]
    return rows.reset_index(drop=True)


def seed_bootstrap(frame: pd.DataFrame, replicates: int, seed: int = 0) -> Iterator[pd.DataFrame]:
    """Replicates of `frame` in which each (task, encoding label) has as many seeds as before,
    drawn with replacement from its own; a seed drawn twice appears twice under new seed
    numbers, so per-seed means weigh it twice."""
    rng = np.random.default_rng(seed)
    frame = frame.reset_index(drop=True)
    plans = []  # per group: the frame's row positions of each of its seeds
    for _, group in frame.groupby(["task", "encoding_label"], sort=True):
        rows = group.index.to_numpy()
        plans.append(
            [rows[positions] for _, positions in sorted(group.groupby("seed").indices.items())]
        )
    for _ in range(replicates):
        rows, seeds = [], []
        for by_seed in plans:
            for new_seed, pick in enumerate(rng.integers(0, len(by_seed), len(by_seed))):
                rows.append(by_seed[pick])
                seeds.append(np.full(len(by_seed[pick]), new_seed))
        sample = frame.iloc[np.concatenate(rows)].reset_index(drop=True)
        sample["seed"] = np.concatenate(seeds)
        yield sample


def learned_language(frame: pd.DataFrame, task: str) -> pd.Series:
    """Per encoding label on `task`: whether it learned the task in distribution (the report's
    one rule, summary.learned_in_distribution; True where the task stores no floor)."""
    rows = frame[frame["task"] == task]
    learned = learned_in_distribution(rows)
    labels = rows["encoding_label"].unique()
    return pd.Series(
        {label: bool(learned.get((task, label), True)) for label in labels}, dtype=bool
    )


# ---- Kazemnejad et al. 2023: copy past the training length -----------------------------------
def _kazemnejad_copy() -> dict[str, float]:
    """Their exact match on unseen lengths, copy with random tokens, mean of 3 seeds, per
    encoding (from the published data file)."""
    numbers = published_numbers()
    rows = numbers[(numbers["paper"] == "kazemnejad2023") & (numbers["task"] == "copy")]
    return dict(zip(rows["encoding"], rows["value"].astype(float)))


def _unseen_exact_match(frame: pd.DataFrame, task: str) -> pd.Series:
    """Per built-in encoding (the entry labelled with its name, see unseen_scores) that learned
    `task` in distribution: mean exact match over lengths past the longest training length up
    to twice it, full context, mean over seeds. A model that did not learn the task is not
    compared."""
    scores = unseen_scores(frame, "exact_match")
    learned = learned_language(frame, task)
    scores = scores[(scores["task"] == task) & scores["encoding"].map(learned).fillna(False)]
    return scores.groupby("encoding")["value"].mean()


def _rank_verdict(published: dict[str, float], measured: pd.Series, what: str) -> tuple[str, str]:
    common = [
        name for name in published if name in measured.index and not math.isnan(measured[name])
    ]
    if len(common) < 3:
        return (
            f"needs at least 3 of {', '.join(published)}; this sweep has "
            f"{', '.join(common) or 'none'}",
            NOT_MEASURED,
        )
    values = [measured[name] for name in common]
    numbers = ", ".join(
        f"{name} {measured[name]:.2f}" for name in sorted(common, key=lambda n: -measured[n])
    )
    if len(set(values)) == 1:
        return f"{what}: every encoding {values[0]:.2f}, so no order can be compared", NOT_MEASURED
    rho = float(stats.spearmanr([published[n] for n in common], values).statistic)
    # one adjacent swap of five is rho = 0.9 exactly, which scipy returns as 0.8999999999999998
    verdict = AGREES if rho >= RANK_AGREEMENT - 1e-9 else PARTLY if rho > 0 else DISAGREES
    return f"{what}: {numbers} (Spearman rho {rho:+.2f} with the published order)", verdict


def _kazemnejad_order(frame: pd.DataFrame) -> tuple[str, str]:
    return _rank_verdict(
        _kazemnejad_copy(), _unseen_exact_match(frame, "copy"), "copy exact match, lengths L..2L"
    )


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
    verdict = (
        AGREES if low > high else PARTLY if max(measured[n] for n in good) > high else DISAGREES
    )
    return text, verdict


# ---- Press et al. 2022 (ALiBi), Figure 1: loss past the training length ------------------------
#: Published degradation past L: sinusoidal worst, then rotary, then T5; ALiBi flat (rank, high =
#: worse).
ALIBI_FIGURE_1 = {"sinusoidal": 4.0, "rope": 3.0, "t5": 2.0, "alibi": 1.0}


#: The penalty (nats) above which the loss counts as broken at a position.
BROKEN_PENALTY = 0.1


def _lm_penalties(frame: pd.DataFrame) -> pd.DataFrame:
    """Per built-in encoding on lm that learned the language: mean penalty by position (rows)
    over seeds. A model that never learned the language has no penalty worth comparing."""
    learned = learned_language(frame, "lm")
    rows = frame[
        (frame["task"] == "lm")
        & (frame["metric"] == "lm_penalty")
        & (frame["encoding_label"] == frame["encoding"])
    ]
    rows = rows[rows["encoding_label"].map(learned).fillna(False).astype(bool)]
    return rows.pivot_table(index="position", columns="encoding", values="value", aggfunc="mean")


def _unlearned(frame: pd.DataFrame, names: tuple[str, ...]) -> list[str]:
    """Which of the built-in `names` ran lm but did not learn the language."""
    learned = learned_language(frame, "lm")
    return [n for n in names if n in learned.index and not learned[n]]


def _longest_penalty(frame: pd.DataFrame) -> pd.Series:
    table = _lm_penalties(frame)
    return table.iloc[-1] if not table.empty else pd.Series(dtype=float)


def _alibi_order(frame: pd.DataFrame) -> tuple[str, str]:
    """Rank by how soon the loss breaks past the training length (the first position whose
    penalty exceeds BROKEN_PENALTY; never is best), ties by the penalty at the longest position."""
    table = _lm_penalties(frame)
    unlearned = _unlearned(frame, tuple(ALIBI_FIGURE_1))
    if table.empty:
        measured, verdict = _rank_verdict(ALIBI_FIGURE_1, pd.Series(dtype=float), "")
        return measured + (
            f" that learned the language ({', '.join(unlearned)} did not)" if unlearned else ""
        ), verdict
    train_max = frame.loc[frame["task"] == "lm", "train_len_max"].max()
    past = table[table.index > train_max]
    breaks, scores = {}, {}
    for name in past.columns:
        broken = past.index[past[name] > BROKEN_PENALTY]
        breaks[name] = float(broken[0]) if len(broken) else math.inf
    order = sorted(breaks, key=lambda n: (breaks[n], -past[n].iloc[-1]))  # worst first
    for rank, name in enumerate(order):
        scores[name] = float(len(order) - rank)
    measured, verdict = _rank_verdict(
        ALIBI_FIGURE_1, pd.Series(scores), "lm loss breaks (penalty > 0.1 nats) at"
    )
    detail = ", ".join(
        f"{n} {'never' if math.isinf(breaks[n]) else int(breaks[n])} ({past[n].iloc[-1]:+.2f} at "
        f"{int(past.index[-1])})"
        for n in order
        if n in ALIBI_FIGURE_1
    )
    return (
        f"lm loss breaks (penalty > {BROKEN_PENALTY} nats) at: {detail}"
        + measured[measured.find(" (Spearman") :]
        if "Spearman" in measured
        else measured
    ), verdict


def _t5_slow(frame: pd.DataFrame) -> tuple[str, str]:
    """T5's penalty at the longest position against rotary's and sinusoidal's."""
    penalty = _longest_penalty(frame)
    unlearned = _unlearned(frame, ("t5", "rope", "sinusoidal"))
    if unlearned:
        return f"{', '.join(unlearned)} did not learn the language", NOT_MEASURED
    others = [n for n in ("rope", "sinusoidal") if n in penalty.index]
    if "t5" not in penalty.index or not others:
        return "needs t5 and rope or sinusoidal on the lm task", NOT_MEASURED
    t5 = float(penalty["t5"])
    text = (
        f"penalty at the longest position: t5 {t5:+.3f}, "
        + ", ".join(f"{n} {float(penalty[n]):+.3f}" for n in others)
        + " nats"
    )
    below = [t5 < float(penalty[n]) for n in others]
    return text, AGREES if all(below) else PARTLY if any(below) else DISAGREES


def _alibi_flat(frame: pd.DataFrame) -> tuple[str, str]:
    penalty = _longest_penalty(frame)
    if _unlearned(frame, ("alibi",)):
        return (
            f"alibi did not learn the language (in-distribution loss more than {UNLEARNED_EXCESS} "
            "nats above the floor)",
            NOT_MEASURED,
        )
    if "alibi" not in penalty.index:
        return "needs alibi on the lm task", NOT_MEASURED
    value = float(penalty["alibi"])
    verdict = AGREES if abs(value) <= FLAT_PENALTY else DISAGREES
    return (
        f"alibi penalty at the longest position {value:+.3f} nats (flat means within "
        f"{FLAT_PENALTY})",
        verdict,
    )


# ---- Dai et al. 2019 (Transformer-XL): memory extends the usable context -----------------------
#: The task trained through a cache, preferred for the memory check when the sweep has it.
MEMORY_TASK = "lm-memory"


def _txl_memory(frame: pd.DataFrame) -> tuple[str, str]:
    rows = frame[
        (frame["encoding"] == "txl")
        & (frame["metric"] == "loss")
        & frame["mem_len"].notna()
        & (frame["mem_len"] != math.inf)
        & (frame["encoding_label"] == frame["encoding"])
    ]
    task = MEMORY_TASK
    rows = rows[rows["task"] == task]
    if rows.empty or rows["mem_len"].nunique() < 2:
        return (
            f"needs txl on {MEMORY_TASK} (trained through a cache) evaluated through at least two "
            "memory lengths",
            NOT_MEASURED,
        )
    rows = rows[rows["eval_len"] == rows["eval_len"].max()]
    by_memory = rows.groupby("mem_len")["value"].mean()
    none, longest = by_memory.iloc[0], by_memory.iloc[-1]
    steps = ", ".join(f"{value:.3f} with memory {int(m)}" for m, value in by_memory.items())
    text = f"{task}, length {int(rows['eval_len'].max())}: loss {steps}"
    if not learned_language(frame, task).get("txl", True):
        return (
            f"txl did not learn {task} in distribution (loss more than {UNLEARNED_EXCESS} nats "
            f"above the floor), so its {text} is shown, not judged",
            NOT_MEASURED,
        )
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
    learned = learned_language(frame, "lookback")
    unlearned = [n for n in RELATIVE if n in cached.index and not learned[n]]
    relative = [n for n in RELATIVE if n in cached.index and learned[n]]
    if RESTART_LABEL in cached.index and not learned[RESTART_LABEL]:
        return f"{RESTART_LABEL} did not learn lookback in distribution", NOT_MEASURED
    if RESTART_LABEL not in cached.index or not relative:
        return (
            f"needs {RESTART_LABEL} and a relative encoding that learned lookback, on lookback "
            "through a memory",
            NOT_MEASURED,
        )
    restart, others = float(cached[RESTART_LABEL]), float(cached[relative].mean())
    text = (
        "lookback token accuracy at the training lengths through an unbounded memory: "
        f"{RESTART_LABEL} {restart:.2f} "
        f"(whole sequences {whole.get(RESTART_LABEL, math.nan):.2f}), "
        + ", ".join(f"{n} {cached[n]:.2f}" for n in relative)
        + (
            f", sinusoidal with continuing positions {cached['sinusoidal']:.2f}"
            if "sinusoidal" in cached.index
            else ""
        )
        + (
            f" ({', '.join(unlearned)} did not learn lookback in distribution: not compared)"
            if unlearned
            else ""
        )
    )
    verdict = (
        AGREES
        if others - restart >= RESTART_GAP
        else DISAGREES
        if restart >= others - 0.05
        else PARTLY
    )
    return text, verdict


# ---- Ruoss et al. 2023: randomized positions
# ------------------------------------------------------
#: A gain (token accuracy, 0..1) within this of zero counts as no difference.
GAIN_MARGIN = 0.02
#: Ruoss et al.'s mean gain over the 15 tasks; a gain within a factor of two of it agrees in size.
RUOSS_GAIN = 0.120


def _randomized_gain(frame: pd.DataFrame) -> tuple[str, str]:
    """Token accuracy past the training length (full context, mean over lengths and seeds),
    randomized minus plain, for each encoding and task that has both and learned the task in
    distribution both ways. Where a task generates its answer token by token the accuracy is
    free-running (greedy), as Ruoss et al.'s encoder emits its answer without reading it;
    elsewhere it is the stored token accuracy (the encoder form emits its answer at once; a
    decoder run from before free-running metrics was teacher-forced). Where some tasks train
    every encoding the same steps, the verdict reads those pairs only: at equal accuracy a
    randomized run that needs more steps also trains longer, so its gain is confounded with
    training."""
    rows = frame[frame["mem_len"].isna() & frame["task"].notna()]
    rows = rows[rows["eval_len"].astype(float) > rows["train_len_max"].astype(float)]
    metrics = token_metric(rows)
    greedy = {t for t, m in metrics.items() if m == "greedy_token_accuracy"}
    means = token_accuracy_rows(rows).groupby(["task", "encoding_label"])["value"].mean()
    learned = learned_in_distribution(frame)
    pairs, unlearned, lost = [], [], False
    for (task, label), value in means.items():
        plain = label.removesuffix(RANDOM_SUFFIX)
        if not (label.endswith(RANDOM_SUFFIX) and (task, plain) in means.index):
            continue
        failed = [n for n in (plain, label) if not learned.get((task, n), True)]
        if failed:
            unlearned.append((task, " and ".join(failed)))
            lost |= failed == [label]  # randomizing cost the model the task itself
            continue
        pairs.append((task, plain, float(means[(task, plain)]), float(value)))
    skipped = (
        "; not compared, as they did not learn the task in distribution: "
        + _unlearned_pairs(unlearned, pairs)
        if unlearned
        else ""
    )
    if not pairs:
        return (
            f"needs an encoding labelled NAME{RANDOM_SUFFIX} beside NAME on the same task, both "
            f"learned in distribution{skipped}",
            NOT_MEASURED,
        )
    kinds_of_task = comparison_kind(frame)
    equal_compute = [pair for pair in pairs if kinds_of_task.get(pair[0]) == "equal compute"]
    others = [pair for pair in pairs if pair not in equal_compute]
    judged = equal_compute or pairs
    gains = [randomized - plain for _, _, plain, randomized in judged]
    mean_gain = sum(gains) / len(gains)
    other_gain = sum(randomized - plain for _, _, plain, randomized in others) / max(len(others), 1)
    judged_on = (
        f" at equal compute (every encoding trained the same steps; where each run trained "
        f"until a threshold or the step cap: {100 * other_gain:+.1f} over "
        f"{len(others)} pair(s), not judged)"
        if equal_compute and others
        else ""
    )
    kinds = sorted(
        {
            "free-running" if t in greedy else "teacher-forced, or emitted at once by an encoder"
            for t, *_ in pairs
        }
    )
    text = (
        f"token accuracy ({' / '.join(kinds)}) past the training length, plain -> randomized: "
        + ", ".join(
            f"{name} on {task} {plain:.2f} -> {randomized:.2f}"
            for task, name, plain, randomized in pairs
        )
        + f"; mean gain {100 * mean_gain:+.1f} points over {len(judged)} pair(s){judged_on} "
        "against the published "
        f"{100 * RUOSS_GAIN:+.1f} (theirs: an encoder, best of 10 seeds, 15 tasks; here the mean "
        "over seeds)" + skipped
    )
    total = len(pairs) + len(unlearned)
    if len(pairs) < JUDGED_SHARE_NEEDED * total:
        return text + _too_few_learned(len(pairs), total, "pairs"), INCONCLUSIVE
    if mean_gain < GAIN_MARGIN:
        return text, DISAGREES
    if min(gains) <= -GAIN_MARGIN or lost:
        return text, PARTLY
    return text, AGREES if RUOSS_GAIN / 2 <= mean_gain <= 2 * RUOSS_GAIN else PARTLY


def _unlearned_pairs(unlearned: list[tuple[str, str]], judged: list[tuple]) -> str:
    """The (task, names) pairs left out, grouped by task: "every pair on TASK (n)" for a task
    none of whose several pairs was compared, else the names that failed on each task."""
    by_task: dict[str, list[str]] = {}
    for task, names in unlearned:
        by_task.setdefault(task, []).append(names)
    judged_tasks = {pair[0] for pair in judged}
    whole = [t for t, names in by_task.items() if t not in judged_tasks and len(names) > 1]
    parts = (
        [f"every pair on {', '.join(f'{t} ({len(by_task[t])})' for t in whole)}"] if whole else []
    )
    parts += [f"{', '.join(names)} on {t}" for t, names in by_task.items() if t not in whole]
    return "; ".join(parts)


def _too_few_learned(judged: int, total: int, what: str) -> str:
    """The clause an inconclusive verdict adds when too few models learned their tasks."""
    return (
        f"; judged on {judged} of {total} {what}, fewer than {JUDGED_SHARE_NEEDED:.0%}: too few "
        "models learned their task in distribution for a verdict at this budget"
    )


# ---- Deletang et al. 2023: Transformers and the Chomsky hierarchy -----------------------------
#: Their threshold for a solved task: a score (token accuracy past the training lengths) >= 90%.
SOLVED_AT = 0.9

#: The encodings their Transformer column is the best of (posbench names): none, sin/cos, RoPE,
#: ALiBi and Transformer-XL's relative scheme. Their claims are judged on these alone.
DELETANG_ENCODINGS = ("nope", "sinusoidal", "rope", "alibi", "txl")


def _unsolved(family: str, only: tuple[str, ...] = ()) -> Callable[[pd.DataFrame], tuple[str, str]]:
    """A check that none of their encodings at plain positions solves a task of `family` (or of
    `only`): each learned (task, encoding) pair's best seed stays below SOLVED_AT. A task solved
    by an encoding they did not run (T5, say) is named beside the verdict, not judged: their
    claim was measured on their five."""

    def check(frame: pd.DataFrame) -> tuple[str, str]:
        names = frame.drop_duplicates("encoding_label").set_index("encoding_label")["encoding"]
        scores = deepmind_scores(frame)
        scores = scores[
            (scores["family"] == family) & ~scores["encoding_label"].str.endswith(RANDOM_SUFFIX)
        ]
        if only:
            scores = scores[scores["task"].isin(only)]
        learned = scores[scores["learned"].astype(bool)]
        best_seeds = learned.groupby(["task", "encoding_label"])["score"].max()
        theirs = best_seeds.index.get_level_values("encoding_label").map(names)
        best = best_seeds[theirs.isin(DELETANG_ENCODINGS)]
        others = best_seeds[~theirs.isin(DELETANG_ENCODINGS)]
        others = others[others >= SOLVED_AT]
        beside = (
            "; solved by encodings they did not run (not judged): "
            + ", ".join(f"{task} {label} {value:.2f}" for (task, label), value in others.items())
            if len(others)
            else ""
        )
        scores = scores[scores["encoding_label"].map(names).isin(DELETANG_ENCODINGS)]
        if best.empty:
            reason = (
                "no task of the class ran at plain positions with their encodings"
                if scores.empty
                else "none of their encodings at plain positions learned one of its tasks in "
                "distribution"
            )
            return f"{family}: {reason}{beside}", NOT_MEASURED
        top = best.groupby(level="task").idxmax()
        solved = sorted({task for (task, _), value in best.items() if value >= SOLVED_AT})
        unjudged = scores.loc[~scores["learned"], ["task", "encoding_label"]].drop_duplicates()
        total = len(best) + len(unjudged)
        text = (
            f"{family}, best seed per task at plain positions (the best of their encodings): "
            + ", ".join(f"{task} {label} {best[(task, label)]:.2f}" for task, label in top)
            + f"; solved (>= {SOLVED_AT:.0%}): {', '.join(solved) or 'none'}"
            + (
                f"; not learned in distribution, so not judged: {len(unjudged)} task x "
                "encoding pair(s)"
                if len(unjudged)
                else ""
            )
            + " (theirs: the best of 10 seeds and 3 learning rates, tested to length 500 after "
            "training to 40)" + beside
        )
        if solved:  # one solved task refutes "none solved", however few models learned
            return text, DISAGREES
        if len(best) < JUDGED_SHARE_NEEDED * total:
            return text + _too_few_learned(len(best), total, "task x encoding pairs"), INCONCLUSIVE
        return text, AGREES

    return check


FINDINGS: tuple[Finding, ...] = (
    Finding(
        "NoPE, T5 and ALiBi copy past the training length better than RoPE and sinusoidal",
        "Kazemnejad et al. 2023, decoder-only, train <= 20, test 21..40, 3 seeds",
        "exact match on unseen lengths: T5 0.420, ALiBi 0.331, NoPE 0.305, sinusoidal 0.028, RoPE "
        "0.011",
        _nope_beats_rotary,
        ("copy",),
    ),
    Finding(
        "The order of encodings on copy past the training length",
        "Kazemnejad et al. 2023 (random-token copy)",
        f"T5 > ALiBi > NoPE > sinusoidal > RoPE (agrees at Spearman rho >= {RANK_AGREEMENT})",
        _kazemnejad_order,
        ("copy",),
    ),
    Finding(
        "Loss past the training length degrades most for sinusoidal, then rotary, then T5; ALiBi "
        "least",
        "Press et al. 2022 (ALiBi), Figure 1, WikiText-103",
        "sinusoidal breaks within tens of tokens, rotary within a few hundred, T5 slowly, ALiBi "
        "flat",
        _alibi_order,
        ("lm",),
    ),
    Finding(
        "T5's loss degrades more slowly than rotary's and sinusoidal's past the training length",
        "Press et al. 2022 (ALiBi), Figure 1 (T5 trained on windows four times its max_distance)",
        "T5's perplexity rises slowly where rotary's and sinusoidal's explode",
        _t5_slow,
        ("lm",),
    ),
    Finding(
        "ALiBi's loss stays flat far past the training length",
        "Press et al. 2022 (ALiBi), Figure 1",
        "flat or improving to several times L",
        _alibi_flat,
        ("lm",),
    ),
    Finding(
        "A longer memory lowers Transformer-XL's loss (its context exceeds the segment)",
        "Dai et al. 2019 (Transformer-XL)",
        "relative effective context 450% longer than a vanilla Transformer",
        _txl_memory,
        (MEMORY_TASK,),
    ),
    Finding(
        "Absolute positions restarted in every segment confuse cached tokens with current ones; "
        "relative positions do not",
        "Dai et al. 2019 (Transformer-XL), section 3.3",
        "reusing cached states whose absolute positions restart per segment leaves the model "
        "unable to tell "
        "the memory's positions from the current segment's; relative encodings keep retrieval "
        "through the memory",
        _restart_confusion,
        ("lookback",),
    ),
    Finding(
        "Randomized positions improve accuracy past the training length",
        "Ruoss et al. 2023, 15 algorithmic tasks, encoder, train <= 40, test 41..500, M = 2048",
        "+12.0 points mean accuracy over the 15 tasks (best of 10 seeds per setting); agrees in "
        "size within a factor of 2",
        _randomized_gain,
    ),
    Finding(
        "Transformers do not solve cycle navigation (a regular task)",
        "Deletang et al. 2023, results (prose); encoder, train <= 40, test 41..500",
        "61.9% for the best Transformer (chance 20%); solved means >= 90%",
        _unsolved("regular", ("cycle_navigation",)),
    ),
    Finding(
        "Transformers fail to generalise on context-free tasks",
        "Deletang et al. 2023, abstract; encoder, train <= 40, test 41..500",
        "no context-free task solved (>= 90%) by a Transformer, the best of 5 encodings",
        _unsolved("context-free"),
    ),
    Finding(
        "Transformers fail to generalise on context-sensitive tasks",
        "Deletang et al. 2023, abstract; encoder, train <= 40, test 41..500",
        "no context-sensitive task solved (>= 90%) by a Transformer, the best of 5 encodings",
        _unsolved("context-sensitive"),
    ),
)


def check_findings(frame: pd.DataFrame, replicates: int = BOOTSTRAP_REPLICATES) -> list[Verdict]:
    """Every published finding against the sweep's stored results, each with its seed bootstrap."""
    return [finding.against(frame, replicates) for finding in FINDINGS]
