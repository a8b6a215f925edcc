"""Sweep configuration: frozen dataclasses, loaded from TOML with unknown keys rejected (the
planner resolves a sweep into its runs)."""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Mapping

from posbench.errors import ConfigError, UnknownNameError
from posbench.model import D_MODEL, N_HEADS, N_LAYERS
from posbench.store import config_id, model_tag, run_label
from posbench.validation import Range, check_dataclass

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_TASKS = ("copy",)
#: A run whose mean in-distribution exact match is below this is flagged as undertrained.
UNDERTRAINED_BELOW = 0.9
#: A run on a task with a known loss floor (the synthetic language) whose mean in-distribution
#: loss lies more than this many nats above the floor did not learn the task: its
#: extrapolation penalty is shown but not ranked.
UNLEARNED_EXCESS = 0.1
#: Devices a run may name: cpu, cuda or cuda:N, mps.
DEVICE_PATTERN = r"cpu|cuda(:[0-9]+)?|mps"


@dataclass(frozen=True)
class ModelSize:
    """Decoder size shared by every run of a sweep."""

    d_model: Annotated[int, Range(ge=1)] = D_MODEL
    n_layers: Annotated[int, Range(ge=1)] = N_LAYERS
    n_heads: Annotated[int, Range(ge=1)] = N_HEADS
    d_ff: Annotated[int | None, Range(ge=1)] = None
    #: The output head reads the token embedding's weights (GPT-2, nanoGPT), which are then
    #: initialised N(0, 0.02) as theirs are.
    tie_embeddings: bool = False

    def tag(self) -> str:
        """The size in a few characters, as results' `model` column and labels show it:
        ``d64 L4 H4`` (d_model, layers, heads; `` F256`` when d_ff is set)."""
        return model_tag(dataclasses.asdict(self))


def size_axis(section: Mapping[str, Any], where: str) -> tuple[ModelSize, ...]:
    """Every model size a [model] table asks for: any of its fields may list several values
    (the model-size axis, like seeds), and the sweep runs every combination, in the order
    written, each checked like a single size."""
    values = {key: _as_list(value) for key, value in section.items()}
    for key, listed in values.items():
        if not listed:
            raise ConfigError(f"{where}: {key} = [] names no size; list at least one value.")
    sizes = []
    for combination in itertools.product(*values.values()):
        chosen = dict(zip(values, combination))
        check_dataclass(ModelSize, chosen, where)
        sizes.append(ModelSize(**chosen))
    if len(set(sizes)) < len(sizes):
        raise ConfigError(f"{where} lists a model size twice; list each value once.")
    return tuple(sizes)


