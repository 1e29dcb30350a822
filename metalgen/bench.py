"""Decode and prefill speed, optionally next to mlx-lm.

mlx-lm runs in a process of its own, on weights of its own (metalgen/bench_mlx_lm.py), and only when a
comparison is asked for: it is an optional extra.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Dict, Iterator, Optional

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from .errors import MetalgenError
from .generate import generate_step


@dataclasses.dataclass
class BenchResult:
    engine: str
    prompt_tokens: int
    gen_tokens: int
    ttft_ms: float  # time to first token (prefill plus one step), median over runs
    prefill_tps: float
    decode_tps: float  # tokens after the first over their time, median over runs
    peak_memory_gb: float


def weight_bytes(model) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def active_weight_bytes(model) -> int:
    """The bytes a decode token must read: every weight, except that a sparse layer reads only top_k
    of its experts (and the embedding only one row, left in: it is the LM head too when tied)."""
    total = weight_bytes(model)
    moe = getattr(model.spec, "moe", None)
    if moe is None:
        return total
    stack = model.model
    for i in moe.sparse_layers:
        experts = sum(v.nbytes for _, v in tree_flatten(stack.layers[i].mlp.switch_mlp.parameters()))
        total -= experts - experts * moe.top_k // moe.num_experts
    return total


def copy_bandwidth(nbytes: int = 1 << 29, repeats: int = 10) -> float:
    """Measured device copy bandwidth in bytes/s (read + write), the decode speed limit's base."""
    x = mx.random.uniform(shape=(nbytes // 4,))
    mx.eval(x)
    times = []
    for _ in range(repeats):
        tic = time.perf_counter()
        y = x + 1.0  # one read and one write of every element
        mx.eval(y)
        times.append(time.perf_counter() - tic)
        del y
    return 2 * x.nbytes / statistics.median(times)


def time_generation(
    steps: Callable[[mx.array, int], Iterator], prompt: mx.array, gen_tokens: int, runs: int
):
    """Median (ttft seconds, decode tokens/s, peak bytes) of `runs` runs after a warm-up."""
    ttfts, rates, peaks = [], [], []
    for run in range(runs + 1):
        mx.synchronize()
        mx.reset_peak_memory()
        tic = time.perf_counter()
        it = steps(prompt, gen_tokens)
        next(it)
        first = time.perf_counter()
        n = sum(1 for _ in it)
        end = time.perf_counter()
        if run == 0:
            continue  # warm-up: compilation, allocation
        ttfts.append(first - tic)
        rates.append(n / (end - first))
        peaks.append(mx.get_peak_memory())
    return statistics.median(ttfts), statistics.median(rates), max(peaks)


# `metalgen bench`'s sampling settings (greedy, no penalty: the defaults of both engines)
SAMPLING_DEFAULTS = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                         repetition_context_size=20)


def metalgen_steps(model, decode: Optional[str] = None, sampling: Optional[dict] = None, seed: int = 0):
    """generate_step for time_generation, with `sampling` (SAMPLING_DEFAULTS' keys) seeded afresh each run."""
    from .sampling import make_logits_processors, make_sampler

    s = dict(SAMPLING_DEFAULTS, **(sampling or {}))

    def steps(prompt, n):
        sampler = make_sampler(s["temperature"], s["top_k"], s["top_p"], s["min_p"], seed=seed)
        procs = make_logits_processors(s["repetition_penalty"], s["repetition_context_size"])
        return generate_step(prompt, model, max_tokens=n, prefill_step_size=2048, decode=decode, sampler=sampler,
                             logits_processors=procs)

    return steps


def decode_path_name(model, decode: Optional[str] = None) -> str:
    """Which decode path `decode` resolves to on this model and backend (builds it, once)."""
    from .decode import decoder_for
    from .decode.path import takes_compiled

    # the order make_step takes them in: a stacked decoder where one runs, else the compiled path
    dec = decoder_for(model, decode)
    if dec is not None:
        return dec.name
    return "compiled" if takes_compiled(model, decode) else "plain"


def _graph_ops(outputs) -> int:
    """MLX operations in the (unevaluated) graph of `outputs`: the nodes of mx.export_to_dot."""
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".dot")
    os.close(fd)
    try:
        mx.export_to_dot(path, *outputs)
        with open(path) as f:
            return f.read().count("shape=rectangle")
    finally:
        os.unlink(path)


def ops_per_token(model, decode: Optional[str] = None, prompt_tokens: int = 8) -> int:
    """MLX operations that one decode token enqueues (model, LM head and sampler), counted on the
    graph of one step after a short prefill."""
    from .cache import make_prompt_cache
    from .decode import make_step
    from .generate import decode_step
    from .sampling import make_sampler

    prompt = mx.arange(1, prompt_tokens + 1).astype(mx.int32)
    cache = make_prompt_cache(model, decode="plain")
    sampler = make_sampler(seed=0)
    y, lp = decode_step(model, prompt, cache, sampler, (), None)
    mx.eval(y, lp, [c.state for c in cache])
    fast = make_step(model, cache, prompt_tokens, 4, decode)
    if fast is None:
        y2, lp2 = decode_step(model, y, cache, sampler, (), None)
    else:
        y2, lp2 = sampler(fast(y))
    n = _graph_ops([y2, lp2])
    mx.eval(y2, lp2)
    return n


