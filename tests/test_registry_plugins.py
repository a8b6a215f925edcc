"""The registry's errors, wildcard selection, and both plugin paths."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Annotated

import pytest

import posbench
from posbench.encodings import REGISTRY
from posbench.errors import OptionError, UnknownNameError
from posbench.plugins import PluginWarning, load_plugin_dir
from posbench.registry import check_options
from posbench.validation import OneOf, Range


def test_unknown_encoding_suggests_and_lists() -> None:
    with pytest.raises(UnknownNameError) as info:
        posbench.create_encoding("alibl", n_heads=2, d_head=4)
    message = str(info.value)
    assert "Unknown encoding 'alibl'" in message
    assert "Did you mean alibi?" in message
    for name in ("rope", "t5", "txl"):
        assert name in message


def test_unknown_option_is_named_with_accepted_ones() -> None:
    with pytest.raises(OptionError) as info:
        posbench.create_encoding("t5", n_heads=2, d_head=4, num_bucket=8)
    assert "'num_bucket'" in str(info.value)
    assert "num_buckets" in str(info.value) and "max_distance" in str(info.value)


def test_register_refuses_a_class_of_the_wrong_kind() -> None:
    """A task registered as an encoding (or a function) is refused when it registers, naming
    the base class to derive from, instead of failing later inside attention."""
    with pytest.raises(
        TypeError,
        match="not a subclass of PositionalEncoding; derive it from posbench.PositionalEncoding",
    ):
        posbench.register_encoding("not_an_encoding")(posbench.Task)
    with pytest.raises(TypeError, match="not a subclass of Task"):
        posbench.register_task("not_a_task")(lambda: None)
    assert "not_an_encoding" not in REGISTRY.names()


def test_unknown_task_and_task_option() -> None:
    with pytest.raises(UnknownNameError, match="Did you mean copy"):
        posbench.create_task("cpy")
    with pytest.raises(OptionError, match="'width'"):
        posbench.create_task("copy", width=3)


def test_select_commas_and_wildcards() -> None:
    assert REGISTRY.select("txl, t5") == ["txl", "t5"]
    assert REGISTRY.select("t5, tx*") == ["t5", "txl"]
    assert REGISTRY.select(["rope", "r*"]) == ["rope"]
    with pytest.raises(UnknownNameError, match="No encoding matches 'zz\\*'"):
        REGISTRY.select("zz*")


def test_local_plugin_is_listed() -> None:
    assert "gaussian_window" in posbench.list_encodings()
    assert "rotate" in posbench.list_tasks()


def test_broken_plugin_warns_once_and_others_load(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    (tmp_path / "good.py").write_text(
        textwrap.dedent(
            """
            from posbench import PositionalEncoding, register_encoding

            @register_encoding("plugin_test_good")
            class Good(PositionalEncoding):
                '''A plugin that loads.'''
            """
        )
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_plugin_dir(tmp_path)
    messages = [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]
    assert len(messages) == 1
    assert "broken.py" in messages[0] and "not_a_module_anywhere" in messages[0]
    assert "plugin_test_good" in posbench.list_encodings()


def test_entry_point_plugin_from_installed_package(tmp_path: Path) -> None:
    """Build a package with an entry point, install it into a folder, and list it in a fresh
    interpreter: the way a third-party encoding reaches posbench."""
    src = tmp_path / "src"
    (src / "epplug").mkdir(parents=True)
    (src / "epplug" / "__init__.py").write_text(
        textwrap.dedent(
            '''
            from posbench import PositionalEncoding, register_encoding

            @register_encoding("entry_point_bias")
            class EntryPointBias(PositionalEncoding):
                """An encoding that arrives through an entry point."""
            '''
        )
    )
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [build-system]
            requires = ["hatchling"]
            build-backend = "hatchling.build"

            [project]
            name = "epplug"
            version = "0.0.1"

            [project.entry-points."posbench.encodings"]
            entry_point_bias = "epplug"
            """
        )
    )
    site = tmp_path / "site"
    installed = _install_package(src, site)
    if not installed:
        _write_installed_metadata(src, site)
    code = "import posbench; posbench.load_plugins(); print(posbench.list_encodings())"
    env_path = str(site)
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {env_path!r}); {code}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert "entry_point_bias" in out.stdout


def _install_package(src: Path, site: Path) -> bool:
    """pip-install `src` into `site` when a build backend is at hand offline."""
    try:
        import hatchling  # noqa: F401
    except ImportError:
        return False
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(site),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    return result.returncode == 0


def _write_installed_metadata(src: Path, site: Path) -> None:
    """Install by hand what pip would: the package and its dist-info with entry_points.txt."""
    import shutil

    site.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "epplug", site / "epplug")
    info = site / "epplug-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: epplug\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[posbench.encodings]\nentry_point_bias = epplug\n")


class Declared(posbench.PositionalEncoding):
    """A plugin that declares what its options accept (at module level, as a plugin file is)."""

    def __init__(
        self,
        shape,
        *,
        strength: Annotated[float, Range(gt=0)] = 1.0,
        mode: Annotated[str, OneOf(("log", "power"))] = "log",
        untyped=3,
    ) -> None:
        super().__init__(shape)


def test_plugin_options_declare_their_types_and_ranges() -> None:
    check_options(
        Declared, {"strength": 2, "mode": "power", "untyped": "anything"}, "encoding 'declared'"
    )
    with pytest.raises(
        OptionError, match=r"encoding 'declared': option 'strength' must be a number > 0, got -1\."
    ):
        check_options(Declared, {"strength": -1}, "encoding 'declared'")
    with pytest.raises(
        OptionError, match=r"option 'mode' must be one of 'log', 'power', got 'linear'"
    ):
        check_options(Declared, {"mode": "linear"}, "encoding 'declared'")


def test_load_plugins_takes_folders_as_strings_as_readme_shows(tmp_path: Path) -> None:
    folder = tmp_path / "my_plugins"
    folder.mkdir()
    (folder / "str_folder_bias.py").write_text(
        textwrap.dedent(
            """
            from posbench import PositionalEncoding, register_encoding

            @register_encoding("str_folder_bias")
            class StrFolderBias(PositionalEncoding):
                '''A plugin loaded from a folder given as a string.'''
            """
        )
    )
    code = (
        f"import posbench; posbench.load_plugins([{str(folder)!r}]); "
        "print('str_folder_bias' in posbench.list_encodings())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"
