"""What a sweep did, as the runner hands it to the terminal: kept apart from the runner so
that showing it needs nothing that computes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class SweepOutcome:
    """What a sweep did: runs trained now, runs skipped as finished, failures, damaged runs
    set aside, and problems met while collecting results."""

    out_dir: Path
    results_csv: Path
    ran: list[str] = field(default_factory=list)
    #: Of `ran`, the fixed-budget runs evaluated on the model of an early-stopping twin that
    #: never stopped (not trained again).
    took_twin_model: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # label -> one-line error
    set_aside: dict[str, str] = field(default_factory=dict)  # label -> what was damaged
    problems: list[str] = field(default_factory=list)
    #: Labels of runs the sweep asks for that are neither stored whole nor failed at the end
    #: (a run folder deleted while the sweep ran, say).
    missing: list[str] = field(default_factory=list)
    #: The plan executed, as `posbench run --dry-run` prints it: (kind, label, run id, action).
    plan: list[tuple[str, str, str, str]] = field(default_factory=list)

    @property
    def finished_any(self) -> bool:
        """Whether at least one run of the sweep finished (so there is something to report)."""
        return len(self.ran) + len(self.skipped) > len(self.failures)
