"""Latency and peak memory of one attention layer per encoding (the same attention code that
training uses), across sequence lengths and memory lengths, each encoding timed side by side
with the `nope` baseline so ratios come from one run.

Timing uses torch.utils.benchmark (warm-up, blocked autorange; median and IQR) with a fixed,
recorded thread count, the encoding and the baseline alternating over LATENCY_ROUNDS rounds
(the fastest round's median counts: on a shared machine interference only adds time). Peak memory is
measured, not estimated: on CUDA the allocator's peak;
on CPU each encoding runs in a fresh child process that resets its resident high-water mark
(/proc/self/clear_refs) before each measurement and reads VmHWM after it, with glibc's mmap
threshold fixed so freed tensors leave the resident set."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Iterable

import torch
from torch import Tensor, nn

from posbench.attention import SelfAttention, attention_tensor_bytes
from posbench.cache import Cache
from posbench.experiment.config import EncodingSpec, config_id, parse_specs, run_label, to_jsonable
from posbench.kernels import served
from posbench.kernels.cpu import compute_settings, configure_cpu
from posbench.model import run_layers
from posbench.encodings import REGISTRY as ENCODINGS, create_encoding
from posbench.errors import ConfigError
from posbench.encodings.base import Span
from posbench.experiment.compute import RunOutput
from posbench.experiment.environment import environment
from posbench.store import PROFILE_PREFIX
from posbench.experiment.memory import (
    MEMORY_HEADROOM,
    MEMORY_METHOD,
    available_bytes,
    measure_peak_mb,
    peak_or_none,
    too_big,
)
from posbench.experiment.timing import Guarded, guarded, interleaved_times, noise_note, time_ms

BASELINE = "nope"
#: Latency is timed in this many interleaved rounds per layer; the fastest round's median counts.
LATENCY_ROUNDS = 2


@dataclass(frozen=True)
class BenchConfig:
    """What `posbench bench` measures, and at which sizes."""

    seq_lens: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096)
    mem_lens: tuple[int, ...] = (
        0,
        128,
        512,
        1024,
        2048,
        4096,
    )  # decoding through a memory of M positions
    window_lens: tuple[int, ...] = (512, 1024, 2048)  # segment-with-cache vs sliding window
    window: int = 128  # segment length S and sliding-window size W for that comparison
    batch_size: int = 8
    n_heads: int = 4
    d_head: int = 32
    device: str = "cpu"
    threads: int = 2
    min_run_time: float = 0.2
    memory: bool = True
    plugin_dirs: tuple[str, ...] = field(default_factory=tuple)


SMALL_PROFILE = BenchConfig(
    seq_lens=(64, 128, 256),
    mem_lens=(0, 64, 256),
    window_lens=(256,),
    window=32,
    batch_size=4,
    min_run_time=0.05,
)
QUICK_PROFILE = BenchConfig(
    seq_lens=(64, 128),
    mem_lens=(0, 64),
    window_lens=(128,),
    window=32,
    batch_size=4,
    min_run_time=0.02,
)


def bench_specs(text: str) -> tuple[EncodingSpec, ...]:
    """What `posbench bench --encodings` names: entries separated by ``;``; one without ``:``
    is names, commas and wildcards (``txl,t5``, ``rope*``), one with ``:`` an encoding with
    options and an optional label (``rope:scaling=yarn,factor=4,label=yarn4``, see
    config.parse_specs). Unknown names are one sentence with suggestions."""
    specs: list[EncodingSpec] = []
    for part in (p.strip() for p in text.split(";")):
        if ":" in part:
            (spec,) = parse_specs(part, "--encodings")
            ENCODINGS.get(spec.name)  # an unknown name: one sentence with suggestions
            specs.append(spec)
        elif part:
            specs += [EncodingSpec(name) for name in ENCODINGS.select(part)]
    if not specs:
        raise ConfigError(
            "--encodings names no encoding; give at least one, e.g. --encodings alibi,t5."
        )
    return tuple(specs)


#: A lower bound on the float32 tensors of shape (batch, length, d_model) that forward+backward
#: of one attention layer holds at once (inputs, projections, outputs and their gradients):
#: NoPE's measured peak at L = 256 is about 10 of them.
ACTIVATION_COPIES = 8


def check_bench_lengths(specs: tuple[EncodingSpec, ...], config: BenchConfig) -> None:
    """Refuse, in one sentence and before anything is written, a sequence length whose largest
    attention tensor alone would not fit in the memory available now."""
    free = available_bytes(config.device)
    if free is None:
        return
    longest = max(config.seq_lens + config.window_lens)
    d_model = config.n_heads * config.d_head
    for spec in specs:
        encoding = create_encoding(
            spec.name, config.n_heads, config.d_head, True, 1, **dict(spec.options)
        )
        activations = ACTIVATION_COPIES * 4 * config.batch_size * longest * d_model
        needed = attention_tensor_bytes(encoding, config.batch_size, longest) + activations
        if needed > MEMORY_HEADROOM * free:
            raise ConfigError(
                f"length {longest} with {spec.display()!r} needs at least {needed / 2**30:.1f} "
                f"GiB (its attention tensor and the layer's activations), more than the "
                f"{free / 2**30:.1f} GiB available; lower --seq-lens / --window-lens or "
                "--batch-size."
            )


class AttentionUnderTest(nn.Module):
    """One attention layer with its projections and an encoding, as the decoder runs it."""

    def __init__(self, spec: EncodingSpec, n_heads: int, d_head: int) -> None:
        super().__init__()
        self.encoding = create_encoding(spec.name, n_heads, d_head, True, 1, **dict(spec.options))
        self.attn = SelfAttention(n_heads * d_head, n_heads, 0)

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        return run_layers(self.encoding, [self.attn], x, cache)

    def new_cache(self, mem_len: float, length: int | None = None) -> Cache:
        return Cache.for_stream(1, mem_len, self.encoding, length)


def interleaved(runs: dict[Hashable, Callable[[], Any]], config: BenchConfig) -> Guarded:
    """The runs timed in alternation (see posbench.experiment.timing), under the noise guard."""
    return guarded(
        lambda: interleaved_times(runs, config.threads, config.min_run_time, LATENCY_ROUNDS)
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _layer(spec: EncodingSpec, config: BenchConfig) -> AttentionUnderTest:
    torch.manual_seed(0)
    return AttentionUnderTest(spec, config.n_heads, config.d_head).to(config.device)


def _row(
    metric: str,
    value: float,
    seq_len: int | None = None,
    mem_len: int | None = None,
    note: str = "",
) -> dict[str, Any]:
    """A tidy profile row: at a sequence length and/or through a memory of `mem_len` positions."""
    return {
        "eval_len": None,
        "position": None,
        "mem_len": mem_len,
        "seq_len": seq_len,
        "metric": metric,
        "value": value,
        "note": note,
    }


def _unsupported_reason(layer: AttentionUnderTest, stop: int) -> str | None:
    return layer.encoding.supports(Span(0, stop))


def latency_rows(spec: EncodingSpec, config: BenchConfig) -> list[dict[str, Any]]:
    """Forward and forward+backward latency across sequence lengths, each next to `nope`."""
    rows = []
    layers = {"enc": _layer(spec, config), "base": _layer(EncodingSpec(BASELINE), config)}
    d_model = config.n_heads * config.d_head
    measured: tuple[int, float] | None = None  # (length, peak MiB) of the encoding's last fwd+bwd
    for L in config.seq_lens:
        reason = _unsupported_reason(layers["enc"], L) or too_big(measured, L, config.device)
        if reason:
            rows += [
                _row(m, math.nan, L, note=reason) for m in ("latency_fwd_ms", "latency_fwdbwd_ms")
            ]
            continue
        x = torch.randn(config.batch_size, L, d_model, device=config.device)
        runs: dict[tuple[str, str], Callable[[], Any]] = {}
        for name, layer in layers.items():

            def forward(layer: nn.Module = layer) -> None:
                with torch.no_grad():
                    layer(x)
                _sync(config.device)

            def forward_backward(layer: nn.Module = layer) -> None:
                layer(x).sum().backward()
                _sync(config.device)

            runs[(name, "fwd")], runs[(name, "fwdbwd")] = forward, forward_backward
        guard = interleaved(runs, config)  # baseline and encoding alternate
        times = guard.value
        for kind in ("fwd", "fwdbwd"):
            median, iqr = times[("enc", kind)]
            note = noise_note(guard, (median, iqr), times[("base", kind)])
            rows += [
                _row(f"latency_{kind}_ms", median, L, note=note),
                _row(f"latency_{kind}_iqr_ms", iqr, L, note=note),
                _row(f"latency_{kind}_ratio", median / times[("base", kind)][0], L, note=note),
            ]
        rows.append(
            _row(
                "attention_tensor_mb",
                attention_tensor_bytes(layers["enc"].encoding, config.batch_size, L) / 2**20,
                L,
            )
        )
        peak = peak_or_none(runs[("enc", "fwdbwd")], config.device)
        measured = (L, peak) if peak is not None else measured
    return rows


def decode_rows(spec: EncodingSpec, config: BenchConfig) -> list[dict[str, Any]]:
    """Per-token decoding latency through a memory holding `mem_len` positions."""
    rows = []
    d_model = config.n_heads * config.d_head
    for name, layer in (
        ("enc", _layer(spec, config)),
        ("base", _layer(EncodingSpec(BASELINE), config)),
    ):
        for M in config.mem_lens:
            reason = _unsupported_reason(layer, M + 64)
            if layer.encoding.draws_positions:
                reason = (
                    "drawn positions need the stream's length up front; "
                    "open-ended decoding is not timed"
                )
            if reason:
                if name == "enc":
                    rows.append(_row("latency_decode_ms", math.nan, mem_len=M, note=reason))
                continue
            cache = layer.new_cache(mem_len=M)
            with torch.no_grad():
                for start in range(0, M, 512):  # prefill in chunks through the cache
                    layer(
                        torch.randn(
                            config.batch_size, min(512, M - start), d_model, device=config.device
                        ),
                        cache,
                    )
            token = torch.randn(config.batch_size, 1, d_model, device=config.device)

            def step() -> None:
                with torch.no_grad():
                    layer(token, cache)
                _sync(config.device)

            guard = guarded(lambda: time_ms(step, config.threads, config.min_run_time))
            median, iqr = guard.value
            note = noise_note(guard, (median, iqr))
            if name == "enc":
                rows += [
                    _row("latency_decode_ms", median, mem_len=M, note=note),
                    _row("latency_decode_iqr_ms", iqr, mem_len=M, note=note),
                ]
            else:
                for row in rows:
                    if (
                        row["metric"] == "latency_decode_ms"
                        and row["mem_len"] == M
                        and not math.isnan(row["value"])
                    ):
                        both = "; ".join(dict.fromkeys(filter(None, (row["note"], note))))
                        rows.append(
                            _row(
                                "latency_decode_ratio", row["value"] / median, mem_len=M, note=both
                            )
                        )
    return rows


def window_rows(spec: EncodingSpec, config: BenchConfig) -> list[dict[str, Any]]:
    """Transformer-XL's speed argument in miniature: a sequence evaluated in segments of S
    through a cache of S positions, against recomputing a window of S tokens for every token."""
    rows = []
    layer = _layer(spec, config)
    S = config.window
    d_model = config.n_heads * config.d_head
    for N in config.window_lens:
        reason = _unsupported_reason(layer, N)
        if reason:
            rows.append(_row("speedup_segment_vs_window", math.nan, N, S, reason))
            continue
        x = torch.randn(1, N, d_model, device=config.device)

        def segments() -> None:
            cache = layer.new_cache(mem_len=S, length=N)
            with torch.no_grad():
                for start in range(0, N, S):
                    layer(x[:, start : start + S], cache)
            _sync(config.device)

        def sliding() -> None:
            with torch.no_grad():
                for t in range(N):
                    lo = max(0, t + 1 - S)
                    # positions restart in every window: the usual sliding-window evaluation
                    layer(x[:, lo : t + 1])
            _sync(config.device)

        guard = guarded(lambda: (_once(segments), _once(sliding)))
        seg, win = guard.value
        note = guard.note()
        rows += [
            _row("latency_segment_eval_ms", seg, N, S, note),
            _row("latency_sliding_window_ms", win, N, S, note),
            _row("speedup_segment_vs_window", win / seg, N, S, note),
        ]
    return rows


def _once(fn: Callable[[], None], repeats: int = 3) -> float:
    """Median wall time of a few whole runs, in ms (for runs too long for autorange)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def memory_rows_here(spec: EncodingSpec, config: BenchConfig) -> list[dict[str, Any]]:
    """Peak memory of forward+backward at each sequence length, measured in this process."""
    configure_cpu(config.threads)
    layer = _layer(spec, config)
    d_model = config.n_heads * config.d_head
    rows = []
    measured: tuple[int, float] | None = None
    for L in config.seq_lens:
        reason = _unsupported_reason(layer, L) or too_big(measured, L, config.device)
        if reason:
            rows.append(_row("peak_mem_mb", math.nan, L, note=reason))
            continue
        x = torch.randn(config.batch_size, L, d_model, device=config.device)
        layer(x[:, :8]).sum().backward()  # warm-up outside the measurement
        layer.zero_grad(set_to_none=True)
        peak = measure_peak_mb(lambda: layer(x).sum().backward(), config.device)
        rows.append(_row("peak_mem_mb", peak, L))
        measured = (L, peak)
        layer.zero_grad(set_to_none=True)
    return rows


