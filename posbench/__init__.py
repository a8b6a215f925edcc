"""posbench: compare positional encodings for Transformer attention side by side."""

from __future__ import annotations

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
]
