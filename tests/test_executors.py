"""Executors: the same results whoever computes the runs; a dying worker is retried, then
recorded as failed; resume redoes only what is missing. Ray tests use a real local runtime."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from posbench.experiment.compute import SilentReporter
from posbench.errors import ConfigError
from posbench.experiment.executors import ProcessExecutor, make_executor
from posbench.plugins import load_plugin_dir
from posbench.store import RunFolder, read_json
from posbench.experiment.runner import run_sweep

from helpers import TINY_TOML, invoke, one_sentence_error, tiny_sweep, write_config

HAS_RAY = importlib.util.find_spec("ray") is not None
#: A Ray test that hangs (a starved machine, a lost actor) fails after this, with every thread's
#: stack, instead of stalling the suite; the thread method works even inside a blocking call.
RAY_TIMEOUT = pytest.mark.timeout(300, method="thread")


def four_runs():
    return dataclasses.replace(tiny_sweep("nope", "rope", "t5", "alibi"), threads=1)


def values(csv: Path) -> pd.DataFrame:
    frame = pd.read_csv(csv)
    return frame.sort_values(["run_id", "metric", "eval_len", "mem_len"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def local_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("local")
    return run_sweep(four_runs(), out).results_csv


@pytest.fixture(scope="module")
def dying_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plugins")
    (folder / "dying.py").write_text(
        textwrap.dedent(
            '''
            import os
            from posbench import PositionalEncoding, register_encoding

            @register_encoding("test_dying")
            class Dying(PositionalEncoding):
                """Kills its worker process abruptly during training."""

                def embed(self, x, span):
                    if self.training:
                        os._exit(13)
                    return x
            '''
        )
    )
    load_plugin_dir(folder)
    return folder


def test_processes_give_the_same_results(local_results: Path, tmp_path: Path) -> None:
    outcome = run_sweep(four_runs(), tmp_path / "sw", executor=ProcessExecutor(jobs=2))
    assert len(outcome.ran) == 4
    pd.testing.assert_frame_equal(values(outcome.results_csv), values(local_results))
    if sys.platform.startswith("linux"):  # posbench's own workers reuse freed memory (glibc)
        for run_id in outcome.ran:
            assert read_json(tmp_path / "sw" / run_id / "env.json")["freed_memory_kept"] is True


def test_processes_record_a_dead_worker_and_finish_the_rest(
    dying_plugin: Path, tmp_path: Path
) -> None:
    sweep = dataclasses.replace(tiny_sweep("nope", "test_dying", "rope"), threads=1)
    outcome = run_sweep(sweep, tmp_path / "sw", executor=ProcessExecutor(jobs=1))
    assert list(outcome.failures) == ["copy / test_dying / seed 0"]
    assert set(pd.read_csv(outcome.results_csv)["encoding"]) == {"nope", "rope"}


def test_unknown_executor_and_missing_ray_are_clear() -> None:
    with pytest.raises(ConfigError, match="Unknown executor 'dask'"):
        make_executor("dask")
    with pytest.raises(ConfigError, match="--jobs must be at least 1"):
        make_executor("processes", jobs=0)
    if not HAS_RAY:
        with pytest.raises(ConfigError, match=r"pip install 'posbench\[ray\]'"):
            make_executor("ray")


@pytest.fixture(scope="module")
def ray_runtime():
    if not HAS_RAY:
        pytest.skip("ray is not installed: pip install -e '.[ray]'")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class RecordingReporter(SilentReporter):
    """Keeps the (event, run label) pairs a sweep reports."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def run_started(self, run, steps: int) -> None:
        self.events.append(("started", run.label))

    def step(self, run, step: int, loss: float) -> None:
        self.events.append(("step", run.label))

    def evaluating(self, run) -> None:
        self.events.append(("evaluating", run.label))