def memory_rows(spec: EncodingSpec, config: BenchConfig) -> list[dict[str, Any]]:
    """Peak memory rows; on CPU measured in a fresh child process (see the module docstring)."""
    if config.device.startswith("cuda"):
        return memory_rows_here(spec, config)
    payload = json.dumps({"spec": asdict(spec), "config": asdict(config)})
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    proc = subprocess.run(
        [sys.executable, "-m", "posbench.experiment.profiling", payload],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["memory probe failed"])[-1]
        return [_row("peak_mem_mb", math.nan, L, note=reason) for L in config.seq_lens]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def profile_encoding(
    spec: EncodingSpec,
    config: BenchConfig,
    parts: Iterable[str] = ("latency", "decode", "window", "memory"),
) -> list[dict[str, Any]]:
    """Every profile row for one encoding."""
    configure_cpu(config.threads)
    producers = {
        "latency": latency_rows,
        "decode": decode_rows,
        "window": window_rows,
        "memory": memory_rows,
    }
    rows: list[dict[str, Any]] = []
    for part in parts:
        if part == "memory" and not config.memory:
            continue
        rows += producers[part](spec, config)
    return rows


def _child_main(payload: str) -> None:
    from posbench.plugins import load_worker_plugins

    data = json.loads(payload)
    config_data = data["config"]
    config = BenchConfig(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in config_data.items()}
    )
    load_worker_plugins(config.plugin_dirs)
    spec = EncodingSpec(
        data["spec"]["name"], data["spec"]["options"], data["spec"].get("label", "")
    )
    print(json.dumps(memory_rows_here(spec, config)))


