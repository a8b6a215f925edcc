"""The public API's contract: every published name stays importable, or warns with its new
spelling for one minor version; docs/api.md documents exactly `posbench.__all__`; and the old
spellings of renamed names (keywords, a flag, module paths) work with a DeprecationWarning."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import posbench
from posbench.report.terminal import MOVED as MOVED_OUT_OF_TERMINAL
from posbench import deprecation
from helpers import invoke
from posbench.store import collect

ROOT = Path(__file__).resolve().parents[1]

#: Every name published in `posbench.__all__` so far. A name leaves this list only when the
#: release named by deprecation.REMOVED_IN drops it; until then it must stay in __all__ or
#: have an entry in deprecation.RENAMED_NAMES.
PUBLISHED = {
    "AttentionShape", "BandBias", "Decoder", "DistanceTableBias", "IndexedTable",
    "KeyTableBias", "LayerContext", "ModelConfig", "PosbenchError", "PositionalEncoding",
    "RowBlockBias", "Scores", "Span", "Task", "ToeplitzBias", "build_model", "create_encoding",
    "create_task", "list_encodings", "list_tasks", "load_plugins", "model_from_config",
    "register_encoding", "register_task",
    "EncodingSpec", "EvalConfig", "ModelSize", "RunConfig", "SweepConfig", "TaskSpec",
    "TrainConfig", "config_from_mapping", "load_config_file", "SweepOutcome", "load_run",
    "plan_sweep", "run_sweep", "RunFolder", "export_sweep", "build_report",
}  # fmt: skip

#: Names of the documented modules, as README and docs/plugins.md import them.
DOCUMENTED_MODULE_NAMES = {
    "posbench.testing": {"run_conformance", "run_task_conformance"},
    "posbench.validation": {"Range"},
}


def test_every_published_name_is_public_or_deprecated() -> None:
    missing = PUBLISHED - set(posbench.__all__) - set(deprecation.RENAMED_NAMES)
    assert not missing, f"published names gone without a deprecation: {sorted(missing)}"
    for name in posbench.__all__:
        assert getattr(posbench, name) is not None, name


def test_documented_module_names_import() -> None:
    import importlib

    for module, names in DOCUMENTED_MODULE_NAMES.items():
        loaded = importlib.import_module(module)
        assert names <= set(dir(loaded)), (module, names - set(dir(loaded)))


def test_docs_api_documents_exactly_the_public_names() -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z_]+)`", text, flags=re.M))
    assert documented == set(posbench.__all__), documented ^ set(posbench.__all__)


def test_star_import_gives_every_public_name() -> None:
    namespace: dict[str, object] = {}
    exec("from posbench import *", namespace)
    assert set(posbench.__all__) <= set(namespace)


def test_a_renamed_top_level_name_warns_and_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(deprecation.RENAMED_NAMES, "make_model", "posbench.model:build_model")
    with pytest.warns(
        DeprecationWarning, match=r"posbench\.make_model .* posbench\.model\.build_model"
    ):
        assert posbench.make_model is posbench.build_model  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        posbench.not_a_name  # type: ignore[attr-defined]


def test_build_model_takes_the_old_encoding_keyword() -> None:
    with pytest.warns(DeprecationWarning, match=r"build_model\(encoding_name=\.\.\.\)"):
        model = posbench.build_model(encoding="alibi", vocab_size=8)
    assert model.config.encoding_name == "alibi"
    with pytest.raises(TypeError, match="pass encoding_name= only"):
        posbench.build_model(encoding="alibi", encoding_name="t5")


def test_new_cache_none_keeps_every_position_with_a_warning() -> None:
    model = posbench.build_model("nope", vocab_size=8)
    with pytest.warns(DeprecationWarning, match=r"new_cache\(math\.inf\)"):
        cache = model.new_cache(None)  # type: ignore[arg-type]
    assert cache.mem_len == math.inf


def test_bench_cache_lens_flag_is_mem_lens_with_a_warning(tmp_path: Path) -> None:
    args = (
        "bench", "--encodings", "alibi", "--seq-lens", "16", "--window-lens", "16",
        "--no-memory", "--min-run-time", "0.001", "--threads", "1", "--batch-size", "2",
    )  # fmt: skip
    with pytest.warns(DeprecationWarning, match="use --mem-lens instead"):
        result = invoke(*args, "--cache-lens", "0,8", "--out", str(tmp_path / "old"))
    assert result.exit_code == 0, result.output
    mem_lens = collect(tmp_path / "old")["mem_len"].dropna().unique()
    assert {0, 8} <= set(mem_lens)
    both = invoke(*args, "--cache-lens", "0", "--mem-lens", "0", "--out", str(tmp_path / "both"))
    assert both.exit_code == 2 and "give --mem-lens only" in both.output


def test_a_script_against_the_old_api_runs_and_hears_each_new_spelling(tmp_path: Path) -> None:
    """Last release's documented calls, run as a user's script (__main__, default filters)."""
    script = tmp_path / "old_script.py"
    script.write_text(
        textwrap.dedent(
            """
            import posbench
            from posbench.runner import run_sweep
            import posbench.results as results
            from posbench.stats import mean_interval
            model = posbench.build_model(encoding="alibi", vocab_size=16)
            cache = model.new_cache(None)
            assert run_sweep is posbench.run_sweep and results.RunFolder is posbench.RunFolder
            print("ran", model.config.encoding_name, cache.mem_len)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "ran alibi inf" in done.stdout
    for new in (
        "posbench.experiment.runner",
        "posbench.store",
        "posbench.report.stats",
        "build_model(encoding_name=...)",
        "new_cache(math.inf)",
    ):
        assert f"use {new} instead" in done.stderr, done.stderr
    assert done.stderr.count(f"{script}:") == 5, done.stderr  # each names the user's own line


def test_every_moved_module_path_imports_its_new_module() -> None:
    """Each old path, imported in a fresh process (one for all), warns with its new spelling and
    is the new module itself."""
    code = textwrap.dedent(
        """
        import importlib, json, warnings
        from posbench.deprecation import MOVED_MODULES
        seen = {}
        for old, new in sorted(MOVED_MODULES.items()):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            seen[old] = [
                module is importlib.import_module(new),
                [str(w.message) for w in caught if w.category is DeprecationWarning],
            ]
        print(json.dumps(seen))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert set(seen) == set(deprecation.MOVED_MODULES)
    for old, (same, messages) in seen.items():
        new = deprecation.MOVED_MODULES[old]
        assert same, old
        assert any(f"use {new} instead" in m for m in messages), (old, messages)


@pytest.mark.parametrize("name", sorted(MOVED_OUT_OF_TERMINAL))
def test_a_name_moved_out_of_the_terminal_module_warns_and_is_the_same_object(name: str) -> None:
    import importlib

    import posbench.report.terminal as terminal

    new = terminal.MOVED[name]
    with pytest.warns(DeprecationWarning, match=f"use {new}.{name} instead"):
        old = getattr(terminal, name)
    assert old is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        terminal.no_such_name  # noqa: B018


def test_changelog_records_the_old_spellings() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    for old in ("encoding=", "--cache-lens", "new_cache(None)", "posbench.runner"):
        assert old in text, old