@RAY_TIMEOUT
def test_ray_gives_the_same_results_and_forwards_worker_progress(
    ray_runtime, local_results: Path, tmp_path: Path
) -> None:
    reporter = RecordingReporter()
    outcome = run_sweep(
        four_runs(), tmp_path / "sw", executor=make_executor("ray"), reporter=reporter
    )
    assert len(outcome.ran) == 4 and not outcome.failures
    pd.testing.assert_frame_equal(values(outcome.results_csv), values(local_results))
    if sys.platform.startswith("linux"):  # Ray's workers reuse freed memory too (glibc)
        for run_id in outcome.ran:
            assert read_json(tmp_path / "sw" / run_id / "env.json")["freed_memory_kept"] is True
    for encoding in ("nope", "rope", "t5", "alibi"):
        for event in ("started", "step", "evaluating"):
            assert (event, f"copy / {encoding} / seed 0") in reporter.events


@RAY_TIMEOUT
def test_ray_retries_a_dying_worker_then_records_it(
    ray_runtime, dying_plugin: Path, tmp_path: Path
) -> None:
    sweep = dataclasses.replace(tiny_sweep("nope", "test_dying", "rope"), threads=1)
    outcome = run_sweep(sweep, tmp_path / "sw", executor=make_executor("ray"))
    failure = outcome.failures["copy / test_dying / seed 0"]
    assert "after 2 retries" in failure
    assert set(pd.read_csv(outcome.results_csv)["encoding"]) == {"nope", "rope"}


@RAY_TIMEOUT
def test_resume_across_executors_redoes_only_missing_runs(
    ray_runtime, local_results: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sw"
    first = run_sweep(
        dataclasses.replace(tiny_sweep("nope", "rope"), threads=1), out
    )  # local, half the sweep
    resumed = run_sweep(four_runs(), out, executor=make_executor("ray"))
    assert len(resumed.ran) == 2 and sorted(resumed.skipped) == sorted(first.ran)
    pd.testing.assert_frame_equal(values(resumed.results_csv), values(local_results))
    half = sorted(p for p in out.iterdir() if RunFolder(p).is_finished())
    (half[0] / "result.json").unlink()  # a run lost mid-way
    again = run_sweep(four_runs(), out, executor=make_executor("ray"))
    assert again.ran == [half[0].name]


@RAY_TIMEOUT
def test_ray_progress_never_waits_on_a_lost_mailbox(ray_runtime) -> None:
    """Workers post without waiting and the driver collects without blocking: a mailbox actor
    that is gone (or starved) costs progress lines, never a run or the driver's loop."""
    import time

    import ray

    from posbench.experiment.compute import posting_sink
    from posbench.experiment.ray_executor import MailboxReader, ProgressMailbox

    mailbox = ray.remote(num_cpus=0)(ProgressMailbox).remote()
    received: list[tuple] = []
    reader = MailboxReader(mailbox, lambda *event: received.append(event))
    send = posting_sink(mailbox.post.remote)
    send("r1", "started", 10)
    send("r1", "step", (1, 2.5))
    deadline = time.monotonic() + 60
    while len(received) < 2 and time.monotonic() < deadline:
        reader(0.25)
    assert received == [("r1", "started", 10), ("r1", "step", (1, 2.5))]  # in order
    ray.kill(mailbox)
    start = time.monotonic()
    for step in range(100):
        send("r1", "step", (step, 1.0))
    reader(0.0)
    reader(0.25)
    elapsed = time.monotonic() - start
    assert elapsed < 5, f"100 posts to a dead mailbox took {elapsed:.1f} s; they must not wait"
    assert len(received) == 2


@RAY_TIMEOUT
def test_ray_refuses_requests_no_node_can_meet(ray_runtime, tmp_path: Path) -> None:
    for executor, named in (
        (make_executor("ray", gpus_per_run=1000), "--gpus-per-run 1000 asks for more GPUs"),
        (make_executor("ray", cpus_per_run=64), "--cpus-per-run 64 asks for more CPUs"),
    ):
        with pytest.raises(ConfigError, match=named) as refused:
            run_sweep(tiny_sweep("nope"), tmp_path / "sw", executor=executor)
        assert "than any node of this machine's Ray runtime has" in str(refused.value)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--cpus-per-run", "-1"),
        ("--cpus-per-run", "nan"),
        ("--cpus-per-run", "0"),
        ("--gpus-per-run", "-1"),
        ("--gpus-per-run", "inf"),
    ],
)
def test_ray_resource_flags_out_of_range_are_one_sentence_before_anything_is_written(
    tmp_path: Path, flag: str, value: str
) -> None:
    if not HAS_RAY:
        pytest.skip("ray is not installed: pip install -e '.[ray]'")
    config = write_config(tmp_path)
    result = invoke(
        "run",
        "--config",
        str(config),
        "--executor",
        "ray",
        flag,
        value,
        "--out",
        str(tmp_path / "o"),
    )
    one_sentence_error(result, f"{flag} must be a number", f"got {value}")
    assert not (tmp_path / "o").exists()