# ---- storing profiles in the results store --------------------------------------------------
@dataclass(frozen=True)
class ProfileRun:
    """One encoding's profile: stored like a training run, in its own hashed folder."""

    encoding: EncodingSpec
    bench: BenchConfig

    def to_dict(self) -> dict[str, Any]:
        bench = asdict(self.bench)
        bench.pop("plugin_dirs")
        return {
            "kind": "profile",
            "encoding": to_jsonable(asdict(self.encoding)),
            "bench": to_jsonable(bench),
        }

    @property
    def run_id(self) -> str:
        return PROFILE_PREFIX + config_id(self.to_dict())

    @property
    def label(self) -> str:
        return run_label(None, self.encoding.display())


def profile_output(job: ProfileRun) -> RunOutput:
    """Profile one encoding in this process; a failure becomes an output with status "error"
    (one encoding's failure must not stop the others). The driver stores it."""
    config = job.bench
    env = environment(config.device) | {
        "torch_threads": config.threads,
        "memory_method": MEMORY_METHOD,
    }
    result: dict[str, Any] = {"encoding_label": job.encoding.display(), "kind": "profile"}
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    try:
        with compute_settings(config.threads), served.recording() as kernels:
            rows = profile_encoding(job.encoding, config)
        result["status"] = "ok"
        # which backend attention chose at each timed shape, and why each earlier one refused
        env["attention"] = dict(sorted(kernels.decisions.items()))
    except Exception as err:  # recorded; the sweep goes on with the next encoding
        result["status"], result["error"] = "error", f"{type(err).__name__}: {err}"
    result["seconds"] = time.perf_counter() - start
    return RunOutput(job.run_id, job.to_dict(), env, [], rows, None, result)


if __name__ == "__main__":  # the child process of memory_rows
    _child_main(sys.argv[1])
