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


from posbench.tasks import copy, lm, lookback, mqar, passkey, reverse  # noqa: E402,F401

__all__ = ["REGISTRY", "Batch", "Task", "create_task", "list_tasks", "register_task"]
