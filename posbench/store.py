"""The results store: one folder per run, files written atomically, and a tidy results.csv
rebuilt from those folders so it always agrees with them."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import re
import signal
import tarfile
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import pandas as pd
import torch

from posbench.errors import ResultsError
from posbench.version import __version__

SWEEP_MARKER = "sweep.json"
DAMAGED_DIR = "damaged"  # damaged runs are moved here, never deleted
#: The advice for a damaged run, whichever command found it: only `posbench run` redoes runs.
REDO_DAMAGED = (
    "`posbench run` on this sweep (the same --out) sets the damaged run aside and redoes it"
)
LOCK_FILE = ".lock"
RESULTS_FILE = "results.csv"
#: A latency/memory profile's folder is this prefix and the hash of its config.
PROFILE_PREFIX = "profile-"
# ---- the files of one run folder ----
CONFIG_FILE, ENV_FILE, LOG_FILE, RESULT_FILE = "config.json", "env.json", "log.txt", "result.json"
MEASUREMENTS_FILE, MODEL_FILE = "measurements.csv", "model.pt"
#: The key of an exported run's result.json that keeps the checksum of the weights it left out.
MODEL_NOT_KEPT = "model_not_kept"
#: Artefacts a run stores so that reports and `posbench inspect` need no model: the bias picture
#: (one head's (L, L) bias, see diagnostics.positional_bias), the score-term probes, attention
#: mass by key distance, which indexed rows training reached, accuracy by answer position.
BIAS_FILE, TERMS_FILE, DISTANCE_FILE = "bias.npy", "terms.csv", "attention_distance.csv"
REACHABILITY_FILE, ANSWER_POSITIONS_FILE = "reachability.csv", "answer_positions.csv"
RUN_FILES = (
    CONFIG_FILE,
    MEASUREMENTS_FILE,
    ENV_FILE,
    LOG_FILE,
    MODEL_FILE,
    BIAS_FILE,
    TERMS_FILE,
    DISTANCE_FILE,
    REACHABILITY_FILE,
    ANSWER_POSITIONS_FILE,
    RESULT_FILE,
)
#: The tidy results. task: what results call the run's task (its label, e.g. copy-fixed);
#: task_name: the registered task it runs (copy), so one task run under two protocols is known
#: as one. model: the run's model size (ModelSize.tag, e.g. "d64 L4 H4"); eval_len:
#: the task length evaluated, in the task's unit (string symbols,
#: or tokens for lm); position: a loss-by-position row's token position; mem_len: the memory
#: length, positions kept in the cache (blank: no cache, the whole sequence at once; inf: an
#: unbounded cache); seq_len: a profile's sequence length in tokens.
#: The loss-by-position metrics as posbench 0.1 stored them (positions in eval_len): a frozen
#: literal, so the migration reads 0.1 stores whatever later versions call their metrics.
POSITION_METRICS_0_1 = ("lm_loss", "lm_loss_window", "lm_penalty")
COLUMNS = [
    "run_id", "variant_of", "task", "task_name", "encoding", "encoding_label", "seed", "model",
    "train_len_max", "eval_len", "position", "mem_len", "seq_len", "metric", "value", "note",
]  # fmt: skip
MEASUREMENT_COLUMNS = ["eval_len", "position", "mem_len", "seq_len", "metric", "value", "note"]


def describe_os_error(
    err: OSError, path: Path | str, action: str = "write", flag: str = "--out"
) -> str:
    """One sentence for a failed read or write, naming the path and the fix (`flag`: the
    command's option for its output folder)."""
    where = getattr(err, "filename", None) or path
    if err.errno == errno.ENOSPC or err.errno == errno.EDQUOT:
        return (
            f"No space left on the device to {action} {where}; free some disk space (or choose "
            f"another {flag}) and run the same command again: finished runs are kept."
        )
    if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            f"Cannot {action} {where} ({err.strerror}); make that folder writable or choose "
            f"another {flag}: finished runs are kept."
        )
    return (
        f"Could not {action} {where} ({err.strerror or err}); "
        "check that path and run the same command again."
    )


def atomic_write_bytes(path: Path, data: bytes, flag: str = "--out") -> None:
    """Write then rename, so a kill at any moment never leaves a file that looks complete.
    The temporary file is created with mode 0666, so the process umask applies as usual.
    A failing write (disk full, read-only folder) raises ResultsError in one sentence whose
    fix names `flag`, the command's option for its output folder."""
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as err:
        raise ResultsError(describe_os_error(err, path, flag=flag)) from None


#: The temporary file atomic_write_bytes writes before renaming it into place.
TEMPORARY_FILE = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")


