"""The task registry and the built-in tasks (each registered in its own module)."""
from __future__ import annotations

from posbench.registry import Registry
from posbench.tasks.base import Batch, Task


def _load_plugins() -> None:
    from posbench.plugins import load_plugins

    load_plugins()


REGISTRY: Registry[type[Task]] = Registry("task", before_lookup=_load_plugins)


def register_task(name: str):
    """Class decorator: make a task available as `name` everywhere in posbench."""
    return REGISTRY.register(name)


def list_tasks(pattern: str | None = None) -> list[str]:
    """Names of the registered tasks, built-ins and plugins, optionally wildcard-filtered."""
    return REGISTRY.names(pattern)


def create_task(name: str, **options: object) -> Task:
    """Build task `name` with its options (e.g. train_lengths, eval_lengths)."""
    return REGISTRY.create(name, **options)  # type: ignore[return-value]


from posbench.tasks import copy, lm, mqar, passkey, reverse  # noqa: E402,F401

__all__ = ["REGISTRY", "Batch", "Task", "create_task", "list_tasks", "register_task"]
