"""The results store: one folder per run, files written atomically, and a tidy results.csv
rebuilt from those folders so it always agrees with them."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
import torch

from posbench.cpu import denormals_flushed
from posbench.errors import ResultsError

SWEEP_MARKER = "sweep.json"
RUN_FILES = ("config.json", "measurements.csv", "env.json", "log.txt", "model.pt", "result.json")
COLUMNS = [
    "run_id", "task", "encoding", "encoding_label", "seed", "train_len_max",
    "eval_len", "mem_len", "seq_len", "cache_len", "metric", "value", "note",
]  # fmt: skip
MEASUREMENT_COLUMNS = ["eval_len", "mem_len", "seq_len", "cache_len", "metric", "value", "note"]


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write then rename, so a kill at any moment never leaves a file that looks complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    """Read a JSON file, naming the file in the error when it is unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path} is missing; rerun the sweep to recreate it.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(
            f"{path} is corrupt ({err}); delete that run's folder and rerun the sweep to redo it."
        ) from None


def environment(device: str) -> dict[str, Any]:
    """Versions, device and machine, for reproducing a run."""
    from posbench import __version__

    env: dict[str, Any] = {
        "posbench": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "flush_denormals": denormals_flushed(),
        "device": device,
        "git_commit": git_commit(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return env


def git_commit() -> str | None:
    """The commit of the working directory's git checkout, when there is one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


class RunFolder:
    """The files of one run; result.json is written last and marks the run as finished."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def run_id(self) -> str:
        return self.path.name

    def result(self) -> dict[str, Any] | None:
        """The finished run's status record, or None when the run has not finished."""
        file = self.path / "result.json"
        return read_json(file) if file.exists() else None

    def is_finished(self) -> bool:
        """Finished means ok or diverged: rerunning would give the same outcome. Errors redo."""
        try:
            result = self.result()
        except ResultsError:
            return False
        return result is not None and result.get("status") in ("ok", "diverged")

    def clear(self) -> None:
        """Remove the completion marker first, then the other files of an earlier attempt."""
        for name in ("result.json",) + RUN_FILES:
            (self.path / name).unlink(missing_ok=True)

    def write_measurements(self, rows: Iterable[dict[str, Any]]) -> None:
        frame = pd.DataFrame(list(rows), columns=MEASUREMENT_COLUMNS)
        atomic_write_text(self.path / "measurements.csv", frame.to_csv(index=False))

    def measurements(self) -> pd.DataFrame:
        file = self.path / "measurements.csv"
        try:
            frame = pd.read_csv(file, keep_default_na=False, na_values=[""], dtype={"note": str})
        except FileNotFoundError:
            raise ResultsError(f"{file} is missing although the run is marked finished; delete {self.path} and rerun.") from None
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise ResultsError(f"{file} is corrupt ({err}); delete {self.path} and rerun.") from None
        missing = set(MEASUREMENT_COLUMNS) - set(frame.columns)
        if missing:
            raise ResultsError(f"{file} lacks the columns {sorted(missing)}; delete {self.path} and rerun.")
        frame["note"] = frame["note"].fillna("")
        return frame


def run_folders(sweep_dir: Path) -> list[RunFolder]:
    """Every run folder in a sweep folder (those with a config.json), sorted by id."""
    return [RunFolder(p.parent) for p in sorted(sweep_dir.glob("*/config.json"))]


def collect(sweep_dir: Path, problems: list[str] | None = None) -> pd.DataFrame:
    """All measurements of the finished runs as one tidy frame with the COLUMNS. With a
    `problems` list, unreadable runs are skipped and described there instead of raising."""
    frames = []
    for folder in run_folders(sweep_dir):
        try:
            result = folder.result()
            if result is None or result.get("status") != "ok":
                continue
            config = read_json(folder.path / "config.json")
            frame = folder.measurements()
        except ResultsError as err:
            if problems is None:
                raise
            problems.append(str(err))
            continue
        profile = config.get("kind") == "profile"  # latency/memory rows: no task, seed or training
        frame.insert(0, "run_id", folder.run_id)
        frame.insert(1, "task", None if profile else config["task"]["name"])
        frame.insert(2, "encoding", config["encoding"]["name"])
        frame.insert(3, "encoding_label", result.get("encoding_label", config["encoding"]["name"]))
        frame.insert(4, "seed", None if profile else config["seed"])
        frame.insert(5, "train_len_max", None if profile else result["train_len_max"])
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(frames, ignore_index=True)[COLUMNS]


def write_results_csv(sweep_dir: Path) -> Path:
    """Rebuild sweep_dir/results.csv from the run folders; returns its path."""
    path = sweep_dir / "results.csv"
    atomic_write_text(path, collect(sweep_dir).to_csv(index=False))
    return path
