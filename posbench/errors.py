"""User-facing errors: each carries one sentence naming the problem and the fix."""

from __future__ import annotations


class PosbenchError(Exception):
    """A mistake in the user's input; the CLI prints it as one line and exits with code 2."""


class UnknownNameError(PosbenchError, KeyError):
    """A name that is not in a registry."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class OptionError(PosbenchError, TypeError):
    """An option an encoding or task does not accept, or a value it cannot take."""


class PositionOutOfRangeError(PosbenchError, IndexError):
    """A position beyond what an encoding can represent (e.g. past a learned table)."""


class ConfigError(PosbenchError, ValueError):
    """A malformed config file, flag value or impossible length."""


class ResultsError(PosbenchError):
    """A results folder or file that is missing, foreign or corrupt."""
