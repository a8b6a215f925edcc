"""The `posbench` command line: list, run, bench, report."""

from __future__ import annotations

import math
import signal
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, List, NoReturn, Optional, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from posbench.errors import ConfigError, PosbenchError

if TYPE_CHECKING:
    from posbench.experiment.planner import SweepPlan

app = typer.Typer(
    help="Compare positional encodings for Transformer attention, side by side.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
#: Off a terminal (CI, a pipe, a file) tables are laid out this wide instead of rich's 80
#: columns, so no cell is cut.
PIPED_WIDTH = 200
console = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else PIPED_WIDTH)
T = TypeVar("T")


def user_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Turn a PosbenchError (or a file system error) into one line on stderr and exit code 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> T:
        from posbench.store import describe_os_error

        try:
            return fn(*args, **kwargs)
        except PosbenchError as err:
            message = str(err)
        except OSError as err:  # a disk or permission problem met outside the results store
            message = describe_os_error(err, getattr(err, "filename", None) or "a file", "use")
        err_console.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
        raise typer.Exit(2) from None

    return wrapper


class Terminated(KeyboardInterrupt):
    """SIGTERM (timeout, docker stop, Slurm) handled like Ctrl-C: workers stopped, runs kept."""


_sigterm_received = False  # whether SIGTERM stopped the command (see _terminated)


def _raise_terminated(signum: int, frame: object) -> None:
    global _sigterm_received
    _sigterm_received = True
    raise Terminated()


