"""Old spellings of public names kept working for one minor version: each use warns with a
DeprecationWarning that names the new spelling. The tables here are the one list of them."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Callable, Sequence, TypeVar

#: The release that drops the old spellings listed here.
REMOVED_IN = "0.4.0"

#: Modules that moved (in 0.2, and posbench.kernels.bias_types since), old import path -> new
#: one. Importing the old path gives the new
#: module itself (one module object, so its state and classes are shared) and warns once.
MOVED_MODULES: dict[str, str] = {
    "posbench.runner": "posbench.experiment.runner",
    "posbench.config": "posbench.experiment.config",
    "posbench.compute": "posbench.experiment.compute",
    "posbench.evaluation": "posbench.experiment.evaluation",
    "posbench.executors": "posbench.experiment.executors",
    "posbench.profiling": "posbench.experiment.profiling",
    "posbench.timing": "posbench.experiment.timing",
    "posbench.training": "posbench.experiment.training",
    "posbench.experiment.reaper": "posbench.reaper",
    "posbench.band_attention": "posbench.kernels.band_attention",
    "posbench.biased_attention": "posbench.kernels.biased_attention",
    "posbench.cpu": "posbench.kernels.cpu",
    "posbench.flash_ops": "posbench.kernels.flash_ops",
    "posbench.literature": "posbench.report.literature",
    "posbench.plots": "posbench.report.plots",
    "posbench.stats": "posbench.report.stats",
    "posbench.summary": "posbench.report.summary",
    "posbench.progress": "posbench.report.progress",
    "posbench.results": "posbench.store",
    "posbench.kernels.bias_types": "posbench.bias_kinds",
}

#: Names of `posbench.__all__` renamed or removed: old name -> where its replacement lives
#: ("module:name"). None so far; a rename adds its old name here rather than dropping it.
RENAMED_NAMES: dict[str, str] = {}

#: Keyword arguments renamed in 0.2, per public function: old keyword -> new keyword.
RENAMED_KEYWORDS: dict[str, dict[str, str]] = {
    "build_model": {"encoding": "encoding_name"},
}

F = TypeVar("F", bound=Callable[..., Any])


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that `old` is a deprecated spelling of `new`."""
    warnings.warn(
        f"{old} is deprecated and will be removed in posbench {REMOVED_IN}; use {new} instead.",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_keywords(function: F) -> F:
    """Let `function` take the old keyword spellings RENAMED_KEYWORDS lists for it, with a
    warning; passing both spellings is a TypeError, as for any doubled argument."""
    renames = RENAMED_KEYWORDS[function.__name__]

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for old, new in renames.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(
                        f"{function.__name__}() got both {old}= (deprecated) and {new}=; pass "
                        f"{new}= only."
                    )
                warn_renamed(f"{function.__name__}({old}=...)", f"{function.__name__}({new}=...)")
                kwargs[new] = kwargs.pop(old)
        return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def renamed_name(old: str) -> Any:
    """The object that replaced the old top-level name `old` (RENAMED_NAMES), with a warning."""
    module, _, name = RENAMED_NAMES[old].partition(":")
    warn_renamed(f"posbench.{old}", f"{module}.{name}")
    return getattr(importlib.import_module(module), name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of MOVED_MODULES and loads each as its new module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED_MODULES[spec.name]
        warn_renamed(f"the module {spec.name}", new, stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran when it was imported; the old path only names it."""


def install_moved_modules() -> None:
    """Make the old module paths importable (once per process)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
