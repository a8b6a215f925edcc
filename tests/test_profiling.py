"""The measurement plumbing on tiny sizes: memory probe, tidy rows, cache reuse in decoding."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch

import posbench
from posbench.experiment.config import EncodingSpec
from posbench.experiment.memory import measure_peak_mb, reset_peak_rss
from posbench.experiment.planner import STORED, plan_bench
from posbench.experiment.profiling import (
    BenchConfig,
    memory_rows,
    profile_encoding,
)
from posbench.experiment.runner import run_bench
from posbench.store import collect

from helpers import TINY_BENCH, invoke, one_sentence_error


needs_clear_refs = pytest.mark.skipif(not reset_peak_rss(), reason="no /proc/self/clear_refs here")


@needs_clear_refs
def test_memory_probe_sees_a_large_allocation() -> None:
    def allocate() -> None:
        block = torch.ones(64 * 2**20)  # 256 MiB of float32, touched
        del block

    seen, idle = measure_peak_mb(allocate), measure_peak_mb(lambda: None)
    assert seen >= 240, f"the probe saw {seen:.0f} MiB of a 256 MiB allocation"
    assert idle < 16, f"the probe saw {idle:.0f} MiB where nothing was allocated"


@needs_clear_refs
def test_memory_rows_from_a_child_process_grow_with_length() -> None:
    config = BenchConfig(seq_lens=(128, 1024), batch_size=4, n_heads=2, d_head=8, threads=1)
    rows = memory_rows(EncodingSpec("fire"), config)
    values = [r["value"] for r in rows]
    assert [r["seq_len"] for r in rows] == [128, 1024]
    assert all(v > 0 for v in values), rows
    # activations grow with the length (8x here); FIRE's bias, formed in the kernel's rows,
    # adds nothing of size L x L on top
    assert values[1] > 4 * values[0]


@pytest.mark.parametrize("encoding", ["nope", "alibi", "learned"])
def test_profile_rows_have_the_expected_shape(encoding: str) -> None:
    spec = EncodingSpec(encoding, {"max_positions": 20} if encoding == "learned" else {})
    rows = profile_encoding(spec, TINY_BENCH, parts=("latency", "decode", "window"))
    frame = pd.DataFrame(rows)
    latency = frame[frame["metric"] == "latency_fwdbwd_ms"]
    assert sorted(latency["seq_len"]) == [16, 32]
    decode = frame[frame["metric"] == "latency_decode_ms"]
    assert sorted(decode["mem_len"]) == [0, 8]
    if encoding == "learned":  # 32 tokens do not fit 20 positions: n/a with the reason
        na = latency[latency["seq_len"] == 32].iloc[0]
        assert math.isnan(na["value"]) and "0..19" in na["note"]
    else:
        assert (latency["value"] > 0).all()
        ratio = frame[frame["metric"] == "latency_fwdbwd_ratio"]["value"]
        assert (ratio > 0).all()
    assert {"speedup_segment_vs_window", "attention_tensor_mb"} <= set(frame["metric"])


def test_profiles_are_stored_as_tidy_rows_and_skipped_when_done(tmp_path: Path) -> None:
    config = TINY_BENCH.__class__(**{**TINY_BENCH.__dict__, "memory": False})
    (run_id,) = run_bench(config, (EncodingSpec("rope"),), tmp_path)
    assert run_id.startswith("profile-")
    written = (tmp_path / run_id / "result.json").stat().st_mtime_ns
    (job,) = plan_bench(config, (EncodingSpec("rope"),), tmp_path)
    assert job.action == STORED
    assert run_bench(config, (EncodingSpec("rope"),), tmp_path) == [run_id]
    assert (tmp_path / run_id / "result.json").stat().st_mtime_ns == written
    frame = collect(tmp_path)
    assert set(frame["encoding"]) == {"rope"} and frame["task"].isna().all()
    assert frame[frame["metric"] == "latency_fwd_ms"]["seq_len"].tolist() == [16, 32]


@pytest.mark.parametrize("encoding", posbench.list_encodings())
def test_decoding_reuses_position_tables(encoding: str) -> None:
    """After a prefill and a first decoding step, decoding token by token builds no bias or
    position table again (the prefill may read tables of its own: Transformer-XL's distance
    table on the CPU, where decoding reads key positions)."""
    torch.manual_seed(0)
    model = posbench.build_model(encoding, vocab_size=7, d_model=16, n_layers=2, n_heads=2).eval()
    cache = model.new_cache(mem_len=math.inf)
    with torch.no_grad():
        model(torch.randint(0, 7, (1, 70)), cache=cache)
        model(torch.randint(0, 7, (1, 1)), cache=cache)
        builds = model.encoding.table_builds
        for _ in range(40):  # stays within the doubled capacity (128)
            model(torch.randint(0, 7, (1, 1)), cache=cache)
    assert model.encoding.table_builds == builds


def test_attention_tensor_size_is_quadratic_only_for_dense_biases() -> None:
    from posbench.attention import attention_tensor_bytes
    from posbench.encodings import create_encoding

    sizes = {}
    for name in ("nope", "alibi", "t5", "txl", "deberta"):
        encoding = create_encoding(name, 2, 8)
        sizes[name] = (
            attention_tensor_bytes(encoding, 2, 256),
            attention_tensor_bytes(encoding, 2, 512),
        )
    assert sizes["alibi"][1] == 4 * sizes["alibi"][0] == 4 * 4 * 2 * 2 * 256 * 256
    for name in ("nope", "t5", "deberta", "txl"):  # no L x L tensor: band biases, folds
        assert sizes[name][1] == 2 * sizes[name][0], name


def test_bench_says_why_an_encoding_costs_more_than_nope(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    import posbench.report.bench as bench

    config = TINY_BENCH.__class__(**{**TINY_BENCH.__dict__, "memory": False, "window_lens": (24,)})
    run_bench(config, tuple(EncodingSpec(name) for name in ("nope", "fire", "cope")), tmp_path)
    monkeypatch.setattr(bench, "COST_NOTE_ABOVE", 0.0)  # every ratio counts as costly here
    console = Console(record=True, width=200)
    bench.print_bench(console, tmp_path)
    text = console.export_text()
    assert "fire:" in text and "the MLP is piecewise linear in its one input" in text
    assert "cope:" in text and "positions depend on content" in text
    assert "cope ran on " in text  # the attention backends, from each profile's env.json
    assert "L=32" in text and "L=24" not in text  # no column of n/a for the windows' length

    console = Console(record=True, width=200)
    bench.print_bench(console, tmp_path, "cuda")
    text = console.export_text()
    assert "fire:" not in text and "the MLP is piecewise linear" not in text
    assert "cost notes, which explain the CPU kernels, are left out" in text
    assert "results: " in text


def test_a_length_that_would_not_fit_in_memory_is_na_not_attempted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import posbench.experiment.memory as memory

    assert memory.too_big(None, 4096, "cpu") is None  # nothing measured yet: no guess
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1000 * 2**20)
    assert memory.too_big((1024, 100.0), 2048, "cpu") is None  # 400 MiB fits in 800
    reason = memory.too_big((1024, 100.0), 4096, "cpu")  # 1600 MiB does not
    assert reason.startswith(
        "would need about 1.6 GiB (grown quadratically from 100 MiB at L=1024), more than the 1.0 "
        "GiB"
    )
    monkeypatch.setattr(memory, "measure_peak_mb", lambda fn, device="cpu": 10.0)  # 10 MiB at L=16
    monkeypatch.setattr(
        memory, "available_bytes", lambda device: 20 * 2**20
    )  # 40 MiB at L=32 does not fit in 16
    rows = pd.DataFrame(profile_encoding(EncodingSpec("nope"), TINY_BENCH, parts=("latency",)))
    latency = rows[rows["metric"] == "latency_fwdbwd_ms"].set_index("seq_len")
    assert latency.loc[16, "value"] > 0 and math.isnan(latency.loc[32, "value"])
    assert (
        "would need about 0.0 GiB (grown quadratically from 10 MiB at L=16)"
        in latency.loc[32, "note"]
    )


def test_bench_takes_encodings_with_options_and_labels(tmp_path: Path) -> None:
    """Every row of the speed goals is one command: plain names and wildcards, and entries with
    options and labels as a sweep file gives them."""
    from posbench.errors import UnknownNameError
    from posbench.experiment.profiling import bench_specs

    specs = bench_specs("nope,alibi;rope:scaling=yarn,factor=4,original_length=8,label=yarn4; t5*")
    assert [s.display() for s in specs] == ["nope", "alibi", "yarn4", "t5"]
    assert specs[2].options == {"scaling": "yarn", "factor": 4, "original_length": 8}
    with pytest.raises(UnknownNameError, match="Did you mean alibi"):
        bench_specs("alibi;alibj:randomize_positions=64")
    out = tmp_path / "bench"
    result = invoke(
        "bench", "--encodings", "alibi;alibi:randomize_positions=64,label=alibi-drawn",
        "--seq-lens", "16", "--mem-lens", "0", "--window-lens", "16", "--no-memory",
        "--min-run-time", "0.001", "--threads", "1", "--batch-size", "2", "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ratios = collect(out).query("metric == 'latency_fwdbwd_ratio'")
    assert set(ratios["encoding_label"]) == {"alibi", "alibi-drawn"}
    bad = invoke("bench", "--encodings", "t5:num_buckets=1", "--out", str(tmp_path / "bad"))
    one_sentence_error(bad, "--encodings entry", "num_buckets")