def _terminated(interrupt: KeyboardInterrupt) -> bool:
    """Whether SIGTERM, not Ctrl-C, stopped the command. Ray's blocking calls turn whatever a
    signal handler raises into a plain KeyboardInterrupt, so the handler's record decides."""
    return isinstance(interrupt, Terminated) or _sigterm_received


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block SIGTERM raises Terminated, so it stops a command as Ctrl-C does."""
    global _sigterm_received
    _sigterm_received = False
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop(interrupt: KeyboardInterrupt, what_is_kept: str) -> NoReturn:
    """One line saying the command was interrupted and what is kept; exit 130 (Ctrl-C) or 143
    (SIGTERM), as a shell reports a process those signals ended."""
    terminated = _terminated(interrupt)
    how = "terminated" if terminated else "interrupted"
    err_console.print(Text(f"{how}: {what_is_kept}", style="yellow"), soft_wrap=True)
    raise typer.Exit(143 if terminated else 130) from None


@app.callback()
def main_options(
    plugins: List[Path] = typer.Option(
        [], "--plugins", help="Extra folder of plugin .py files (encodings or tasks); repeatable."
    ),
) -> None:
    """Load plugin folders before any command runs."""
    from posbench.plugins import load_plugins

    load_plugins(list(plugins))


@app.command("list")
@user_errors
def list_command(
    pattern: Optional[str] = typer.Argument(None, help="Wildcard filter, e.g. 'r*'."),
) -> None:
    """List the registered encodings and tasks, plugins included, with a one-line description."""
    from posbench.encodings import REGISTRY as ENCODINGS
    from posbench.tasks import REGISTRY as TASKS

    from posbench.suites import list_suites

    for title, registry in (("Encodings", ENCODINGS), ("Tasks", TASKS)):
        table = Table(title=title, title_justify="left")
        table.add_column("name", style="bold cyan", no_wrap=True)
        table.add_column("description")
        for name in registry.names(pattern):
            table.add_row(Text(name), Text(registry.description(name).replace("``", "")))
        if registry is ENCODINGS:
            table.caption = (
                "Every encoding also takes randomize_positions = M: randomized positions (Ruoss et "
                "al. "
                "2023), each stream's drawn sorted from 0..M-1; eval_positions = random|plain."
            )
            table.caption_justify = "left"
        console.print(table)
    table = Table(title="Suites (posbench run --suite NAME)", title_justify="left")
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("description")
    for name, description in list_suites().items():
        table.add_row(Text(name), Text(description))
    console.print(table)


def _int_list(value: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{flag} takes comma-separated integers, got {value!r}.") from None


@app.command("run")
@user_errors
def run_command(
    encodings: Optional[str] = typer.Option(
        None,
        help="Encodings, commas and wildcards: 'txl,t5', 'rope*'; a suite's labels select its "
        "entries ('rope+random', 't5-paper'). Default: the suite's (or config's) encodings.",
    ),
    tasks: Optional[str] = typer.Option(
        None,
        help="Tasks, commas and wildcards; a suite's labels select its entries ('copy-fixed'). "
        "Default: the suite's (or config's) tasks.",
    ),
    seeds: Optional[str] = typer.Option(
        None, help="Seeds, e.g. 0,1,2. Default: the suite's (or config's) seeds."
    ),
    steps: Optional[int] = typer.Option(None, help="Training steps per run."),
    device: Optional[str] = typer.Option(None, help="cpu (default) or cuda."),
    out: Optional[Path] = typer.Option(
        None, help="Sweep folder. Default: results/<config name>, results/default or results/quick."
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", help="A TOML file describing the sweep; flags override it."
    ),
    suite: Optional[str] = typer.Option(
        None,
        "--suite",
        help="A suite that ships with posbench (`posbench list` shows them), e.g. standard.",
    ),
    train_mem_len: Optional[int] = typer.Option(
        None, help="Train Transformer-XL style through a cache of this many positions."
    ),
    threads: Optional[int] = typer.Option(
        None, help="torch threads per run (recorded with the results)."
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="A first look in about three minutes: far fewer steps, a small evaluation sample.",
    ),
    force: bool = typer.Option(False, "--force", help="Redo finished runs too."),
    profile: Optional[bool] = typer.Option(
        None, "--profile/--no-profile", help="Include a small latency/memory profile."
    ),
    report: bool = typer.Option(
        True, "--report/--no-report", help="Write reports/<sweep>/report.html at the end."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Check the sweep and print the plan the run executes: every training run, "
        "variant and profile, stored or to run, and what it reuses; run and write nothing.",
    ),
    executor: str = typer.Option(
        "local", help="local (one run at a time), processes (--jobs N here) or ray."
    ),
    jobs: int = typer.Option(2, help="Worker processes for --executor processes."),
    ray_address: Optional[str] = typer.Option(
        None, help="Ray cluster to join ('auto' or host:port); default starts a local Ray runtime."
    ),
    cpus_per_run: float = typer.Option(1.0, help="CPUs each Ray task asks for."),
    gpus_per_run: float = typer.Option(0.0, help="GPUs each Ray task asks for."),
    from_runs: Optional[Path] = typer.Option(
        None,
        "--from",
        help="A sweep folder or archive (a published suite's reports/<suite>/runs.tar.xz) whose "
        "finished runs of this sweep are copied into --out first, so only the runs it lacks "
        "train: rank your encoding against a published suite without retraining it.",
    ),
    eval_variants: Optional[str] = typer.Option(
        None,
        "--eval-variants",
        help="Also evaluate each trained model under other options, no retraining: "
        "'rope:scaling=yarn,factor=4;rope:scaling=ntk,factor=4'.",
    ),
) -> None:
    """Train a tiny decoder per encoding and task, evaluate it at and beyond the training
    length and through caches, and store tidy, resumable results."""
    from posbench.experiment.config import apply_overrides, load_config_file
    from posbench.experiment.variants import parse_variants
    from posbench.suites import DEFAULT_SUITE, suite_file
    from posbench.report.progress import make_reporter, print_outcome

    if config and suite:
        raise ConfigError("--config and --suite both describe a whole sweep; give one of them.")
    sweep, name = load_config_file(config or suite_file(suite or DEFAULT_SUITE))
    sweep = apply_overrides(
        sweep,
        encodings=encodings,
        tasks=tasks,
        seeds=_int_list(seeds, "--seeds") if seeds is not None else None,
        steps=steps,
        device=device,
        train_mem_len=train_mem_len,
        threads=threads,
        quick=quick,
        profile=profile,
        eval_variants=None if eval_variants is None else parse_variants(eval_variants),
    )
    name = name or (config.stem if config else DEFAULT_SUITE)
    if sweep.quick:  # a quick look never mixes with the full runs of the same sweep
        name = "quick" if name == DEFAULT_SUITE else f"{name}-quick"
    out_dir = out or Path("results") / name
    from posbench.experiment.executors import make_executor
    from posbench.report.html import default_report_dir
    from posbench.store import RunFolder, sweep_members
    from posbench.experiment.runner import run_sweep

    chosen = make_executor(executor, jobs, ray_address, cpus_per_run, gpus_per_run)
    copied: list[str] = []
    if from_runs is not None or dry_run:
        from posbench.experiment.planner import plan_sweep

        plan = plan_sweep(sweep, out_dir, force)
    if from_runs is not None:
        from posbench.experiment.planner import outdated_in
        from posbench.store import import_runs

        # training runs and their evaluation variants; profiles time this machine, so rerun
        works = {work.run_id: work for work in [*plan.runs, *plan.variants]}
        copied = import_runs(
            from_runs,
            out_dir,
            works,
            dry_run=dry_run,
            accept=lambda folder: not outdated_in(works[folder.path.name], folder),
        )
        console.print(
            Text(
                f"{'would take' if dry_run else 'took'} {len(copied)} finished run(s) of this "
                f"sweep from {from_runs}"
            ),
            soft_wrap=True,
        )
    if dry_run:
        _print_plan(plan, out_dir, set(copied))
        return
    with sigterm_interrupts():
        try:
            with make_reporter(console, quick=sweep.quick) as reporter:
                outcome = run_sweep(sweep, out_dir, force=force, reporter=reporter, executor=chosen)
        except KeyboardInterrupt as interrupt:
            members = sweep_members(out_dir) if out_dir.is_dir() else None
            kept = sum(RunFolder(out_dir / run_id).is_finished() for run_id in members or {})
            _stop(
                interrupt,
                f"{kept} of {len(members or {})} run(s) of this sweep are stored in {out_dir}; "
                "run the same command again to resume (finished runs are skipped).",
            )
        print_outcome(console, outcome)
        if report and outcome.finished_any:
            from posbench.report.html import build_report

            report_dir = default_report_dir(out_dir)
            try:
                written = build_report(out_dir, report_dir)
            except KeyboardInterrupt as interrupt:
                _stop(
                    interrupt,
                    f"every finished run is stored in {out_dir}, and {report_dir} holds its "
                    "previous report or the whole new one, never a mix; write the report with "
                    f"`posbench report {out_dir}`.",
                )
            console.print(Text(f"report: {written.html}"), soft_wrap=True)
        elif report:
            console.print(
                Text("no run of this sweep finished, so no report was written"), soft_wrap=True
            )
    if outcome.failures or outcome.missing:
        raise typer.Exit(1)


#: A dry run's action for a run that --from would copy rather than train.
COPIED_FROM = "stored once copied from --from"


def _print_plan(plan: "SweepPlan", out_dir: Path, copied: set[str] = frozenset()) -> None:
    """What `posbench run --dry-run` found: every job of the plan the run executes, with what
    it does (stored, run, reuse a model, or, for the runs `copied` from --from, taken from
    there) and what it waits for, and the configuration's warnings; nothing was run."""
    table = Table(title=f"dry run: the plan for {out_dir}", title_justify="left")
    for column in ("job", "run", "id", "action"):
        table.add_column(column, no_wrap=column != "action")
    for kind, label, run_id, action in plan.rows():
        action = COPIED_FROM if run_id in copied else action
        table.add_row(kind, Text(label), run_id, Text(action))
    console.print(table)
    for warning in plan.warnings:
        console.print(Text(f"warning: {warning}", style="yellow"), soft_wrap=True)
    from posbench.experiment.planner import STORED, TRAIN

    stored = sum(
        job.action == STORED or job.run_id in copied for job in plan.jobs if job.kind == TRAIN
    )
    console.print(
        Text(
            f"{len(plan.runs)} training run(s), {stored} stored already; "
            f"{len(plan.variants)} evaluation variant(s) and {len(plan.profiles)} profile(s); "
            f"{sum(job.to_run and job.run_id not in copied for job in plan.jobs)} job(s) to "
            "run. Nothing was run or written (--dry-run)."
        ),
        soft_wrap=True,
    )


