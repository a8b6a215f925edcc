"""Evaluate a stored run's model with whichever posbench is on PYTHONPATH and print, as one
JSON line, the seconds `evaluate` took and its measurements: the worker of
test_evaluation_speed.py, which runs it once with today's code and once with a baseline
commit's, so both sides time the same model in fresh processes of the same kind.

    python benchmarks/evaluate_stored_run.py RUN_FOLDER THREADS
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

from posbench.experiment.compute import decoder_for
from posbench.experiment.config import RunConfig
from posbench.experiment.evaluation import evaluate
from posbench.kernels.cpu import configure_cpu, keep_freed_memory
from posbench.store import state_from_bytes
from posbench.tasks import create_task


def main(folder: Path, threads: int) -> None:
    keep_freed_memory()  # as a run's own process does (posbench's command and its workers)
    configure_cpu(threads)
    run = RunConfig.from_dict(json.loads((folder / "config.json").read_text()))
    task = create_task(run.task.name, **run.task.options)
    model = decoder_for(run.model, run.encoding, task)
    model.load_state_dict(state_from_bytes((folder / "model.pt").read_bytes()))
    model.eval()
    with torch.no_grad():  # builds or loads the C++ kernels before the clock starts
        model(task.batch(task.train_lengths[1], 2, torch.Generator().manual_seed(0)).tokens)
    started = time.perf_counter()
    rows = evaluate(model, task, run.eval)
    seconds = time.perf_counter() - started
    measurements = [
        {
            "eval_len": r.eval_len,
            "mem_len": None
            if r.mem_len is None
            else ("inf" if math.isinf(r.mem_len) else r.mem_len),
            "metric": r.metric,
            "position": getattr(r, "position", None),
            "value": None if math.isnan(r.value) else r.value,
        }
        for r in rows
    ]
    print(json.dumps({"task": run.task.display(), "seconds": seconds, "rows": measurements}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
