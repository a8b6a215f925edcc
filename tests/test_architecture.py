"""The package is layered: a module imports only from its own layer or the layers beneath it
(function-level imports included: an import tucked into a function to dodge a cycle is a
cycle), and no group of modules imports itself round in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "posbench"

#: Lowest first. docs/architecture.md draws the same table.
LAYERS: list[set[str]] = [
    {
        "errors",
        "validation",
        "version",
        "warning_lines",
        "suites",
        "kernels",
        "kernels.cpu",
        "kernels.flash_ops",
        "kernels.native",
        "kernels.served",
        "reaper",
        "deprecation",
        "store",
        "kernels.masks",
        "bias_kinds",
        "kernels.softmax_backward",
        "kernels.probabilities",
    },
    {
        "kernels.band_attention",
        "kernels.fused_band_attention",
        "kernels.fused_cope_attention",
        "kernels.biased_attention",
        "kernels.rel_shift_attention",
        "kernels.row_block_attention",
        "kernels.flex_bias",
        "kernels.cope_attention",
        "kernels.dispatch",
        "registry",
        "encodings.positions",
    },
    {"encodings.tables"},
    {"encodings.base", "encodings.registry", "tasks.base", "tasks.registry"},
    {"encodings", "encodings.*", "tasks", "tasks.*", "cache"},
    {"attention", "model", "plugins"},
    {
        "experiment",
        "experiment.config",
        "experiment.environment",
        "experiment.training",
        "experiment.evaluation",
        "experiment.diagnostics",
        "experiment.reachability",
        "experiment.memory",
        "experiment.outcome",
        "experiment.timing",
        "testing",
    },
    {"experiment.compute", "experiment.profiling"},
    {"experiment.executors", "experiment.ray_executor", "experiment.variants"},
    {"experiment.planner", "experiment.runner"},
    {
        "report",
        "report.stats",
        "report.summary",
        "report.overview",
        "report.literature",
        "report.calibration",
        "report.plots",
        "report.scale",
        "report.learning_rate",
        "report.published",
        "report.press",
    },
    {
        "report.html",
        "report.terminal",
        "report.progress",
        "report.bench",
        "report.inspect",
        "report.index",
    },
    {"cli", ""},  # "" is the package itself, which re-exports the public API
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, set[str]]:
    """Module name (without 'posbench.') -> the posbench modules it imports, anywhere in it."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] == "posbench"
            ):
                base = node.module.removeprefix("posbench").lstrip(".")
                targets = [f"{base}.{a.name}".lstrip(".") for a in node.names]
                targets = [t if t in paths else base for t in targets]
            elif isinstance(node, ast.Import):
                targets = [
                    a.name.removeprefix("posbench").lstrip(".")
                    for a in node.names
                    if a.name.split(".")[0] == "posbench"
                ]
            imported |= {t for t in targets if t in paths and t != name}
        graph[name] = imported
    return graph