@dataclass(frozen=True)
class TrainConfig:
    """One training loop for every encoding: AdamW, warmup then cosine decay, clipping."""

    steps: Annotated[int, Range(ge=1)] = 2500
    batch_size: Annotated[int, Range(ge=1)] = 64
    lr: Annotated[float, Range(gt=0)] = 3e-3
    warmup_steps: Annotated[int, Range(ge=0)] = 100
    weight_decay: Annotated[float, Range(ge=0)] = 0.01
    #: Decay weights only, not biases and LayerNorm gains (nanoGPT's two parameter groups).
    decay_matrices_only: bool = False
    #: AdamW's second-moment decay (torch's default 0.999; nanoGPT's character model 0.99).
    beta2: Annotated[float, Range(gt=0, lt=1)] = 0.999
    #: Where the cosine decay ends (nanoGPT: a tenth of lr).
    min_lr: Annotated[float, Range(ge=0)] = 0.0
    grad_clip: Annotated[float, Range(gt=0)] = 1.0
    #: Transformer-XL recurrence: feed each sequence in segments through a cache of this many
    #: positions, gradients stopped at the memory. None trains on whole sequences.
    train_mem_len: Annotated[int | None, Range(ge=0)] = None
    #: Segment length for recurrent training (default: train_mem_len, as in Transformer-XL).
    train_segment_len: Annotated[int | None, Range(ge=1)] = None
    #: Train to convergence: every `check_every` steps, measure held-out exact match in the
    #: training range and stop once it reaches `stop_at` (None: always train all `steps`,
    #: which is then the cap). The step it was reached is recorded as steps_to_threshold.
    stop_at: Annotated[float | None, Range(gt=0, le=1)] = None
    check_every: Annotated[int, Range(ge=1)] = 250
    #: For a task with a known loss floor (the synthetic language): every `check_every` steps,
    #: measure held-out in-distribution loss and stop once it lies within this many nats of the
    #: floor (None: train all `steps`). The step it was reached is recorded as steps_to_threshold.
    stop_within: Annotated[float | None, Range(gt=0)] = None


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation at each length, whole and through caches of several sizes."""

    n_samples: Annotated[int, Range(ge=1)] = 256
    batch_size: Annotated[int, Range(ge=1)] = 128
    #: Segment length S for the cache sweep (default: half the longest training sequence).
    segment_len: Annotated[int | None, Range(ge=1)] = None
    #: Memory lengths M as multiples of S; "inf" (or -1 in TOML) means unbounded.
    mem_len_factors: Annotated[tuple[float, ...], Range(ge=0, infinite=True)] = (
        0.0,
        0.5,
        1.0,
        2.0,
        float("inf"),
    )
    #: Evaluate through the cache at these task lengths (default: every evaluation length).
    cache_eval_lengths: Annotated[tuple[int, ...] | None, Range(ge=1)] = None


#: First characters that make a spreadsheet read a CSV cell as a formula.
FORMULA_STARTS = ("=", "+", "-", "@")


def check_label(label: str, what: str) -> None:
    """Refuse a label a spreadsheet would run as a formula (results.csv, summary.csv and
    by_length.csv carry labels verbatim) or one that breaks a line of progress output."""
    if label.startswith(FORMULA_STARTS):
        raise ConfigError(
            f"The label {label!r} of {what} starts with {label[0]!r}, which a spreadsheet opening "
            "results.csv reads as a formula; start it with a letter or digit."
        )
    if any(not ch.isprintable() for ch in label):
        raise ConfigError(
            f"The label {label!r} of {what} holds a control character (a newline or tab, say), "
            "which breaks the one-line progress output and CSV rows; use printable characters."
        )


@dataclass(frozen=True)
class EncodingSpec:
    """An encoding with its options, and the label results and reports show for it."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self) -> None:
        check_label(self.label, f"encoding {self.name!r}")

    def display(self) -> str:
        if self.label:
            return self.label
        if not self.options:
            return self.name
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.name}({opts})"


