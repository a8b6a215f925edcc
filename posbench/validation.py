"""Declared option types and ranges, checked before anything runs.

An option declares what it accepts in its annotation, e.g.
``clamp_len: Annotated[int | None, Range(ge=1)] = None``. The same check serves encoding and
task constructors (built-ins and plugins alike) and the sweep's config dataclasses, so every
bad value gets one sentence naming the option, the value and what is allowed."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping, Sequence, Union

from posbench.errors import OptionError


@dataclass(frozen=True)
class Range:
    """Bounds on a number (or on each number of a list): ge/le inclusive, gt/lt exclusive; inf
    is out of range unless `infinite` allows it (a memory factor's "unbounded")."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    infinite: bool = False
    lt: float | None = None

    def holds(self, value: float) -> bool:
        return not (
            (not self.infinite and math.isinf(value))
            or (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def describe(self) -> str:
        parts = []
        if self.ge is not None:
            parts.append(f">= {_number(self.ge)}")
        if self.gt is not None:
            parts.append(f"> {_number(self.gt)}")
        if self.le is not None:
            parts.append(f"<= {_number(self.le)}")
        if self.lt is not None:
            parts.append(f"< {_number(self.lt)}")
        return " and ".join(parts)


@dataclass(frozen=True)
class OneOf:
    """A value from a fixed set."""

    choices: tuple[Any, ...]


@dataclass(frozen=True)
class Length:
    """A list with exactly `n` items."""

    n: int


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """The bare type and the Annotated metadata of an annotation."""
    if typing.get_origin(annotation) is Annotated:
        base, *meta = typing.get_args(annotation)
        return base, meta
    return annotation, []


def _union_members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


_SCALARS: dict[type, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
}


def _scalar_ok(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and not math.isnan(value)
        )
    return isinstance(value, kind)


def _is_sequence_type(kind: Any) -> bool:
    return typing.get_origin(kind) in (list, tuple, collections.abc.Sequence) or kind in (
        list,
        tuple,
    )


def _item_type(kind: Any) -> Any:
    args = [a for a in typing.get_args(kind) if a is not Ellipsis]
    return args[0] if args else Any


def describe(annotation: Any) -> str:
    """What an annotated option accepts, in words ("an integer >= 1 or none")."""
    base, meta = _unwrap(annotation)
    members = _union_members(base)
    bounds = " ".join(m.describe() for m in meta if isinstance(m, Range))
    choices = next((m.choices for m in meta if isinstance(m, OneOf)), None)
    length = next((m.n for m in meta if isinstance(m, Length)), None)
    words = []
    for member in members:
        if member is type(None):
            continue
        if choices is not None:
            words.append("one of " + ", ".join(repr(c) for c in choices))
        elif _is_sequence_type(member):
            item = _SCALARS.get(_item_type(member), "values").replace("an ", "").replace("a ", "")
            count = f"{length} " if length else ""
            words.append(f"a list of {count}{item}s" + (f" {bounds}" if bounds else ""))
        else:
            words.append(
                _SCALARS.get(member, getattr(member, "__name__", str(member)))
                + (f" {bounds}" if bounds and member in (int, float) else "")
            )
    if type(None) in members:
        words.append("none (leave it out)")
    return " or ".join(words)


def conforms(value: Any, annotation: Any) -> bool:
    """Whether `value` is of the annotated type and within its declared range."""
    base, meta = _unwrap(annotation)
    checks = [m for m in meta if isinstance(m, (Range, OneOf, Length))]
    for member in _union_members(base):
        if member is type(None):
            if value is None:
                return True
            continue
        if member is Any:
            return True
        if _is_sequence_type(member):
            if not isinstance(value, (list, tuple)):
                continue
            item = _item_type(member)
            if item is not Any and not all(_scalar_ok(v, item) for v in value):
                continue
            if all(_check_meta(v, checks) for v in value) and _check_length(value, checks):
                return True
            continue
        if isinstance(member, type) and member in _SCALARS and _scalar_ok(value, member):
            if _check_meta(value, checks):
                return True
            continue
        if isinstance(member, type) and member not in _SCALARS and isinstance(value, member):
            return True
    return False


def _check_meta(value: Any, checks: list[Any]) -> bool:
    for check in checks:
        if isinstance(check, Range) and isinstance(value, (int, float)) and not check.holds(value):
            return False
        if isinstance(check, OneOf) and value not in check.choices:
            return False
    return True


def _check_length(value: Sequence[Any], checks: list[Any]) -> bool:
    return all(len(value) == c.n for c in checks if isinstance(c, Length))


def check_value(option: str, value: Any, annotation: Any, what: str) -> None:
    """Raise OptionError in one sentence when `value` does not fit `annotation`."""
    if not conforms(value, annotation):
        raise OptionError(
            f"{what}: option {option!r} must be {describe(annotation)}, got {_shown(value)}."
        )


def _shown(value: Any) -> str:
    """A value as the user wrote it: a list for the tuples flags and TOML arrays become."""
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def declared_options(factory: Callable[..., Any]) -> dict[str, Any]:
    """The annotations of a factory's (or class's constructor's) parameters; {} when they
    cannot be resolved (a plugin whose annotations name something not importable)."""
    target = factory.__init__ if isinstance(factory, type) else factory
    try:
        return typing.get_type_hints(target, include_extras=True)
    except Exception:  # unresolvable annotations: types are then not checked
        return {}


def check_declared(factory: Callable[..., Any], options: Mapping[str, Any], what: str) -> None:
    """Check each given option against the factory's declared annotation, where it has one."""
    hints = declared_options(factory)
    for name, value in options.items():
        if name in hints:
            check_value(name, value, hints[name], what)


def check_dataclass(cls: type, data: Mapping[str, Any], what: str) -> None:
    """Check a mapping of field values against a config dataclass's annotated fields."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for f in dataclasses.fields(cls):
        if f.name in data:
            check_value(f.name, data[f.name], hints[f.name], what)
