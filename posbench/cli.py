"""The `posbench` command line: list, run, bench, report."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posbench.errors import PosbenchError

app = typer.Typer(
    help="Compare positional encodings for Transformer attention, side by side.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)
T = TypeVar("T")


def user_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn a PosbenchError into one line on stderr and exit code 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> T:
        try:
            return fn(*args, **kwargs)
        except PosbenchError as err:
            err_console.print(f"[bold red]error:[/] {err}", highlight=False, markup=True)
            raise typer.Exit(2) from None

    return wrapper


@app.callback()
def main_options(
    plugins: List[Path] = typer.Option(
        [], "--plugins", help="Extra folder of plugin .py files (encodings or tasks); repeatable."
    ),
) -> None:
    """Load plugin folders before any command runs."""
    from posbench.plugins import load_plugins

    load_plugins(list(plugins))


@app.command("list")
@user_errors
def list_command(
    pattern: Optional[str] = typer.Argument(None, help="Wildcard filter, e.g. 'r*'."),
) -> None:
    """List the registered encodings and tasks, plugins included, with a one-line description."""
    from posbench.encodings import REGISTRY as ENCODINGS
    from posbench.tasks import REGISTRY as TASKS

    for title, registry in (("Encodings", ENCODINGS), ("Tasks", TASKS)):
        table = Table(title=title, title_justify="left")
        table.add_column("name", style="bold cyan", no_wrap=True)
        table.add_column("description")
        for name in registry.names(pattern):
            table.add_row(Text(name), Text(registry.description(name).replace("``", "")))
        console.print(table)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="posbench")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