@dataclass(frozen=True)
class TaskSpec:
    """A task with its options (train_lengths, eval_lengths and task-specific ones) and the
    training settings it changes for its runs (`train`: TrainConfig fields, e.g. steps)."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)
    train: Mapping[str, Any] = field(default_factory=dict)
    #: What results and reports call it; needed when a suite runs one task twice (say, lm
    #: trained on whole windows and lm trained through a cache).
    label: str = ""

    def __post_init__(self) -> None:
        check_label(self.label, f"task {self.name!r}")

    def display(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class SweepConfig:
    """Everything a sweep runs; command-line flags override a TOML file, which overrides
    defaults."""

    tasks: tuple[TaskSpec, ...] = tuple(TaskSpec(t) for t in DEFAULT_TASKS)
    encodings: tuple[EncodingSpec, ...] = ()  # empty: every built-in encoding
    seeds: Annotated[tuple[int, ...], Range(ge=0, le=2**31 - 1)] = (0,)
    model: ModelSize = ModelSize()
    #: The model-size axis: every task x encoding x seed at each of these sizes (empty: `model`
    #: alone; a [model] table that lists values fills it, with `model` the first size).
    sizes: tuple[ModelSize, ...] = ()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    device: str = "cpu"
    threads: Annotated[int | None, Range(ge=1)] = (
        None  # torch threads per run (None: torch's default)
    )
    quick: bool = False
    profile: bool = True
    #: What the sweep is for, in a sentence; reports show it at the top.
    about: str = ""
    #: How the protocol differs from the published ones the report compares it with, one
    #: difference per item; the report lists them beside the papers' numbers and the
    #: literature checks, as the first candidates wherever the two disagree.
    differences: tuple[str, ...] = ()
    #: Evaluation-time variants: each trained run of an encoding with the same name is also
    #: evaluated with these options merged into its own (no retraining), as its own rows.
    eval_variants: tuple[EncodingSpec, ...] = ()


#: Settings added after runs were stored, by config section: a run's config leaves each out
#: while it holds this default, so the ids of runs stored before it existed stay the same (a
#: run id is a digest of the config).
ADDED_AFTER_RUNS_WERE_STORED: dict[str, dict[str, Any]] = {
    "model": {"tie_embeddings": False},
    "train": {"decay_matrices_only": False, "beta2": 0.999, "min_lr": 0.0},
}


@dataclass(frozen=True)
class RunConfig:
    """One run: a task, an encoding with its options, a seed and the training/eval settings."""

    task: TaskSpec
    encoding: EncodingSpec
    seed: int
    model: ModelSize
    train: TrainConfig
    eval: EvalConfig
    device: str = "cpu"
    quick: bool = False
    #: Digests of the plugin source that defines the task and the encoding ("encoding": ...,
    #: "task": ...), where a plugin does; empty for posbench's own, so their ids never change.
    plugin_code: Mapping[str, str] = field(default_factory=dict)
    #: Whether labels name the model size (a sweep with a size axis); not stored, not hashed.
    show_size: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        data = to_jsonable(dataclasses.asdict(self))
        del data["show_size"]
        if not data["plugin_code"]:
            del data["plugin_code"]
        for section, defaults in ADDED_AFTER_RUNS_WERE_STORED.items():
            for key, default in defaults.items():
                if data[section].get(key) == default:
                    del data[section][key]
        return data

    @property
    def task_display(self) -> str:
        """The task as labels show it: with the model size in a sweep of several sizes."""
        task = self.task.display()
        return f"{task} @ {self.model.tag()}" if self.show_size else task

    @property
    def label(self) -> str:
        """How the run is named to people (see run_label)."""
        return run_label(self.task_display, self.encoding.display(), self.seed)

    @property
    def run_id(self) -> str:
        """A hash of everything that changes the numbers (the device included, the label not)."""
        return config_id(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunConfig":
        return cls(
            task=TaskSpec(
                data["task"]["name"],
                dict(data["task"]["options"]),
                dict(data["task"].get("train", {})),
                data["task"].get("label", ""),
            ),
            encoding=EncodingSpec(
                data["encoding"]["name"],
                dict(data["encoding"]["options"]),
                data["encoding"].get("label", ""),
            ),
            seed=int(data["seed"]),
            model=ModelSize(**data["model"]),
            train=TrainConfig(**data["train"]),
            eval=_eval_from(data["eval"]),
            device=data.get("device", "cpu"),
            quick=bool(data.get("quick", False)),
            plugin_code=dict(data.get("plugin_code", {})),
        )


def check_threads(threads: int | None, where: str) -> None:
    """Refuse more torch threads than this machine has cores: torch starts them all at once
    (100000 exceeds a system's process limit), and oversubscribed threads only slow a run."""
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:
        raise ConfigError(
            f"{where} = {threads} asks for more threads than this machine's {cores} cores; use "
            f"at most {cores}."
        )


def _eval_values(data: Mapping[str, Any]) -> dict[str, Any]:
    """[eval] values as EvalConfig takes them: lists as tuples, "inf" or -1 as an unbounded
    cache."""
    values = dict(data)
    if isinstance(values.get("mem_len_factors"), (list, tuple)):
        values["mem_len_factors"] = tuple(
            math.inf if f in ("inf", -1, None) else f for f in values["mem_len_factors"]
        )
    if isinstance(values.get("cache_eval_lengths"), list):
        values["cache_eval_lengths"] = tuple(values["cache_eval_lengths"])
    return values


def _eval_from(data: Mapping[str, Any]) -> EvalConfig:
    values = _eval_values(data)
    if "mem_len_factors" in values:
        values["mem_len_factors"] = tuple(float(f) for f in values["mem_len_factors"])
    return EvalConfig(**values)


#: The training settings that only decide when to stop, never what a step does.
STOPPING_FIELDS = ("stop_at", "stop_within", "check_every")


def stops_early(run: RunConfig) -> bool:
    """Whether the run may stop before its step cap (a held-out threshold)."""
    return run.train.stop_at is not None or run.train.stop_within is not None


def training_key(run: RunConfig) -> str:
    """A hash of everything that decides a run's weights step by step: task and encoding
    with their options, seed, model, device and training settings, without labels, the
    evaluation settings and the stopping rule. Two runs with one key take identical steps
    until one of them stops early (a held-out check reads the model and changes nothing)."""
    data = run.to_dict()
    data["task"] = {k: v for k, v in data["task"].items() if k not in ("label", "train")}
    data["train"] = {k: v for k, v in data["train"].items() if k not in STOPPING_FIELDS}
    del data["eval"]
    return config_id(data)


def to_jsonable(value: Any) -> Any:
    """Dataclass dicts to JSON-ready values (inf becomes "inf")."""
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


#: An encoding option written "train" or "train/N" is the run's longest training sequence (in
#: tokens) divided by N, so one entry keeps a ratio across tasks of different lengths (Press et
#: al. trained T5 with max_distance a quarter of the window: ``max_distance = "train/4"``).
TIED_OPTION = re.compile(r"train(?:/([1-9][0-9]*))?")


def longest_training_sequence(task: TaskSpec) -> int:
    """Tokens in the longest training sequence of `task`."""
    from posbench.tasks import create_task

    built = create_task(task.name, **task.options)
    return built.sequence_length(built.train_lengths[1])


def resolve_tied_options(spec: EncodingSpec, longest: int) -> EncodingSpec:
    """`spec` with its options tied to the training length resolved for sequences of `longest`
    tokens; its label keeps the tied form, so every task shows the same name for it."""
    tied = {k: TIED_OPTION.fullmatch(v) for k, v in spec.options.items() if isinstance(v, str)}
    tied = {k: m for k, m in tied.items() if m}
    if not tied:
        return spec
    options = dict(spec.options) | {
        k: max(1, longest // int(m.group(1) or 1)) for k, m in tied.items()
    }
    return EncodingSpec(spec.name, options, spec.display())


def model_sizes(sweep: SweepConfig) -> tuple[ModelSize, ...]:
    """The sizes a sweep trains each run at (its size axis, or its one model)."""
    return sweep.sizes or (sweep.model,)


def plugin_code(task: str, encoding: str) -> dict[str, str]:
    """The digests of the plugin source files that define `task` and `encoding`, for those a
    plugin defines (see Registry.code_digest); unknown names are left to the checks that name
    them."""
    from posbench.encodings import REGISTRY as ENCODINGS
    from posbench.tasks import REGISTRY as TASKS

    digests = {}
    for part, registry, name in (("encoding", ENCODINGS, encoding), ("task", TASKS, task)):
        try:
            digest = registry.code_digest(name)
        except UnknownNameError:
            continue
        if digest is not None:
            digests[part] = digest
    return digests


# ---- loading TOML --------------------------------------------------------------------------
#: Top-level keys that pass to SweepConfig as they are (lists become tuples).
_PLAIN_KEYS = ("seeds", "device", "threads", "quick", "profile", "about", "differences")
#: Every top-level key: `name`, the entry lists, the sections and the plain keys.
_TOP_KEYS = {"name", "tasks", "encodings", "eval_variants", "model", "train", "eval", *_PLAIN_KEYS}


def load_config_file(path: Path) -> tuple[SweepConfig, str | None]:
    """Parse a sweep TOML file; returns the config and its optional `name`."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"Config file {path} does not exist; check the path given to --config."
        ) from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"Config file {path} is not UTF-8 text (byte {err.start} cannot be read); save it as "
            "UTF-8 and rerun."
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(
            f"Config file {path} is not valid TOML ({err}); fix the syntax and rerun."
        ) from None
    except OSError as err:
        raise ConfigError(
            f"Config file {path} cannot be read ({err.strerror}); check the path."
        ) from None
    name = data.get("name")
    if name is not None and not (isinstance(name, str) and SWEEP_NAME.fullmatch(name)):
        raise ConfigError(
            f"Config file {path}: name = {name!r} must be a plain folder name (letters, digits, "
            "'.', '_' or '-', no '/' or '..'), since the sweep is written to results/<name>."
        )
    return config_from_mapping(data, str(path)), name


#: A sweep's name: the folder it is written to under results/, never a path out of it.
SWEEP_NAME = re.compile(r"(?!\.\.?$)[A-Za-z0-9._-]+")


def config_from_mapping(data: Mapping[str, Any], source: str = "config") -> SweepConfig:
    """Build a SweepConfig from parsed TOML, rejecting unknown keys and values of the wrong
    type or range (each named in one sentence)."""
    _reject_unknown(data, _TOP_KEYS, source)
    kwargs: dict[str, Any] = {}
    if "tasks" in data:
        kwargs["tasks"] = tuple(
            _spec(entry, TaskSpec, source, "tasks") for entry in _as_list(data["tasks"])
        )
    for key in ("tasks", "encodings", "seeds"):
        if key in data and _as_list(data[key]) == []:
            raise ConfigError(
                f"{source}: {key} = [] names nothing; list at least one, or leave the key out for "
                "the default."
            )
    if "encodings" in data:
        kwargs["encodings"] = tuple(
            _spec(entry, EncodingSpec, source, "encodings") for entry in _as_list(data["encodings"])
        )
    if "eval_variants" in data:
        kwargs["eval_variants"] = tuple(
            _spec(e, EncodingSpec, source, "eval_variants") for e in _as_list(data["eval_variants"])
        )
    if "model" in data:
        section = f"{source} [model]"
        _reject_unknown(data["model"], {f.name for f in dataclasses.fields(ModelSize)}, section)
        sizes = size_axis(data["model"], section)
        kwargs["model"] = sizes[0]
        if len(sizes) > 1:
            kwargs["sizes"] = sizes
    for key, cls in (("train", TrainConfig), ("eval", EvalConfig)):
        if key in data:
            section = f"{source} [{key}]"
            _reject_unknown(data[key], {f.name for f in dataclasses.fields(cls)}, section)
            values = _eval_values(data[key]) if cls is EvalConfig else dict(data[key])
            check_dataclass(cls, values, section)
            kwargs[key] = cls(**values)
    top = {
        k: (tuple(_as_list(v)) if k in ("seeds", "differences") else v)
        for k, v in data.items()
        if k in _PLAIN_KEYS
    }
    check_dataclass(SweepConfig, top, source)
    return SweepConfig(**kwargs, **top)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _spec(entry: Any, cls: type, source: str, key: str) -> Any:
    if isinstance(entry, str):
        return cls(entry)
    if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
        options = {k: v for k, v in entry.items() if k not in ("name", "label")}
        label = entry.get("label", "")
        if not isinstance(label, str):
            kind = "encoding" if cls is EncodingSpec else "task"
            raise ConfigError(
                f"{source}: the label of {kind} {entry['name']!r} must be a string, got {label!r}."
            )
        if cls is EncodingSpec:
            return EncodingSpec(entry["name"], options, label)
        train = options.pop("train", {})
        where = f"{source} [tasks] {entry['name']!r} train"
        if not isinstance(train, Mapping):
            raise ConfigError(
                f"{where} must be a table of training settings, e.g. {{ steps = 500 }}, got "
                f"{train!r}."
            )
        _reject_unknown(train, {f.name for f in dataclasses.fields(TrainConfig)}, where)
        check_dataclass(TrainConfig, train, where)
        return TaskSpec(entry["name"], options, dict(train), label)
    raise ConfigError(
        f"{source}: each entry of '{key}' must be a name or a table with a 'name' key, got "
        f"{entry!r}."
    )


def _reject_unknown(data: Any, allowed: set[str], where: str) -> None:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a table, got {type(data).__name__}.")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(
            f"Unknown key {', '.join(repr(u) for u in unknown)} in {where}; allowed: "
            f"{', '.join(sorted(allowed))}."
        )


QUICK_STEPS = 200
QUICK_SAMPLES = 64


def _task_steps(spec: TaskSpec, steps: Any) -> TaskSpec:
    """A task whose own step count (if it sets one) is changed by `steps` (a function of it)."""
    if "steps" not in spec.train:
        return spec
    n = steps(spec.train["steps"])
    train = dict(spec.train, steps=n)
    if "warmup_steps" in train:
        train["warmup_steps"] = min(train["warmup_steps"], max(1, n // 10))
    return dataclasses.replace(spec, train=train)


def select_entries(
    patterns: str, entries: tuple[Any, ...], registry: Any, make: Callable[[str], Any]
) -> tuple[Any, ...]:
    """--encodings / --tasks over a config's entries (EncodingSpec or TaskSpec): each
    comma-separated pattern (wildcards allowed) selects the entries whose label matches it
    ("rope+random", "copy-fixed"; an entry without a label is labelled by its name); a pattern
    that matches no label selects every entry of each registered name it matches, or a new
    entry with default options for a name the config lacks. So `--tasks copy` on a suite with
    copy and copy-fixed runs copy alone, and `--tasks 'copy*'` both."""
    chosen: list[Any] = []
    for pattern in (p.strip() for p in patterns.split(",")):
        if not pattern:
            continue
        picked = [e for e in entries if fnmatch.fnmatchcase(e.display(), pattern)]
        if not picked:
            try:
                names = registry.select(pattern)
            except UnknownNameError as err:
                labels = ", ".join(e.display() for e in entries)
                raise UnknownNameError(
                    f"{err} Nor is it a label of this sweep's entries"
                    + (f" ({labels})." if labels else ".")
                ) from None
            for name in names:
                picked += [e for e in entries if e.name == name] or [make(name)]
        chosen += [e for e in picked if e not in chosen]
    return tuple(chosen)


def apply_overrides(
    sweep: SweepConfig,
    *,
    encodings: str | None = None,
    tasks: str | None = None,
    seeds: tuple[int, ...] | None = None,
    steps: int | None = None,
    device: str | None = None,
    train_mem_len: int | None = None,
    threads: int | None = None,
    quick: bool = False,
    profile: bool | None = None,
    eval_variants: tuple[EncodingSpec, ...] | None = None,
) -> SweepConfig:
    """Command-line flags over a config: names (commas, wildcards) replace the lists, keeping
    any options the config gave a name; --quick shrinks steps and the evaluation sample."""
    from posbench.encodings import REGISTRY as ENCODINGS
    from posbench.tasks import REGISTRY as TASKS

    changes: dict[str, Any] = {}
    if encodings is not None:
        changes["encodings"] = select_entries(encodings, sweep.encodings, ENCODINGS, EncodingSpec)
        if not changes["encodings"]:
            raise ConfigError(
                "--encodings names no encoding; give at least one, e.g. --encodings txl,t5."
            )
    if tasks is not None:
        changes["tasks"] = select_entries(tasks, sweep.tasks, TASKS, TaskSpec)
        if not changes["tasks"]:
            raise ConfigError("--tasks names no task; give at least one, e.g. --tasks copy.")
    if seeds is not None:
        changes["seeds"] = seeds
    train = sweep.train
    task_specs = changes.get("tasks", sweep.tasks)
    if quick:
        changes["quick"] = True
        train = dataclasses.replace(
            train,
            steps=min(train.steps, QUICK_STEPS),
            warmup_steps=min(train.warmup_steps, QUICK_STEPS // 10),
        )
        changes["eval"] = dataclasses.replace(
            sweep.eval, n_samples=min(sweep.eval.n_samples, QUICK_SAMPLES)
        )
        task_specs = tuple(_task_steps(t, lambda n: min(n, QUICK_STEPS)) for t in task_specs)
    if steps is not None:
        if steps < 1:
            raise ConfigError(f"--steps must be at least 1, got {steps}.")
        train = dataclasses.replace(
            train, steps=steps, warmup_steps=min(train.warmup_steps, max(1, steps // 10))
        )
        task_specs = tuple(_task_steps(t, lambda n: steps) for t in task_specs)
    changes["tasks"] = task_specs
    if train_mem_len is not None:
        train = dataclasses.replace(train, train_mem_len=train_mem_len)
    changes["train"] = train
    if device is not None:
        changes["device"] = device
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {threads}.")
        check_threads(threads, "--threads")
        changes["threads"] = threads
    if profile is not None:
        changes["profile"] = profile
    if eval_variants is not None:
        changes["eval_variants"] = eval_variants
    elif encodings is not None:  # narrowing a config's encodings drops the variants of the rest
        kept = {n for spec in changes["encodings"] for n in (spec.name, spec.label) if n}
        changes["eval_variants"] = tuple(v for v in sweep.eval_variants if v.name in kept)
    return dataclasses.replace(sweep, **changes)


def parse_specs(text: str, flag: str) -> tuple[EncodingSpec, ...]:
    """Encodings with options, as a flag writes them: entries separated by ``;``, each a name
    and, after ``:``, ``key=value`` options separated by commas, values read as TOML (numbers,
    true/false; anything else a string); ``label=...`` names the entry, as in a sweep file.
    ``'t5:randomize_positions=2048;rope:scaling=yarn,factor=4,label=yarn4'``."""
    specs = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, _, rest = part.partition(":")
        options: dict[str, Any] = {}
        for item in (i.strip() for i in rest.split(",") if i.strip()):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(
                    f"{flag}: {item!r} in {part!r} is not key=value; write e.g. "
                    "'rope:scaling=yarn,factor=4'."
                )
            try:
                options[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
            except tomllib.TOMLDecodeError:
                options[key.strip()] = value.strip()
        label = options.pop("label", "")
        specs.append(EncodingSpec(name.strip(), options, str(label)))
    return tuple(specs)
