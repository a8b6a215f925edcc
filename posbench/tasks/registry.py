"""The task registry: built-ins register themselves on import, plugins through
`register_task` (kept apart from the package's __init__ so no module imports its own package)."""

from __future__ import annotations

from typing import Callable, TypeVar

from posbench.registry import Registry
from posbench.tasks.base import Task

T = TypeVar("T", bound=type)

REGISTRY: Registry[type[Task]] = Registry("task", Task)


def register_task(name: str) -> Callable[[T], T]:
    """Class decorator: make a task available as `name` everywhere in posbench."""
    return REGISTRY.register(name)  # type: ignore[return-value]