def _layer(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if name in layer or any(p.endswith(".*") and name.startswith(p[:-1]) for p in layer):
            return index
    raise AssertionError(
        f"posbench.{name} is in no layer; add it to LAYERS and docs/architecture.md"
    )


def test_every_import_goes_to_the_same_layer_or_below() -> None:
    upward = [
        f"posbench.{m} (layer {_layer(m)}) imports posbench.{d} (layer {_layer(d)})"
        for m, deps in _modules().items()
        for d in deps
        if _layer(d) > _layer(m)
    ]
    assert not upward, "\n".join(upward)


def _reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every posbench module `start` imports, directly or through the modules it imports."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dependency in graph[todo.pop()] - seen:
            seen.add(dependency)
            todo.append(dependency)
    return seen


def test_the_store_reaches_nothing_of_posbench_but_errors_and_version() -> None:
    """Followed transitively: whatever reads a run folder (the report, inspect, export) gets no
    model, kernel or experiment code through the store."""
    assert _reached(_modules(), "store") <= {"errors", "version"}


#: The kernel modules that run attention: outside posbench.kernels, only the dispatcher's
#: choice reaches them (posbench.attention imports posbench.kernels.dispatch alone).
KERNEL_RUNNERS = {
    "kernels.band_attention",
    "kernels.biased_attention",
    "kernels.cope_attention",
    "kernels.flash_ops",
    "kernels.flex_bias",
    "kernels.fused_band_attention",
    "kernels.fused_cope_attention",
    "kernels.rel_shift_attention",
    "kernels.row_block_attention",
}


def test_only_the_dispatcher_chooses_attention_kernels() -> None:
    graph = _modules()
    outside = [
        f"posbench.{module} imports posbench.{dependency}"
        for module, dependencies in graph.items()
        if not module.startswith("kernels.")
        for dependency in dependencies
        if dependency in KERNEL_RUNNERS
    ]
    assert not outside, "\n".join(outside)


def test_the_encodings_reach_no_kernel_module() -> None:
    """Followed transitively: an encoding describes its scores (posbench.bias_kinds) and never
    names a kernel; posbench.kernels.dispatch chooses one."""
    graph = _modules()
    reached = {
        f"posbench.{module} reaches posbench.{dependency}"
        for module in graph
        if module == "encodings" or module.startswith("encodings.")
        for dependency in _reached(graph, module)
        if dependency.startswith("kernels")
    }
    assert not reached, "\n".join(sorted(reached))


def test_no_import_cycles() -> None:
    graph = _modules()
    # a package's own __init__ importing its submodules is how they register: not a cycle
    # unless a submodule imports the package back, which the graph then shows
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in graph[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, cycles


#: Modules that read files which are not the results store, each with what it reads.
READS_OTHER_FILES = {
    "plugins": "pyproject.toml's plugin folders",
    "registry": "a plugin's source file, for the digest its runs record",
    "experiment.config": "the sweep's TOML file",
    "suites": "the built-in suites' TOML files",
    "tasks.lm": "a text corpus",
    "tasks.shakespeare": "its bundled corpus, to check the checksum",
    "kernels.cpu": "/proc/self/maps (which OpenMP runtime torch loaded)",
    "kernels.native": "its C++ source and the record of its build, and the build itself",
    "experiment.timing": "/proc/stat (CPU contention)",
    "experiment.memory": "/proc/self/status (resident memory)",
    "report.published": "the papers' per-task numbers shipped in report/published/*.csv",
    "report.press": "Press et al.'s perplexity tables shipped in report/perplexity/",
    "report.index": "each report folder's report.json (the front page of reports)",
}
READERS = {"read_json", "read_csv", "read_text", "read_bytes", "load", "loads", "open"}


def test_only_the_store_reads_run_and_sweep_folders() -> None:
    """store.py is the one way into a run or sweep folder: no other module names a file of one
    or calls a file reader (json, pandas, numpy, torch.load, open), apart from the few that read
    other inputs, named above with what they read."""
    from posbench import store

    names = set(store.RUN_FILES) | {store.SWEEP_MARKER, store.RESULTS_FILE}
    found = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if module == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Div)
                and isinstance(node.right, ast.Constant)
                and node.right.value in names
            ):
                found.append(f"posbench.{module}:{node.lineno} opens {node.right.value}")
            if isinstance(node, ast.Call) and module not in READS_OTHER_FILES:
                called = (
                    node.func.attr
                    if isinstance(node.func, ast.Attribute)
                    else getattr(node.func, "id", "")
                )
                if called in READERS and not _is_string_method(node):
                    found.append(f"posbench.{module}:{node.lineno} calls {called}()")
    assert not found, "\n".join(found)


def _is_string_method(node: ast.Call) -> bool:
    """json.loads of a string a worker printed, or tomllib.loads of a flag value, reads no file."""
    func = node.func
    return isinstance(func, ast.Attribute) and func.attr == "loads"


#: What in experiment/ builds or runs a model; the report shows stored data only.
COMPUTES = {
    "model",
    "experiment.compute",
    "experiment.runner",
    "experiment.executors",
    "experiment.variants",
    "experiment.profiling",
    "experiment.training",
    "experiment.evaluation",
    "experiment.diagnostics",
}


#: The job configurations of a sweep, and who alone may make them.
JOB_CLASSES = {"RunConfig", "VariantJob", "ProfileRun", "RunJob"}
PLANNER = "experiment.planner"


def test_only_the_planner_makes_job_configurations() -> None:
    """A training run, a variant, a profile or the computation of one is constructed by the
    planner alone, so the plan `--dry-run` prints is the whole of what a run executes
    (reading a stored config back, `cls(...)` in from_dict, is not making a job)."""
    made = []
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if called in JOB_CLASSES and name != PLANNER:
                made.append(f"posbench.{name}:{node.lineno} makes a {called}")
    assert not made, "\n".join(made)


def test_the_report_imports_nothing_that_builds_models() -> None:
    graph = _modules()
    report = [m for m in graph if m == "report" or m.startswith("report.")]
    reached = {m: graph[m] & COMPUTES for m in report}
    assert not any(reached.values()), reached


def test_the_architecture_document_names_every_module() -> None:
    """docs/architecture.md's layer table names every module of the package, in its layer."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = text[text.index("```") + 3 : text.index("```", text.index("```") + 3)]
    missing = []
    for name in _modules():
        if not name or name.endswith("__init__"):
            continue
        leaf = (
            name.split(".")[-1] + ".py"
            if "." in name or (PACKAGE / f"{name}.py").exists()
            else name + "/"
        )
        if leaf not in table and f"{name.split('.')[0]}/*" not in table:
            missing.append(name)
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_no_line_is_longer_than_100_characters() -> None:
    """The length pyproject.toml gives `ruff format`; strings and comments are wrapped by hand."""
    root = PACKAGE.parent
    long = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("posbench", "tests", "benchmarks", "tasks", "encodings")
        for path in sorted((root / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > 100
    ]
    assert not long, long


def test_the_speed_benchmark_has_a_goal_for_every_builtin_encoding() -> None:
    """benchmarks/ runs outside the default suite, so a built-in added without a goal there
    would fail only when someone runs it: checked here instead."""
    import importlib.util

    from posbench.encodings import BUILTINS

    path = PACKAGE.parent / "benchmarks" / "test_speed_goals.py"
    spec = importlib.util.spec_from_file_location("speed_goals", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert set(module.LIMITS) == set(BUILTINS) - {"nope"}