def sweep_temporary_files(folder: Path) -> None:
    """Remove the temporary files a killed write left in `folder`, in its run folders and in a
    figures/ folder (only ever called while posbench holds `folder`: no write of its own to
    those is in flight)."""
    folders = [folder, folder / "figures", *(run.path for run in run_folders(folder))]
    for path in (p for f in folders for p in f.glob(".*.tmp")):
        if TEMPORARY_FILE.fullmatch(path.name):
            path.unlink(missing_ok=True)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block is done, then deliver them, so a set of files
    written in the block is never left half old, half new. Only the main thread handles
    signals; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, frame: held.append(signum))
        for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            signal.raise_signal(held[0])


def atomic_write_files(files: dict[Path, bytes], flag: str = "--out") -> None:
    """Write several files, each atomically, with interrupts held until all are in place: a
    reader finds the whole old set or the whole new one."""
    with interrupts_deferred():
        for path, data in files.items():
            atomic_write_bytes(path, data, flag)


def atomic_write_text(path: Path, text: str, flag: str = "--out") -> None:
    atomic_write_bytes(path, text.encode("utf-8"), flag)


def atomic_write_json(path: Path, data: Any, flag: str = "--out") -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", flag)


def read_json(path: Path) -> Any:
    """Read a JSON file, naming the file in the error when it is unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path} is missing; rerun the sweep to recreate it.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path} is corrupt ({err}); {REDO_DAMAGED}.") from None
    except OSError as err:
        raise ResultsError(describe_os_error(err, path, "read")) from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def config_id(data: dict[str, Any]) -> str:
    """The 12-hex-digit id of a stored run config, the name of its folder: a hash of everything
    in it that changes the numbers, the encoding's and the task's display labels left out, and
    the `derived` options (a variant's, filled from the base run the config names)."""
    data = dict(
        {k: v for k, v in data.items() if k != "derived"},
        **{
            part: {k: v for k, v in data[part].items() if k != "label"}
            for part in ("encoding", "task")
            if isinstance(data.get(part), Mapping)
        },
    )
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def run_label(task: str | None, encoding: str, seed: int | None = None) -> str:
    """The one name of a run shown to people: ``task / encoding / seed N`` for a trained run
    (task and encoding by their labels), ``profile / encoding`` for a latency/memory profile
    (task None)."""
    if task is None:
        return f"profile / {encoding}"
    return f"{task} / {encoding} / seed {seed if seed is not None else '-'}"


def model_tag(model: Mapping[str, Any]) -> str:
    """A model size in a few characters, as results' `model` column and labels show it:
    ``d64 L4 H4`` (d_model, layers, heads; `` F256`` when d_ff is set, `` tied`` when the head
    reads the token embedding), from a stored config's `model` section."""
    d_ff = model.get("d_ff")
    ff = f" F{d_ff}" if d_ff is not None else ""
    tied = " tied" if model.get("tie_embeddings") else ""
    return f"d{model['d_model']} L{model['n_layers']} H{model['n_heads']}{ff}{tied}"


class RunFolder:
    """The files of one run, and the only way to read or write them. result.json is written
    last and marks the run as finished; it records a SHA-256 and a row count of every data
    file, so a damaged run is never used."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        """Whether the folder holds a run (its config.json), finished or not."""
        return (self.path / CONFIG_FILE).is_file()

    def result(self) -> dict[str, Any] | None:
        """The run's status record, or None when the run has not finished."""
        file = self.path / RESULT_FILE
        if not file.exists():
            return None
        result = read_json(file)
        if not isinstance(result, dict):
            raise ResultsError(
                f"{file} is not a posbench result; {REDO_DAMAGED}."
            )
        return result

    def config(self) -> dict[str, Any]:
        """The stored configuration the run was computed from."""
        return read_json(self.path / CONFIG_FILE)

    def env(self) -> dict[str, Any] | None:
        """The versions and machine the run was computed on (None when not recorded)."""
        file = self.path / ENV_FILE
        return read_json(file) if file.exists() else None

    def is_profile(self) -> bool:
        """Whether the run is a latency/memory profile (no task, seed or training)."""
        return self.config().get("kind") == "profile"

    def label(self) -> str:
        """How the stored run is named to people (see run_label)."""
        config, result = self.config(), self.result() or {}
        encoding = result.get("encoding_label") or config.get("encoding", {}).get("name", "?")
        if config.get("kind") == "profile":
            return run_label(None, encoding)
        return run_label(task_label(config, result), encoding, config.get("seed"))

    def model_bytes(self) -> bytes:
        """The trained model's state dict as torch saved it."""
        file = self.path / MODEL_FILE
        if not self.model_kept():
            raise ResultsError(
                f"{self.path} was exported without its trained weights; run its sweep with "
                "--force where the weights are wanted: it trains the run again."
            )
        try:
            return file.read_bytes()
        except FileNotFoundError:
            raise ResultsError(
                f"{file} is missing; run the same `posbench run` command again: it redoes that run."
            ) from None
        except OSError as err:
            raise ResultsError(describe_os_error(err, file, "read")) from None

    def model_digest(self) -> str | None:
        """The SHA-256 of the run's trained weights as its result records them, kept or exported
        without them (None: none recorded)."""
        try:
            result = self.result() or {}
        except ResultsError:
            return None
        record = result.get(MODEL_NOT_KEPT) or (result.get("files") or {}).get(MODEL_FILE)
        digest = record.get("sha256") if isinstance(record, dict) else None
        return digest if isinstance(digest, str) else None

    def model_kept(self) -> bool:
        """False for a run exported without its weights (see export_sweep)."""
        try:
            return MODEL_NOT_KEPT not in (self.result() or {})
        except ResultsError:
            return True

    def model_state(self) -> dict[str, torch.Tensor]:
        """The trained model's parameters and buffers (on the CPU)."""
        file = self.path / MODEL_FILE
        data = self.model_bytes()
        try:
            return state_from_bytes(data)
        except Exception as err:
            raise ResultsError(
                f"{file} is corrupt ({err}); run the same `posbench run` command again: "
                "it redoes that run."
            ) from None

    def table(self, name: str) -> pd.DataFrame | None:
        """A CSV artefact the run stored (None when it stored none of that name)."""
        file = self.path / name
        if not file.exists():
            return None
        try:
            return pd.read_csv(file, keep_default_na=False, na_values=[""])
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise ResultsError(
                f"{file} is corrupt ({err}); run the same command with --force to redo the run."
            ) from None

    def artifact_bytes(self, name: str) -> bytes | None:
        """A file the run stored, byte for byte (None when it stored none of that name)."""
        file = self.path / name
        try:
            return file.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise ResultsError(describe_os_error(err, file, "read")) from None

    def array(self, name: str) -> np.ndarray | None:
        """A .npy artefact the run stored (None when it stored none of that name)."""
        file = self.path / name
        if not file.exists():
            return None
        try:
            return np.load(file, allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:
            raise ResultsError(
                f"{file} is corrupt ({err}); run the same command with --force to redo the run."
            ) from None

    def damage(self) -> str | None:
        """Why a run that has a result.json cannot be trusted, or None when it is whole or has
        no result yet: a record of the wrong shape, a data file missing, cut short or changed
        since it was written, or a config.json missing, unreadable or changed (its content no
        longer hashes to the run's id, which is the folder's name)."""
        try:
            result = self.result()
        except ResultsError as err:
            return str(err)
        if result is None:
            return None
        record_file = self.path / RESULT_FILE
        files = result.get("files", {}) if isinstance(result, dict) else None
        if (
            not isinstance(result, dict)
            or not isinstance(result.get("status"), str)
            or not (
                isinstance(files, dict)
                and all(
                    isinstance(f, dict) and isinstance(f.get("sha256"), str) for f in files.values()
                )
            )
        ):
            return (
                f"{record_file} is not a posbench result (its status or file checksums are "
                "malformed)"
            )
        for name, record in files.items():
            file = self.path / name
            if not file.is_file():
                return f"{file} is missing"
            if sha256_of(file) != record["sha256"]:
                return (
                    f"{file} was changed or cut short after the run wrote it (its SHA-256 differs)"
                )
        if result["status"] == "ok" and "files" not in result:
            return f"{record_file} records no file checksums, so its files cannot be checked"
        return self._config_damage()

    def _config_damage(self) -> str | None:
        """Why config.json does not describe this run (None when it does)."""
        file = self.path / CONFIG_FILE
        if not file.is_file():
            return f"{file} is missing"
        try:
            config = self.config()
        except ResultsError as err:
            return str(err)
        if not isinstance(config, dict) or config_id(config) != self.run_id.removeprefix(
            PROFILE_PREFIX
        ):
            return (
                f"{file} was changed after the run wrote it (it no longer hashes to the run id "
                f"{self.run_id})"
            )
        return None

    def is_finished(self) -> bool:
        """Finished means ok and whole: failed, diverged and damaged runs are redone."""
        try:
            result = self.result()
        except ResultsError:
            return False
        return result is not None and result.get("status") == "ok" and self.damage() is None

    def clear(self) -> None:
        """Remove the completion marker first, then the other files of an earlier attempt."""
        try:
            for name in (RESULT_FILE,) + RUN_FILES:
                (self.path / name).unlink(missing_ok=True)
        except OSError as err:
            raise ResultsError(describe_os_error(err, self.path, "clear the run folder")) from None

    def set_aside(self) -> Path:
        """Move a damaged run to <sweep>/damaged/<id>-<time>/ (kept for inspection, never read)."""
        target = self.path.parent / DAMAGED_DIR / f"{self.run_id}-{time.strftime('%Y%m%dT%H%M%S')}"
        try:
            target.parent.mkdir(exist_ok=True)
            os.replace(self.path, target)
        except OSError as err:
            raise ResultsError(
                describe_os_error(err, self.path, "move aside the damaged run")
            ) from None
        return target

    def store(
        self,
        config: dict[str, Any],
        env: dict[str, Any],
        log: list[str],
        result: dict[str, Any],
        measurements: list[dict[str, Any]] | None = None,
        model_state: bytes | None = None,
        artifacts: dict[str, bytes] | None = None,
    ) -> None:
        """Write a run's files atomically, result.json last with the checksums of the others and,
        where the result has a time split, the seconds storing took."""
        started = time.perf_counter()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ResultsError(describe_os_error(err, self.path, "create")) from None
        self.clear()
        atomic_write_json(self.path / CONFIG_FILE, config)
        if env:
            atomic_write_json(self.path / ENV_FILE, env)
        atomic_write_text(self.path / LOG_FILE, "\n".join(log) + "\n")
        files: dict[str, dict[str, Any]] = {}
        if measurements is not None:
            frame = pd.DataFrame(list(measurements), columns=MEASUREMENT_COLUMNS)
            data = frame.to_csv(index=False).encode("utf-8")
            atomic_write_bytes(self.path / MEASUREMENTS_FILE, data)
            files[MEASUREMENTS_FILE] = {
                "sha256": hashlib.sha256(data).hexdigest(),
                "rows": len(frame),
            }
        if model_state is not None:
            atomic_write_bytes(self.path / MODEL_FILE, model_state)
            files[MODEL_FILE] = {"sha256": hashlib.sha256(model_state).hexdigest()}
        for name, data in (artifacts or {}).items():
            atomic_write_bytes(self.path / name, data)
            files[name] = {"sha256": hashlib.sha256(data).hexdigest()}
        if "time_split" in result:
            storing = round(time.perf_counter() - started, 3)
            result = dict(result, time_split=dict(result["time_split"], storing=storing))
        atomic_write_json(self.path / RESULT_FILE, dict(result, files=files))

    def measurements(self) -> pd.DataFrame:
        file = self.path / MEASUREMENTS_FILE
        try:
            frame = pd.read_csv(file, keep_default_na=False, na_values=[""], dtype={"note": str})
        except FileNotFoundError:
            raise ResultsError(
                f"{file} is missing although the run is marked finished; {REDO_DAMAGED}."
            ) from None
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
            raise ResultsError(
                f"{file} is corrupt ({err}); {REDO_DAMAGED}."
            ) from None
        frame = current_columns(frame)
        missing = set(MEASUREMENT_COLUMNS) - set(frame.columns)
        if missing:
            raise ResultsError(
                f"{file} lacks the columns {sorted(missing)}; run the same command again to redo "
                "it."
            )
        frame["note"] = frame["note"].fillna("")
        return frame


def current_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Measurements (or results) in today's columns. Tables of posbench 0.1 name a
    profile's memory length cache_len and keep a loss-by-position row's position in eval_len;
    they are read into mem_len and position (eval_len becomes the length evaluated, the
    run's longest), so an old store loads as it is: its files, and their checksums, are untouched.
    Results written before the model-size axis get a blank `model` column, and results written
    before `task_name` take it from `task`. Tables in today's columns pass unchanged."""
    frame = frame.copy()
    if "cache_len" in frame:
        frame["mem_len"] = (
            frame["mem_len"].astype(float).fillna(frame.pop("cache_len").astype(float))
        )
    if "position" not in frame:
        by_position = frame["metric"].isin(POSITION_METRICS_0_1)
        frame.insert(
            frame.columns.get_loc("eval_len") + 1, "position", frame["eval_len"].where(by_position)
        )
        if by_position.any():  # eval_len: the run's longest full-context length
            lengths = frame[~by_position & frame["mem_len"].isna()]
            if "run_id" in frame:
                evaluated = frame.loc[by_position, "run_id"].map(
                    lengths.groupby("run_id")["eval_len"].max()
                )
            else:
                evaluated = lengths["eval_len"].max()
            frame.loc[by_position, "eval_len"] = evaluated
    if "model" not in frame and "seed" in frame:  # results written before the size axis
        frame.insert(frame.columns.get_loc("seed") + 1, "model", None)
    if "task_name" not in frame and "task" in frame:  # results written before task_name
        frame.insert(frame.columns.get_loc("task") + 1, "task_name", frame["task"])
    return frame


def state_to_bytes(model: torch.nn.Module) -> bytes:
    """A model's parameters and buffers as model.pt stores them (torch's format, on the CPU)."""
    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
    return buffer.getvalue()


def state_from_bytes(data: bytes) -> dict[str, torch.Tensor]:
    """The parameters and buffers `state_to_bytes` wrote, on the CPU (tensors only: no pickled
    code)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def run_folders(sweep_dir: Path) -> list[RunFolder]:
    """Every run folder in a sweep folder (those with a config.json or a result.json, so a run
    whose config.json was deleted is still seen, and found damaged), sorted by id."""
    found = {p.parent for name in (CONFIG_FILE, RESULT_FILE) for p in sweep_dir.glob(f"*/{name}")}
    return [RunFolder(path) for path in sorted(found) if path.parent.name != DAMAGED_DIR]


# ---- the sweep folder: which runs belong to it, and who is writing it ------------------------
def check_sweep_dir(out_dir: Path, flag: str = "--out") -> None:
    """Refuse a file, or a folder that holds files posbench did not write, as a sweep folder;
    writes nothing. A folder of run folders whose sweep.json was lost is still a sweep: the
    runner writes its record again. `flag` names the folder in the command's own terms."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ResultsError(f"{flag} {out_dir} is a file, not a folder; choose another {flag}.")
    try:
        if (
            out_dir.is_dir()
            and not (out_dir / SWEEP_MARKER).exists()
            and any(p.name != LOCK_FILE for p in out_dir.iterdir())
            and not run_folders(out_dir)
        ):
            raise ResultsError(
                f"{out_dir} already holds files that are not a posbench sweep; choose another "
                f"{flag}."
            )
    except OSError as err:
        raise ResultsError(describe_os_error(err, out_dir, "read", flag)) from None


def prepare_sweep_dir(out_dir: Path, flag: str = "--out") -> None:
    """Check the sweep folder (check_sweep_dir) and create it."""
    check_sweep_dir(out_dir, flag)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ResultsError(describe_os_error(err, out_dir, "create", flag)) from None


def check_overwritable(path: Path, signature: str, flag: str) -> None:
    """Refuse to overwrite `path` unless posbench wrote it (its start holds `signature`), so
    an output folder given by mistake never loses a file of the user's."""
    if not path.exists():
        return
    try:
        with open(path, "rb") as handle:
            start = handle.read(4096).decode("utf-8", errors="replace")
    except OSError as err:
        raise ResultsError(describe_os_error(err, path, "read")) from None
    if signature not in start:
        raise ResultsError(
            f"{path} exists and was not written by posbench; move it away or choose another {flag}."
        )


def check_report_folder(out_dir: Path, sweep_dir: Path) -> None:
    """Refuse to write a report into another sweep's folder, where its results.csv would
    replace that sweep's own."""
    out_dir, sweep_dir = Path(out_dir), Path(sweep_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ResultsError(
            f"{out_dir} is a file, and -o takes the folder a report is written into "
            "(report.html, results.csv, figures/); choose a folder's path."
        )
    if not out_dir.is_dir() or out_dir.resolve() == sweep_dir.resolve():
        return
    if (out_dir / SWEEP_MARKER).exists() or run_folders(out_dir):
        raise ResultsError(
            f"{out_dir} is another sweep's folder, and a report there would replace its "
            f"results.csv with those of {sweep_dir}; choose another -o (a new folder, or "
            f"{sweep_dir / 'report'})."
        )


def write_sweep_marker(out_dir: Path, config: dict[str, Any], members: dict[str, str]) -> None:
    """Record the sweep's configuration and its runs (id -> label). Only these runs make the
    sweep's results and report; runs of earlier configurations stay in the folder, apart."""
    atomic_write_json(
        out_dir / SWEEP_MARKER, {"posbench_sweep": 2, "config": config, "runs": members}
    )


def sweep_marker(sweep_dir: Path) -> dict[str, Any]:
    """The sweep's record ({} when the folder has none)."""
    marker = sweep_dir / SWEEP_MARKER
    return read_json(marker) if marker.exists() else {}


def sweep_members(sweep_dir: Path) -> dict[str, str] | None:
    """Run id -> label of the runs the sweep's current configuration asks for; None when the
    folder has no sweep record (then every run folder counts)."""
    marker = sweep_marker(sweep_dir)
    return dict(marker.get("runs", {})) if marker else None


@contextmanager
def sweep_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on the sweep folder while writing it, so two commands on the
    same --out never redo the same runs side by side. The lock dies with its process."""
    path = out_dir / LOCK_FILE
    try:
        handle = open(path, "a+")
    except OSError as err:
        raise ResultsError(describe_os_error(err, path, "lock")) from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise ResultsError(
                f"{out_dir} is being written by another posbench command ({holder}); wait for it "
                "to finish "
                "or choose another --out."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the lock


@dataclass
class _CollectedRun:
    """One stored run as collect() read it, with the stamp of its result.json then."""

    stamp: tuple[int, int, int]  # result.json's inode, size and modification time
    frame: pd.DataFrame | None  # its rows with the run's columns; None: finished, not ok
    labels: tuple | None = None  # (task, encoding label, model): the configuration check's key
    seedless: str | None = None  # the run's configuration without its seed


class RunCache:
    """The runs a sweep has read and checked already, each kept while its result.json stays the
    one that was read: rebuilding results.csv after every run then reads and hashes each run
    once per sweep, not once per rebuild (which grew with the square of the runs)."""

    def __init__(self) -> None:
        self.runs: dict[str, _CollectedRun] = {}


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _collect_run(folder: RunFolder, stamp: tuple[int, int, int]) -> _CollectedRun | None:
    """Read and check one run (None: not finished); a damaged one raises ResultsError."""
    result = folder.result()
    if result is None:
        return None
    damage = folder.damage()
    if damage:
        raise ResultsError(f"{damage}; {REDO_DAMAGED}.")
    if result["status"] != "ok":
        return _CollectedRun(stamp, None)
    config = folder.config()
    frame = folder.measurements()
    profile = config.get("kind") == "profile"  # latency/memory rows: no task, seed or training
    task = None if profile else task_label(config, result)
    encoding_label = result.get("encoding_label", config["encoding"]["name"])
    model = None if profile else model_tag(config["model"])
    frame.insert(0, "run_id", folder.run_id)
    frame.insert(1, "variant_of", result.get("variant_of"))  # the run that trained the model
    frame.insert(2, "task", task)
    frame.insert(3, "task_name", None if profile else config["task"]["name"])
    frame.insert(4, "encoding", config["encoding"]["name"])
    frame.insert(5, "encoding_label", encoding_label)
    frame.insert(6, "seed", None if profile else config["seed"])
    frame.insert(7, "model", model)
    frame.insert(8, "train_len_max", None if profile else result["train_len_max"])
    collected = _CollectedRun(stamp, frame)
    if not profile and not result.get("variant_of"):  # a variant's config names its run
        collected.labels = (task, encoding_label, model)
        collected.seedless = config_id({k: v for k, v in config.items() if k != "seed"})
    return collected


def collect(
    sweep_dir: Path,
    problems: list[str] | None = None,
    run_ids: Iterable[str] | None = None,
    cache: RunCache | None = None,
) -> pd.DataFrame:
    """All measurements of the sweep's finished runs as one tidy frame with the COLUMNS: the
    runs its record names (or `run_ids`), every run folder when it has none. With a
    `problems` list, damaged or unreadable runs are skipped and described there instead of
    raising. With a `cache`, a run read before whose result.json is unchanged is not read
    again."""
    wanted = set(run_ids) if run_ids is not None else sweep_members(sweep_dir)
    frames = []
    # (task, encoding label, model) -> run id -> the run's configuration without its seed
    configurations: dict[tuple, dict[str, str]] = {}
    for folder in run_folders(sweep_dir):
        if wanted is not None and folder.run_id not in wanted:
            continue
        stamp = _stamp(folder.path / RESULT_FILE)
        if stamp is None:
            continue
        collected = cache.runs.get(folder.run_id) if cache is not None else None
        if collected is None or collected.stamp != stamp:
            try:
                collected = _collect_run(folder, stamp)
            except ResultsError as err:
                if problems is None:
                    raise
                problems.append(str(err))
                continue
            if collected is None:
                continue
            if cache is not None:
                cache.runs[folder.run_id] = collected
        if collected.frame is None:
            continue
        frames.append(collected.frame)
        if collected.labels is not None and collected.seedless is not None:
            configurations.setdefault(collected.labels, {})[folder.run_id] = collected.seedless
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    table = pd.concat(frames, ignore_index=True)[COLUMNS]
    return _configurations_apart(table, configurations)


def _configurations_apart(
    table: pd.DataFrame, configurations: dict[tuple, dict[str, str]]
) -> pd.DataFrame:
    """Runs that share a task, encoding label and model but not their configuration (seed
    aside), as a folder without its sweep record can hold after two `posbench run`s with other
    settings, get the configuration's id in their encoding label ("t5 [config 3fa2c1]"), so no
    table ever averages two configurations."""
    for ids in configurations.values():
        if len(set(ids.values())) < 2:
            continue
        for run_id, key in ids.items():
            rows = table["run_id"] == run_id
            table.loc[rows, "encoding_label"] = table.loc[rows, "encoding_label"] + (
                f" [config {key[:6]}]"
            )
    return table


def training_runs(sweep_dir: Path) -> dict[str, str]:
    """Run id -> label of the finished training runs in a sweep folder (profiles left out)."""
    runs = {}
    for folder in run_folders(sweep_dir):
        try:
            if folder.is_finished() and not folder.is_profile():
                runs[folder.run_id] = folder.label()
        except ResultsError:
            continue
    return runs


def other_runs(sweep_dir: Path) -> list[dict[str, str]]:
    """Finished runs in the folder that the sweep's current configuration does not ask for
    (an earlier --steps, say): kept, listed apart, never pooled into the results."""
    members = sweep_members(sweep_dir)
    if members is None:
        return []
    others = []
    for folder in run_folders(sweep_dir):
        if folder.run_id in members:
            continue
        try:
            if (folder.result() or {}).get("status") == "ok":
                others.append({"run_id": folder.run_id, "label": folder.label()})
        except ResultsError:
            continue
    return others


def task_label(config: dict[str, Any], result: dict[str, Any]) -> str:
    """What results call a stored run's task: its label (as the run recorded it), else its name."""
    task = config.get("task", {})
    return result.get("task_label") or task.get("label") or task.get("name", "?")


#: A sweep folder kept as one xz-compressed tar file (how a published suite keeps its runs in
#: git: a few MB where the folder is thousands of files); its members sit under ARCHIVE_ROOT.
ARCHIVE_SUFFIX = ".tar.xz"
ARCHIVE_ROOT = "runs"


def is_archive(path: Path) -> bool:
    """Whether `path` names a sweep archive (by its suffix; it need not exist yet)."""
    return Path(path).name.endswith(ARCHIVE_SUFFIX)


@contextmanager
def opened_sweep(path: Path, flag: str = "RESULTS_DIR") -> Iterator[Path]:
    """A sweep folder to read: `path` itself, or a sweep archive unpacked into a temporary
    folder that is removed afterwards."""
    path = Path(path)
    if not is_archive(path):
        yield path
        return
    if not path.is_file():
        raise ResultsError(
            f"{flag} {path} does not exist; give a sweep folder or a sweep archive that "
            f"`posbench export SWEEP {path.name}` wrote."
        )
    with tempfile.TemporaryDirectory(prefix="posbench-sweep-") as staging:
        _unpack(path, Path(staging))
        yield Path(staging) / ARCHIVE_ROOT


def _unpack(archive: Path, into: Path) -> None:
    """Unpack a sweep archive, refusing members that are not plain files or folders under
    ARCHIVE_ROOT (a link, a device, an absolute path or '..' could write outside `into`)."""
    try:
        with tarfile.open(archive, "r:xz") as tar:
            members = tar.getmembers()
            for member in members:
                parts = Path(member.name).parts
                if (
                    not (member.isfile() or member.isdir())
                    or not parts
                    or parts[0] != ARCHIVE_ROOT
                    or ".." in parts
                    or Path(member.name).is_absolute()
                ):
                    raise ResultsError(
                        f"{archive} holds {member.name!r}, which is not a file of a sweep "
                        f"archive; export the sweep again with `posbench export SWEEP {archive}`."
                    )
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, members=members, filter="data")
            else:  # Python before 3.10.12: the members were checked above
                tar.extractall(into, members=members)
    except (tarfile.TarError, EOFError, OSError) as err:
        if isinstance(err, OSError) and not isinstance(err, tarfile.TarError):
            if err.errno in (errno.ENOSPC, errno.EACCES, errno.EROFS):
                raise ResultsError(describe_os_error(err, into, "unpack into")) from None
        raise ResultsError(
            f"{archive} is not a readable sweep archive ({err}); export the sweep again with "
            f"`posbench export SWEEP {archive}`."
        ) from None
    if not (into / ARCHIVE_ROOT).is_dir():
        raise ResultsError(
            f"{archive} holds no {ARCHIVE_ROOT}/ folder, so it is not a sweep archive; export "
            f"the sweep again with `posbench export SWEEP {archive}`."
        )


def write_archive(folder: Path, dest: Path, flag: str = "DEST") -> None:
    """Pack the sweep folder `folder` into the archive `dest`, atomically and reproducibly:
    members sorted, with fixed times, owners and modes, so the same runs give the same bytes
    (a re-export changes git's copy only where a run changed)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz", preset=6) as tar:
        for path in [folder, *sorted(folder.rglob("*"))]:
            if path.name == LOCK_FILE or not (path.is_file() or path.is_dir()):
                continue
            name = Path(ARCHIVE_ROOT, path.relative_to(folder)).as_posix()
            info = tar.gettarinfo(str(path), arcname=name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
    atomic_write_bytes(dest, buffer.getvalue(), flag)


@dataclass
class ExportSummary:
    """What `export_sweep` copied: runs written, and the sweep's runs left out unfinished."""

    exported: int
    unfinished: int
    bytes: int


def export_sweep(sweep_dir: Path, dest: Path) -> ExportSummary:
    """Copy the finished runs of a sweep folder, without their trained weights, into `dest`
    as a sweep folder of its own, or as a sweep archive where `dest` ends in .tar.xz: what a
    published report needs to be checked, and what a suite needs to resume on another machine
    (`posbench run --from` it trains only the runs it lacks). Each exported result.json keeps
    model.pt's checksum under MODEL_NOT_KEPT. Runs already in `dest` that `sweep_dir` lacks are
    kept. `sweep_dir` may be an archive too."""
    sweep_dir, dest = Path(sweep_dir), Path(dest)
    if dest.resolve() == sweep_dir.resolve():
        raise ResultsError(
            f"{dest} is the sweep folder itself; export into another folder (the sweep keeps "
            "its trained weights)."
        )
    if is_archive(dest) and dest.is_dir():
        raise ResultsError(
            f"DEST {dest} is a folder, but its name ends in {ARCHIVE_SUFFIX}, an archive's; "
            "choose another DEST."
        )
    with opened_sweep(sweep_dir, "SWEEP") as source:
        if not is_archive(dest):
            return _export_into(source, dest)
        with tempfile.TemporaryDirectory(prefix="posbench-export-") as staging:
            folder = Path(staging) / ARCHIVE_ROOT
            if dest.is_file():
                _unpack(dest, Path(staging))
            summary = _export_into(source, folder)
            write_archive(folder, dest)
            return summary


def _export_into(sweep_dir: Path, dest: Path) -> ExportSummary:
    """export_sweep into a folder."""
    if not (sweep_dir / SWEEP_MARKER).is_file():
        raise ResultsError(
            f"{sweep_dir} is not a posbench sweep folder (it has no {SWEEP_MARKER}); give the "
            "--out folder of a `posbench run`."
        )
    members = sweep_members(sweep_dir) or {}
    prepare_sweep_dir(dest, "DEST")
    exported = unfinished = size = 0
    with sweep_lock(dest):
        atomic_write_bytes(dest / SWEEP_MARKER, (sweep_dir / SWEEP_MARKER).read_bytes(), "DEST")
        for run_id in sorted(members):
            source = RunFolder(sweep_dir / run_id)
            if not source.is_finished():
                unfinished += 1
                continue
            size += _export_run(source, RunFolder(dest / run_id))
            exported += 1
        write_results_csv(dest, flag="DEST")
    return ExportSummary(exported, unfinished, size)


def import_runs(
    source: Path,
    out_dir: Path,
    run_ids: Iterable[str],
    dry_run: bool = False,
    accept: Callable[[RunFolder], bool] = lambda folder: True,
) -> list[str]:
    """Copy into `out_dir` the finished runs of `source` (a sweep folder or archive, such as a
    published suite's) that are among `run_ids`, that `accept` takes (the sweep leaves out a
    run whose evaluation is outdated) and that are not finished there, without trained
    weights; returns their ids (with `dry_run`, those it would copy, writing nothing). A run
    id is a digest of the run's configuration (labels aside), so a copied run is one this sweep
    would train. Refuses a source that holds none of them (another protocol or configuration made
    its runs) or runs another minor version of posbench made (its numbers may differ)."""
    out_dir, run_ids = Path(out_dir), list(run_ids)
    with opened_sweep(source, "--from") as folder:
        available = {f.path.name: f for f in run_folders(folder) if f.is_finished()}
        wanted = [r for r in run_ids if r in available and accept(available[r])]
        if not wanted:
            raise ResultsError(
                f"--from {source} holds none of this sweep's {len(run_ids)} run(s): its runs were "
                "made under another protocol or configuration (a run id is a digest of all of "
                "it); choose the suite and options it was run with, or drop --from."
            )
        minor = __version__.rsplit(".", 1)[0]
        made_by = {(available[run_id].env() or {}).get("posbench") for run_id in wanted}
        other = sorted(str(v) for v in made_by if str(v).rsplit(".", 1)[0] != minor)
        if other:
            raise ResultsError(
                f"--from {source} holds runs made by posbench {', '.join(other)}, and this is "
                f"posbench {__version__}, whose numbers may differ; train those runs here (drop "
                "--from) or rank against them with that version."
            )
        todo = [
            run_id for run_id in wanted if not RunFolder(out_dir / run_id).is_finished()
        ]
        if dry_run or not todo:
            return todo
        prepare_sweep_dir(out_dir)
        with sweep_lock(out_dir):
            for run_id in todo:
                _export_run(available[run_id], RunFolder(out_dir / run_id))
        return todo


def _export_run(source: RunFolder, target: RunFolder) -> int:
    """Copy one finished run without model.pt, result.json last; returns the bytes written."""
    result = source.result() or {}
    files = dict(result.get("files", {}))
    model = files.pop(MODEL_FILE, None)
    if model is not None:
        result = dict(result, files=files, **{MODEL_NOT_KEPT: model})
    target.clear()
    size = 0
    for name in (CONFIG_FILE, ENV_FILE, LOG_FILE, *files):
        file = source.path / name
        if file.is_file():
            data = file.read_bytes()
            atomic_write_bytes(target.path / name, data, "DEST")
            size += len(data)
    atomic_write_json(target.path / RESULT_FILE, result, "DEST")
    return size + (target.path / RESULT_FILE).stat().st_size


def write_results_csv(
    sweep_dir: Path,
    problems: list[str] | None = None,
    flag: str = "--out",
    cache: RunCache | None = None,
) -> Path:
    """Rebuild sweep_dir/results.csv from the sweep's run folders (damaged runs are left out
    and described in `problems`; `cache`: see collect); returns its path."""
    path = sweep_dir / RESULTS_FILE
    frame = collect(sweep_dir, problems if problems is not None else [], cache=cache)
    atomic_write_text(path, frame.to_csv(index=False), flag)
    return path
