"""One generic registry for encodings and tasks: register by name, list with wildcards, create
with a helpful error for unknown names and options (after timm and lm-evaluation-harness)."""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import inspect
import sys
from pathlib import Path
from typing import Callable, Generic, Iterable, Sequence, TypeVar

from posbench.errors import OptionError, UnknownNameError
from posbench.validation import check_declared

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to the subclasses of one base class, e.g. encodings or tasks."""

    def __init__(self, kind: str, base: type) -> None:
        self.kind = kind
        self.base = base  # every entry is a subclass of it
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers a class under `name`; a name may be registered once, and
        only by a subclass of the registry's base class."""

        def decorator(obj: T) -> T:
            if not (isinstance(obj, type) and issubclass(obj, self.base)):
                raise TypeError(
                    f"{self.kind} {name!r}: {getattr(obj, '__qualname__', obj)!r} is not a "
                    "subclass of "
                    f"{self.base.__name__}; derive it from posbench.{self.base.__name__}."
                )
            existing = self._entries.get(name)
            if existing is not None and existing is not obj:
                qualname = getattr(existing, "__qualname__", existing)
                raise ValueError(f"{self.kind} {name!r} is already registered (by {qualname}).")
            self._entries[name] = obj
            obj.name = name  # type: ignore[attr-defined]
            return obj

        return decorator

    def code_digest(self, name: str) -> str | None:
        """A digest of the source file that defines `name`'s entry when a plugin defines it
        (None for posbench's own, which runs record by version and commit): a run stores it, so
        editing a plugin's code makes its runs a new configuration, never pooled with old ones."""
        entry = self.get(name)
        module_name = getattr(entry, "__module__", "")
        if module_name.split(".")[0] == "posbench":
            return None
        try:
            source = Path(sys.modules[module_name].__file__ or "").read_bytes()
        except (AttributeError, KeyError, OSError):  # no file holds it (exec): its name does
            source = f"{module_name}.{getattr(entry, '__qualname__', name)}".encode("utf-8")
        return hashlib.sha256(source).hexdigest()[:12]

    def names(self, pattern: str | None = None) -> list[str]:
        """Registered names, sorted, optionally filtered by a shell-style wildcard."""
        names = sorted(self._entries)
        return [n for n in names if pattern is None or fnmatch.fnmatchcase(n, pattern)]

    def get(self, name: str) -> T:
        """The entry for `name`; an unknown name raises with suggestions and the full list."""
        if name in self._entries:
            return self._entries[name]
        close = difflib.get_close_matches(name, list(self._entries), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownNameError(
            f"Unknown {self.kind} {name!r}.{hint} Available: {', '.join(sorted(self._entries))}."
        )

    def select(self, patterns: str | Iterable[str]) -> list[str]:
        """Expand comma-separated names and wildcards into registered names, in given order."""
        if isinstance(patterns, str):
            patterns = patterns.split(",")
        selected: list[str] = []
        for pattern in (p.strip() for p in patterns):
            if not pattern:
                continue
            if any(ch in pattern for ch in "*?["):
                matches = self.names(pattern)
                if not matches:
                    raise UnknownNameError(
                        f"No {self.kind} matches {pattern!r}. Available: {', '.join(self.names())}."
                    )
            else:
                self.get(pattern)
                matches = [pattern]
            selected.extend(m for m in matches if m not in selected)
        return selected

    def create(self, name: str, *args: object, **options: object) -> object:
        """Instantiate `name`, naming any option its constructor does not accept."""
        factory = self.get(name)
        check_options(factory, options, f"{self.kind} {name!r}")
        return factory(*args, **options)  # type: ignore[operator]

    def description(self, name: str) -> str:
        """First line of the entry's docstring."""
        doc = inspect.getdoc(self.get(name)) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


def check_options(
    factory: object, options: dict[str, object], what: str, shared: Sequence[str] = ()
) -> None:
    """Raise OptionError naming each option that `factory` does not accept, or whose value
    does not fit the type and range it declares (see posbench.validation). `shared` names
    options accepted besides the factory's own (checked elsewhere), listed in the message."""
    params = inspect.signature(factory).parameters  # type: ignore[arg-type]
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [] if open_ended else [k for k in options if k not in params and k not in shared]
    if unknown:
        known = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY] + list(shared)
        accepted = ", ".join(known) if known else "no options"
        raise OptionError(
            f"Unknown option {', '.join(repr(u) for u in unknown)} for {what}; it accepts: "
            f"{accepted}."
        )
    check_declared(factory, options, what)  # type: ignore[arg-type]
