"""Plugin discovery: installed packages through entry points, and plain `.py` files in local
plugin folders (loaded by path under a private module name, so a folder called `encodings`
never shadows Python's codec package). A broken plugin gives one warning; the rest still load.

Plugins are loaded once, explicitly: by the command line before any command, by each worker
process for the folders its driver loaded, and by library users through ``load_plugins()``.
The registries themselves never go looking."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import warnings
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

from posbench.encodings import REGISTRY as ENCODINGS
from posbench.tasks import REGISTRY as TASKS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ENTRY_POINT_GROUPS = ("posbench.encodings", "posbench.tasks")

_loaded_dirs: set[Path] = set()
_loaded_entry_points = False


class PluginWarning(UserWarning):
    """A plugin that could not be loaded."""


def configured_plugin_dirs(cwd: Path | None = None) -> list[Path]:
    """Folders named in `[tool.posbench] plugin-dirs` of ./pyproject.toml (relative to it)."""
    root = Path.cwd() if cwd is None else cwd
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return []
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, OSError) as err:
        warnings.warn(f"could not read plugin-dirs from {pyproject}: {err}", PluginWarning)
        return []
    dirs = data.get("tool", {}).get("posbench", {}).get("plugin-dirs", [])
    return [(root / d).resolve() for d in dirs]


def load_plugin_file(path: Path) -> bool:
    """Import one plugin file under a private module name; warn and return False on failure."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    module_name = f"_posbench_plugin_{digest}_{path.stem}"
    if module_name in sys.modules:
        return True
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        warnings.warn(f"cannot load plugin {path}", PluginWarning)
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a plugin's bug must not stop the others
        del sys.modules[module_name]
        warnings.warn(
            f"plugin {path} failed to load ({type(err).__name__}: {err}); skipped.",
            PluginWarning,
        )
        return False
    return True


def load_plugin_dir(directory: Path) -> None:
    """Load every `*.py` file in `directory` (not recursive; files starting with `_` skipped)."""
    directory = directory.resolve()
    if directory in _loaded_dirs:
        return
    _loaded_dirs.add(directory)
    if directory.is_file():
        warnings.warn(
            f"{directory} is a file; --plugins and plugin-dirs take a folder of plugin "
            f"files (pass {directory.parent}); skipped.",
            PluginWarning,
        )
        return
    if not directory.is_dir():
        warnings.warn(f"plugin folder {directory} does not exist; skipped.", PluginWarning)
        return
    for path in sorted(directory.glob("*.py")):
        if not path.name.startswith("_"):
            load_plugin_file(path)


def load_entry_point_plugins() -> None:
    """Import every plugin declared under the `posbench.encodings` / `posbench.tasks` groups."""
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for group in ENTRY_POINT_GROUPS:
        for ep in entry_points(group=group):
            try:
                obj = ep.load()
            except Exception as err:
                warnings.warn(
                    f"plugin {ep.value!r} ({group}) failed to load "
                    f"({type(err).__name__}: {err}); skipped.",
                    PluginWarning,
                )
                continue
            _register_loaded_class(group, ep.name, obj)


def _register_loaded_class(group: str, name: str, obj: object) -> None:
    """An entry point may name a class instead of a module: register it under the point's name."""
    if not isinstance(obj, type):
        return
    registry = ENCODINGS if group == "posbench.encodings" else TASKS
    if name not in registry._entries:
        registry.register(name)(obj)


def load_plugins(extra_dirs: Iterable[Path | str] | None = None) -> None:
    """Load entry-point plugins, the configured plugin folders and any extra folders (paths or
    strings)."""
    load_entry_point_plugins()
    for directory in configured_plugin_dirs() + [Path(d) for d in extra_dirs or []]:
        load_plugin_dir(directory)


def load_worker_plugins(plugin_dirs: tuple[str, ...] | list[str]) -> None:
    """In a worker, load the plugin folders its driver loaded, quietly: any plugin that fails
    here failed in the driver too, which has warned about it once already."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginWarning)
        load_plugins([Path(p) for p in plugin_dirs])


def loaded_plugin_dirs() -> tuple[str, ...]:
    """The plugin folders loaded so far, for workers that must load the same plugins."""
    return tuple(sorted(str(d) for d in _loaded_dirs if d.is_dir()))
