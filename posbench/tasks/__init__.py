"""The task registry and the built-in tasks (each registered in its own module)."""

from __future__ import annotations

from posbench.tasks.base import Batch, Task
from posbench.tasks.registry import REGISTRY, register_task


def list_tasks(pattern: str | None = None) -> list[str]:
    """Names of the registered tasks, built-ins and plugins, optionally wildcard-filtered."""
    return REGISTRY.names(pattern)


def create_task(name: str, **options: object) -> Task:
    """Build task `name` with its options (e.g. train_lengths, eval_lengths)."""
    return REGISTRY.create(name, **options)  # type: ignore[return-value]


# Built-ins register themselves on import: the synthetic tasks, then DeepMind's suite.
from posbench.tasks import (  # noqa: E402,F401
    copy,
    copy_variants,
    lm,
    lookback,
    mqar,
    passkey,
    reverse,
    shakespeare,
)
from posbench.tasks import counting, flip_flop, selective_copy  # noqa: E402,F401
from posbench.tasks import (  # noqa: E402,F401
    binary_addition,
    binary_multiplication,
    bucket_sort,
    compute_sqrt,
    cycle_navigation,
    duplicate_string,
    even_pairs,
    missing_duplicate_string,
    modular_arithmetic,
    modular_arithmetic_brackets,
    odds_first,
    parity_check,
    reverse_string,
    solve_equation,
    stack_manipulation,
)

__all__ = ["REGISTRY", "Batch", "Task", "create_task", "list_tasks", "register_task"]
