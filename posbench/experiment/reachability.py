"""Which rows of an encoding's position- or distance-indexed parameters training reaches, and
which each evaluation length reads: a number measured on rows that training never read is a
number about an untrained parameter, not about the encoding.

Counted before training, from the positions alone: for each indexed table (see
``PositionalEncoding.indexed_tables``), the share of (query, key) pairs (or tokens, for a table
read per token) that read each row, over the training lengths (every length of the range
weighted alike, as training draws them) and at each evaluation length (full context; a cache
reads a subset of those pairs). Streams with randomized positions are counted over fixed draws."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pandas as pd
import torch
from torch import Tensor

from posbench.encodings.base import IndexedTable, PositionalEncoding
from posbench.encodings.positions import seeded_draws
from posbench.tasks.base import Task

#: Draws per length when a stream's positions are drawn (randomized positions): for training,
#: fewer than any run makes (one draw per batch, thousands of steps), so a row missed here is
#: one training is unlikely to read; for evaluation, a sample of what it reads.
TRAIN_DRAWS = 256
EVAL_DRAWS = 16
#: Query rows counted at once, so a long evaluation length never holds all its pairs.
QUERY_BLOCK = 1024
#: The phase column's value for what training reaches (the others name an evaluation length).
TRAIN_PHASE = "train"


@dataclass(frozen=True)
class Unreached:
    """Rows of one table that evaluation reads and training never does."""

    encoding: str
    table: IndexedTable
    rows: list[int]
    first_length: int  # the shortest evaluation length that reads one of them
    longest_distance: int  # the longest distance (or position) training reaches

    def message(self) -> str:
        fix = self.table.fix(self.longest_distance) if self.table.fix else None
        what = f"{self.table.row_name}s {row_ranges(self.rows)}"
        text = (
            f"{self.encoding}: {what} of {self.table.parameter} are read at evaluation (from "
            "length "
            f"{self.first_length}) but never trained at these lengths"
        )
        return f"{text}; {fix}." if fix else f"{text}."


def row_ranges(rows: list[int]) -> str:
    """[3, 4, 5, 9] as '3-5, 9'."""
    parts, start = [], None
    for i, row in enumerate(rows):
        if start is None:
            start = row
        if i + 1 == len(rows) or rows[i + 1] != row + 1:
            parts.append(str(start) if start == row else f"{start}-{row}")
            start = None
    return ", ".join(parts)


def _streams(
    encoding: PositionalEncoding, tokens: int, training: bool, seed: int
) -> Iterator[Tensor]:
    """The positions of the streams of `tokens` tokens that training or evaluation feeds."""
    drawn = encoding.random_positions
    if drawn is None or not (training or drawn.at_evaluation):
        yield torch.arange(tokens)
        return
    with seeded_draws(seed):
        for _ in range(TRAIN_DRAWS if training else EVAL_DRAWS):
            yield drawn.draw(tokens)


def _visible(
    tokens: int, causal: bool, segment: int | None, memory: int | None, rows: slice
) -> Tensor:
    """Which keys each query of `rows` attends to, (len(rows), tokens): causal (or all), and
    with recurrent training only its own segment and the `memory` keys before it."""
    i = torch.arange(tokens)[rows, None]
    j = torch.arange(tokens)[None, :]
    mask = (j <= i) if causal else torch.ones(i.shape[0], tokens, dtype=torch.bool)
    if segment is not None:
        mask &= j >= (i // segment) * segment - (memory or 0)
    return mask


def _counts(
    table: IndexedTable,
    positions: Tensor,
    causal: bool,
    segment: int | None = None,
    memory: int | None = None,
) -> Tensor:
    """How many pairs (or tokens) read each row of `table` in one stream, (size,) float64."""
    counts = torch.zeros(table.size, dtype=torch.float64)
    n = len(positions)
    for start in range(0, n, QUERY_BLOCK):
        rows = slice(start, min(n, start + QUERY_BLOCK))
        read = table.row_of(positions[rows], positions)
        if table.per_token:
            picked = read.reshape(-1)
        else:
            picked = read.expand(rows.stop - rows.start, n)[
                _visible(n, causal, segment, memory, rows)
            ]
        picked = picked[(picked >= 0) & (picked < table.size)]
        counts += torch.bincount(picked, minlength=table.size).double()
    return counts


def reachability(
    encoding: PositionalEncoding, task: Task, segment: int | None = None, memory: int | None = None
) -> pd.DataFrame:
    """Tidy rows (parameter, row_name, row, phase, share): the share of pairs (or tokens) that
    read each row in training (phase "train", over the training lengths; `segment` and `memory`
    for recurrent training) and at each evaluation length (phase = the length). Rows that no
    phase reads are left out; empty for an encoding without indexed tables."""
    records = []
    lo, hi = task.train_lengths
    phases: list[tuple[str, list[int], bool]] = [(TRAIN_PHASE, list(range(lo, hi + 1)), True)]
    phases += [(str(n), [n], False) for n in task.eval_lengths]
    for table in encoding.indexed_tables():
        shares = {}
        for phase, lengths, training in phases:
            total = torch.zeros(table.size, dtype=torch.float64)
            for length in lengths:
                tokens = task.sequence_length(length)
                for positions in _streams(encoding, tokens, training, seed=length):
                    counts = _counts(
                        table, positions, encoding.causal, segment if training else None, memory
                    )
                    total += counts / max(counts.sum().item(), 1.0)
            shares[phase] = total / total.sum().clamp(min=1e-300)
        for row in range(table.size):
            if any(float(s[row]) > 0 for s in shares.values()):
                records += [
                    {
                        "parameter": table.parameter,
                        "row_name": table.row_name,
                        "row": row,
                        "phase": phase,
                        "share": float(s[row]),
                    }
                    for phase, s in shares.items()
                ]
    return pd.DataFrame(records, columns=["parameter", "row_name", "row", "phase", "share"])


def untrained_share(frame: pd.DataFrame) -> dict[int, float]:
    """Per evaluation length, the largest share (over tables) of pairs that read a row
    training never reached: 0 where evaluation reads only trained rows."""
    if frame.empty:
        return {}
    wide = frame.pivot_table(
        index=["parameter", "row"], columns="phase", values="share", aggfunc="sum", fill_value=0.0
    )
    untrained = wide[wide[TRAIN_PHASE] == 0] if TRAIN_PHASE in wide else wide
    out: dict[int, float] = {}
    for phase in wide.columns:
        if phase == TRAIN_PHASE:
            continue
        per_table = (
            untrained[phase].groupby(level="parameter").sum()
            if not untrained.empty
            else pd.Series(dtype=float)
        )
        out[int(phase)] = float(per_table.max()) if len(per_table) else 0.0
    return dict(sorted(out.items()))


def unreached(
    encoding: PositionalEncoding,
    task: Task,
    label: str,
    frame: pd.DataFrame | None = None,
    segment: int | None = None,
    memory: int | None = None,
) -> list[Unreached]:
    """The rows evaluation reads and training never does, one entry per table that has any
    (`frame`: the reachability table, when already counted)."""
    if frame is None:
        frame = reachability(encoding, task, segment, memory)
    out = []
    for table in encoding.indexed_tables():
        rows = frame[frame["parameter"] == table.parameter]
        if rows.empty:
            continue
        wide = rows.pivot_table(index="row", columns="phase", values="share", fill_value=0.0)
        trained = (
            wide[TRAIN_PHASE] > 0 if TRAIN_PHASE in wide else pd.Series(False, index=wide.index)
        )
        evals = [c for c in wide.columns if c != TRAIN_PHASE]
        read = wide[evals].gt(0).any(axis=1) if evals else pd.Series(False, index=wide.index)
        missing = sorted(int(r) for r in wide.index[read & ~trained])
        if not missing:
            continue
        first = min(int(c) for c in evals if (wide.loc[missing, c] > 0).any())
        out.append(
            Unreached(
                label,
                table,
                missing,
                first,
                _longest_training_reach(encoding, task, segment, memory),
            )
        )
    return out


def _longest_training_reach(
    encoding: PositionalEncoding, task: Task, segment: int | None, memory: int | None
) -> int:
    """The longest distance (causal: query minus key) a training pair spans, or the last
    position a training token has; drawn positions reach their largest draw."""
    tokens = task.sequence_length(task.train_lengths[1])
    if encoding.random_positions is not None:
        return encoding.random_positions.max_position - 1
    if segment is not None:
        return min(tokens, segment + (memory or 0)) - 1
    return tokens - 1