@app.command("bench")
@user_errors
def bench_command(
    encodings: Optional[str] = typer.Option(
        None,
        help="Encodings: names, commas and wildcards ('txl,t5', 'rope*'), and entries with "
        "options and a label after ';' as in a sweep file "
        "('alibi;t5:randomize_positions=2048;rope:scaling=yarn,factor=4,label=yarn4'). "
        "Default: every built-in.",
    ),
    seq_lens: Optional[str] = typer.Option(
        None, help="Sequence lengths, e.g. 128,256,512 (default up to 4096)."
    ),
    mem_lens: Optional[str] = typer.Option(
        None,
        help="Memory lengths (cached positions) for decoding, e.g. 0,128,1024 "
        "(default up to 4096).",
    ),
    window_lens: Optional[str] = typer.Option(
        None, help="Sequence lengths for segment-with-cache vs sliding-window evaluation."
    ),
    cache_lens: Optional[str] = typer.Option(
        None, "--cache-lens", hidden=True, help="Deprecated spelling of --mem-lens."
    ),
    batch_size: int = typer.Option(8, help="Batch size B."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    threads: int = typer.Option(2, help="torch threads (fixed and recorded)."),
    min_run_time: float = typer.Option(
        0.2, help="Seconds of timing per measurement (blocked autorange)."
    ),
    memory: bool = typer.Option(True, "--memory/--no-memory", help="Measure peak memory too."),
    out: Path = typer.Option(Path("results/bench"), help="Folder for the tidy results."),
    force: bool = typer.Option(False, "--force", help="Measure again even where results exist."),
) -> None:
    """Latency and peak memory of one attention layer per encoding, across sequence and cache
    lengths, each beside the `nope` baseline in the same run."""
    import dataclasses

    import torch

    from posbench.deprecation import warn_renamed
    from posbench.encodings import BUILTINS, check_encoding_options
    from posbench.experiment.config import EncodingSpec, check_threads
    from posbench.plugins import loaded_plugin_dirs
    from posbench.experiment.profiling import BenchConfig, bench_specs, check_bench_lengths
    from posbench.experiment.runner import run_bench
    from posbench.report.bench import print_bench
    from posbench.store import RunFolder

    if cache_lens is not None:
        if mem_lens is not None:
            raise ConfigError(
                "--cache-lens is the old spelling of --mem-lens; give --mem-lens only."
            )
        warn_renamed("the flag --cache-lens", "--mem-lens", stacklevel=2)
        mem_lens = cache_lens
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"--device {device} was asked for but CUDA is not available here; use --device cpu."
        )
    if threads < 1 or batch_size < 1 or not (0 < min_run_time < math.inf):
        raise ConfigError(
            "--threads and --batch-size must be at least 1 and --min-run-time a number of seconds "
            f"above 0, got {threads}, {batch_size} and {min_run_time}."
        )
    check_threads(threads, "--threads")
    specs = bench_specs(encodings) if encodings else tuple(EncodingSpec(n) for n in BUILTINS)
    for spec in specs:
        check_encoding_options(spec.name, spec.options, f"--encodings entry {spec.display()!r}")
    config = BenchConfig(
        batch_size=batch_size,
        device=device,
        threads=threads,
        min_run_time=min_run_time,
        memory=memory,
        plugin_dirs=loaded_plugin_dirs(),
    )
    for flag, value, name in (
        ("--seq-lens", seq_lens, "seq_lens"),
        ("--mem-lens", mem_lens, "mem_lens"),
        ("--window-lens", window_lens, "window_lens"),
    ):
        if value is not None:
            lengths = _int_list(value, flag)
            shortest = 0 if name == "mem_lens" else 1
            if not lengths or min(lengths) < shortest:
                raise ConfigError(f"{flag} needs lengths of at least {shortest}, got {value!r}.")
            config = dataclasses.replace(config, **{name: lengths})
    check_bench_lengths(specs, config)
    with console.status("") as status:
        ids = run_bench(
            config, specs, out, force, lambda label: status.update(Text(f"profiling {label} ..."))
        )
    print_bench(console, out, device)
    failed = {
        folder.label(): (folder.result() or {}).get("error", "unknown error")
        for folder in (RunFolder(out / run_id) for run_id in ids)
        if not folder.is_finished()
    }
    for label, error in failed.items():
        err_console.print(Text(f"FAILED {label}: {error}", style="bold red"), soft_wrap=True)
    if failed:
        raise typer.Exit(1)