def syncs_per_token(model, decode: Optional[str] = None, prompt_tokens: int = 8, gen_tokens: int = 16
                    ) -> float:
    """Host-device synchronizations per generated token, counted by profiling's own summary of
    an in-memory trace of one generation."""
    import io
    import json

    import profiling

    buf = io.StringIO()
    tracer = profiling.Tracer(buf, memory=False)
    prompt = mx.arange(1, prompt_tokens + 1).astype(mx.int32)
    for _ in generate_step(prompt, model, max_tokens=gen_tokens, tracer=tracer, decode=decode):
        pass
    events = [json.loads(line) for line in buf.getvalue().splitlines()]
    return profiling.summarize_events(events)["syncs_per_token"]


def mlx_lm_bench(source: str, *, dtype=None, prompt_tokens=128, gen_tokens=256, runs=3, seed=0,
                 sampling: Optional[dict] = None) -> BenchResult:
    """mlx-lm on `source` (a folder, hub id or dummy:<shape>) in a process of its own, holding its own
    weights (metalgen/bench_mlx_lm.py), on the same seeded prompt as `run_bench`."""
    import json
    import subprocess
    import sys

    try:
        import mlx_lm  # noqa: F401
    except ImportError:
        raise MetalgenError("--compare mlx-lm needs mlx-lm: pip install 'metalgen[bench]'")
    cmd = [sys.executable, "-m", "metalgen.bench_mlx_lm", source, str(prompt_tokens), str(gen_tokens), str(runs),
           str(seed), str(dtype) if dtype else "-"] + ([json.dumps(dict(SAMPLING_DEFAULTS, **sampling))] if sampling else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not lines:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise MetalgenError(f"mlx-lm's run on {source} failed: {last}")
    return BenchResult(**json.loads(lines[-1]))


def add_comparison(report: Dict[str, object], theirs: BenchResult) -> Dict[str, object]:
    """`report` (run_bench's) with another engine's result and the speed ratios against it."""
    ours = report["results"][0]
    report["results"].append(dataclasses.asdict(theirs))
    report["decode_ratio"] = ours["decode_tps"] / theirs.decode_tps
    report["prefill_ratio"] = ours["prefill_tps"] / theirs.prefill_tps
    return report


def run_bench(model, *, prompt_tokens=128, gen_tokens=256, runs=3, seed=0, decode: Optional[str] = None,
              profile: bool = False, sampling: Optional[dict] = None) -> Dict[str, object]:
    """Benchmark metalgen on `model` (`mlx_lm_bench` and `add_comparison` put mlx-lm beside it).

    decode: metalgen's decode path (metalgen.decode modes; None = the default, "auto").
    sampling: settings by SAMPLING_DEFAULTS' keys (greedy without them).
    profile: also count MLX operations and host-device syncs per token, plain path and ours.
    """
    if prompt_tokens < 1 or gen_tokens < 2 or runs < 1:
        raise MetalgenError("need --prompt-tokens >= 1, --gen-tokens >= 2 and --runs >= 1")
    vocab = model.spec.vocab_size
    prompt = mx.array(np.random.default_rng(seed).integers(0, min(vocab, 150000), prompt_tokens),
                      mx.int32)
    path = decode_path_name(model, decode)
    ttft, rate, peak = time_generation(metalgen_steps(model, decode, sampling, seed), prompt, gen_tokens, runs)
    results = [BenchResult("metalgen", prompt_tokens, gen_tokens, ttft * 1e3, prompt_tokens / ttft, rate, peak / 1e9)]
    nbytes = weight_bytes(model)
    bandwidth = copy_bandwidth()
    out = {
        "backend": __import__("kernels_metal").backend(),
        "device": str(mx.default_device()),
        "weight_gb": nbytes / 1e9,
        "active_weight_gb": active_weight_bytes(model) / 1e9,
        "copy_bandwidth_gbs": bandwidth / 1e9,
        "floor_decode_tps": bandwidth / active_weight_bytes(model),
        "decode_path": path,
        "sampling": dict(SAMPLING_DEFAULTS, **(sampling or {})),
        "results": [dataclasses.asdict(r) for r in results],
    }
    if profile:
        out["profile"] = {
            "plain": {"ops_per_token": ops_per_token(model, "plain"),
                      "syncs_per_token": syncs_per_token(model, "plain")},
            path: {"ops_per_token": ops_per_token(model, decode),
                   "syncs_per_token": syncs_per_token(model, decode)},
        }
    return out
