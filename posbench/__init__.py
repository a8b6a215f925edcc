"""posbench: compare positional encodings for Transformer attention side by side."""

from __future__ import annotations

import importlib
from typing import Any

from posbench.deprecation import RENAMED_NAMES, install_moved_modules, renamed_name
from posbench.encodings import (
    AttentionShape,
    BandBias,
    DistanceTableBias,
    IndexedTable,
    KeyTableBias,
    LayerContext,
    PositionalEncoding,
    RowBlockBias,
    Scores,
    SegmentBias,
    Span,
    ToeplitzBias,
    create_encoding,
    list_encodings,
    register_encoding,
)
from posbench.errors import PosbenchError
from posbench.model import Decoder, ModelConfig, build_model, model_from_config
from posbench.plugins import load_plugins
from posbench.tasks import Task, create_task, list_tasks, register_task
from posbench.version import __version__

#: Public names whose modules are heavy (the experiment driver, the report's plotting), loaded
#: on first use so `import posbench` stays light: name -> module.
_LAZY: dict[str, str] = {
    "EncodingSpec": "posbench.experiment.config",
    "EvalConfig": "posbench.experiment.config",
    "ModelSize": "posbench.experiment.config",
    "RunConfig": "posbench.experiment.config",
    "SweepConfig": "posbench.experiment.config",
    "TaskSpec": "posbench.experiment.config",
    "TrainConfig": "posbench.experiment.config",
    "config_from_mapping": "posbench.experiment.config",
    "load_config_file": "posbench.experiment.config",
    "SweepOutcome": "posbench.experiment.outcome",
    "load_run": "posbench.experiment.runner",
    "plan_sweep": "posbench.experiment.planner",
    "run_sweep": "posbench.experiment.runner",
    "RunFolder": "posbench.store",
    "export_sweep": "posbench.store",
    "build_report": "posbench.report.html",
}

install_moved_modules()


def __getattr__(name: str) -> Any:
    """Load a name of _LAZY from its module on first use; an old name warns and gives its
    replacement."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    if name in RENAMED_NAMES:
        return renamed_name(name)
    raise AttributeError(f"module 'posbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AttentionShape",
    "BandBias",
    "Decoder",
    "DistanceTableBias",
    "IndexedTable",
    "KeyTableBias",
    "LayerContext",
    "ModelConfig",
    "PosbenchError",
    "PositionalEncoding",
    "RowBlockBias",
    "Scores",
    "SegmentBias",
    "Span",
    "Task",
    "ToeplitzBias",
    "build_model",
    "create_encoding",
    "create_task",
    "list_encodings",
    "list_tasks",
    "load_plugins",
    "model_from_config",
    "register_encoding",
    "register_task",
    *sorted(_LAZY),
]