@app.command("report")
@user_errors
def report_command(
    results_dir: Path = typer.Argument(
        ...,
        help="A sweep folder written by `posbench run` or `posbench bench`, or a sweep archive "
        "(.tar.xz) written by `posbench export`.",
    ),
    out: Optional[Path] = typer.Option(
        None,
        "-o",
        "--out",
        help="Report folder. Default: reports/<name> for results/<name>, the archive's folder "
        "for an archive, else <sweep folder>/report.",
    ),
    link_figures: Optional[str] = typer.Option(
        None,
        "--link-figures",
        help="Figures (names in figures/, without .png, commas) that report.html shows from "
        "figures/ instead of embedding, for a published report whose README shows them.",
    ),
    probe: Optional[Path] = typer.Option(
        None,
        "--probe",
        help="A learning-rate probe's sweep folder (`posbench run --suite lr-probe`): the "
        "report adds its table and checks this sweep's ranking against it.",
    ),
) -> None:
    """Build results.csv, summary.csv, figures/ and a self-contained report.html from stored
    results."""
    from contextlib import ExitStack

    from posbench.report.terminal import print_overview
    from posbench.report.html import build_report, default_report_dir
    from posbench.store import opened_sweep

    linked = [name.strip() for name in (link_figures or "").split(",") if name.strip()]
    report_dir = out or default_report_dir(results_dir)
    with sigterm_interrupts(), ExitStack() as opened:
        sweep_dir = opened.enter_context(opened_sweep(results_dir))
        probe_dir = None if probe is None else opened.enter_context(opened_sweep(probe, "--probe"))
        try:
            written = build_report(
                sweep_dir, report_dir, linked, probe_dir, source=results_dir, probe_source=probe
            )
        except KeyboardInterrupt as interrupt:
            _stop(
                interrupt,
                f"{report_dir} holds its previous report or the whole new one, never a mix; run "
                "the same command again to write the report.",
            )
    print_overview(console, written.overview, written.unranked)
    for problem in written.problems:
        err_console.print(Text(f"skipped: {problem}", style="yellow"), soft_wrap=True)
    if written.missing:
        console.print(Text(f"partial sweep: {len(written.missing)} run(s) not finished"))
    if written.other_runs:
        console.print(
            Text(
                f"{len(written.other_runs)} run(s) of other configurations in {results_dir} are "
                "kept but not included"
            )
        )
    console.print(Text(f"report: {written.html}"), soft_wrap=True)
    console.print(
        Text(f"tables: {written.results_csv}, {written.summary_csv}, {written.by_length_csv}"),
        soft_wrap=True,
    )