# ---- workers die with their driver -----------------------------------------------------------
SLOW_TOML = (  # runs that train long enough to be killed mid-way
    TINY_TOML.replace(
        '"nope", { name = "t5", num_buckets = 8, max_distance = 16 }',
        '"nope", "rope", "alibi", "t5"',
    ).replace("steps = 3", "steps = 100000")
)


def _driver_with_training_workers(tmp_path: Path, executor: str = "processes"):
    """A `posbench run --executor processes --jobs 2` (or `--executor ray`, two CPUs) whose two
    workers are training."""
    import subprocess
    import sys
    import time

    import psutil

    config = tmp_path / "slow.toml"
    config.write_text(SLOW_TOML)
    log = (tmp_path / "driver.log").open("w")
    command = [
        sys.executable,
        "-m",
        "posbench.cli",
        "run",
        "--config",
        str(config),
        "--out",
        str(tmp_path / "out"),
        "--executor",
        executor,
        *(["--jobs", "2"] if executor == "processes" else []),
        "--threads",
        "1",
        "--no-report",
    ]
    driver = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        text = (tmp_path / "driver.log").read_text()
        if (
            text.count(": step ") >= 2
            and len({line.split(":")[2] for line in text.splitlines() if ": step " in line}) >= 2
        ):
            break
        assert driver.poll() is None, text
        time.sleep(0.2)
    else:
        driver.kill()
        raise AssertionError((tmp_path / "driver.log").read_text())
    children = psutil.Process(driver.pid).children(recursive=True)
    worker = "spawn_main" if executor == "processes" else "ray::_compute_on_ray"
    assert len([c for c in children if worker in " ".join(c.cmdline())]) == 2
    return driver, children


@pytest.mark.parametrize(
    ("executor", "signal_name"),
    [
        ("processes", "SIGTERM"),
        ("processes", "SIGKILL"),
        pytest.param("ray", "SIGTERM", marks=RAY_TIMEOUT),
        pytest.param("ray", "SIGKILL", marks=RAY_TIMEOUT),
    ],
)
def test_workers_and_their_helpers_die_with_the_driver(
    tmp_path: Path, executor: str, signal_name: str
) -> None:
    """Worker processes and the resource tracker (processes), or the whole local Ray runtime
    (ray: its agents outlived a killed driver by a minute), end with their driver; SIGTERM
    stops the sweep with its resume line."""
    import signal

    import psutil

    if executor == "ray" and not HAS_RAY:
        pytest.skip("ray is not installed: pip install -e '.[ray]'")
    driver, children = _driver_with_training_workers(tmp_path, executor)
    driver.send_signal(getattr(signal, signal_name))
    driver.wait(timeout=30)
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, [" ".join(p.cmdline()) for p in alive]
    text = (tmp_path / "driver.log").read_text()
    if signal_name == "SIGTERM":
        assert driver.returncode == 143, text
        assert (
            "terminated: 0 of 4 run(s) of this sweep are stored" in text
            and "run the same command again" in text
        )
        assert "Traceback" not in text and "SIGTERM received" not in text  # Ray's core dump
    # progress lines came from the workers, one per event, with no terminal
    assert text.count(": started, 100000 steps") >= 2