@app.command("index")
@user_errors
def index_command(
    reports_dir: Path = typer.Argument(
        Path("reports"), help="The folder that holds report folders (each with a report.html)."
    ),
    readme: Optional[Path] = typer.Option(
        None,
        help="Also write the reports' headline table (encodings x reports) into this Markdown "
        "file, between its lines <!-- headline:start --> and <!-- headline:end -->.",
    ),
) -> None:
    """Write REPORTS_DIR/index.html: one self-contained page linking every report there with
    its purpose, headline, date, code and compute."""
    from posbench.report.index import build_index, write_headline

    console.print(Text(f"index: {build_index(reports_dir)}"), soft_wrap=True)
    if readme is not None:
        write_headline(reports_dir, readme)
        console.print(Text(f"headline table: {readme}"), soft_wrap=True)


@app.command("export")
@user_errors
def export_command(
    results_dir: Path = typer.Argument(..., help="A sweep folder written by `posbench run`."),
    dest: Path = typer.Argument(
        ..., help="The folder to write the run records into, e.g. reports/<name>/runs."
    ),
) -> None:
    """Copy a sweep's finished runs without their trained weights: the records a published
    report is checked against, small enough to keep in git, and a sweep that `posbench run
    --out` on a copy of it resumes (it trains only the runs the copy lacks)."""
    from posbench.store import export_sweep

    with sigterm_interrupts():
        try:
            summary = export_sweep(results_dir, dest)
        except KeyboardInterrupt as interrupt:
            _stop(
                interrupt,
                f"each run in {dest} is whole or absent; run the same command again to finish.",
            )
    console.print(
        Text(
            f"exported {summary.exported} finished run(s) to {dest} ({summary.bytes / 1e6:.1f} MB, "
            f"without trained weights); {summary.unfinished} run(s) of the sweep not finished"
        ),
        soft_wrap=True,
    )


@app.command("inspect")
@user_errors
def inspect_command(
    run_dir: Path = typer.Argument(
        ..., help="One run's folder inside a sweep folder, e.g. results/default/<run id>."
    ),
) -> None:
    """Print one stored run's score terms, health flags and attention distance (for debugging an
    encoding)."""
    from posbench.report.inspect import print_inspection

    print_inspection(console, run_dir)


def main() -> None:
    """Console-script entry point."""
    from posbench.kernels.cpu import keep_freed_memory
    from posbench.warning_lines import show_warnings_as_lines

    show_warnings_as_lines()
    # Old spellings of posbench's names, on the command line or in a plugin, are the user's to
    # hear about (Python shows a DeprecationWarning only where __main__ triggers it).
    warnings.filterwarnings(
        "default", message=r".* will be removed in posbench", category=DeprecationWarning
    )
    keep_freed_memory()
    app(prog_name="posbench")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
