"""Load benchmark of OpenAI-compatible servers: `metalgen serve` against `mlx_lm.server`, same weights.

    PYTHONPATH=. python3 benchmarks/serve_load.py --model dummy:qwen3-0.6b [--engines metalgen,mlx_lm]
        [--concurrency 1,8,32,128] [--prompt-tokens 128] [--gen-tokens 128] [--max-batch 32]
        [--chat-tokens 4096] [--repeats 2] [--interleave] [--level-timeout S] --out DIR

An engine name may carry its own max batch: `metalgen@1` serves one request at a time (on the fast
decode path, with prefix reuse), `metalgen@32` batches up to 32.

For each engine a server is started in its own process on the same checkpoint folder (a `dummy:` shape
is written once as a Hugging Face folder from mlx-lm's own model class: metalgen.bench_mlx_lm), then for
each concurrency level that many clients stream `/v1/completions` (temperature 0, distinct prompts of
about --prompt-tokens tokens, --gen-tokens tokens each) until each has sent two requests; a level runs
--repeats times (default 2), each run with prompts of its own. Of 3 or more runs the median one of those after
the first is reported (the first meets batch sizes and shapes the server has not built kernels for), of
fewer the last; every run's rate is kept in the JSON (`runs_tok_s`; results from before 2026-11-26's
`--interleave` report the last run, with the others in `earlier_tok_s`). With --interleave, every engine's
server is started at once and each run of a level goes engine after engine, so that the machine's drift
(one tree moved by 15-25% between runs and leases of an H200, benchmarks/results/serve_load_h200_2026-11-26)
falls on every engine alike. Before 2026-11-26 every run of a level sent the same prompts, so that a run could
find them in the server's prefix cache, whole or in part as its budget evicted them: results/ from before then. Reported per
level: aggregate completion tokens/s (all tokens over the level's wall time), the time to first token
p50 / p99, and each stream's decode rate. With --chat-tokens, a two-turn chat (a prompt of that many
tokens, then the same conversation plus the reply and a new question, after a warm-up conversation (both
turns) of the same length) measures each turn's time to first token: the second turn's prefix is what a prefix
cache reuses.

Writes DIR/serve_load.jsonl (one object a level and engine), DIR/serve_load.md (the tables) and
DIR/serve_load.svg (aggregate tokens/s against concurrency). The client is the standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

WORDS = ("river stone garden light window market paper silver number music table winter summer letter "
         "bridge forest morning evening station engine harbor mountain village ocean signal pattern").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_checkpoint(model: str, folder: Path) -> Path:
    """A Hugging Face folder for a `dummy:` shape (mlx-lm's own model class and values, quantized as
    mlx_lm.convert would), with metalgen's embedded Qwen3 tokenizer; any other model is used as given."""
    if not model.startswith("dummy:"):
        return Path(model)
    if (folder / "config.json").exists():
        return folder
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from metalgen.bench_mlx_lm import _as_published, build_model
    from metalgen.dummy import dummy_config, tokenizer_folder

    config = _as_published(dummy_config(model[len("dummy:"):]))
    mlm = build_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(mlm.parameters())))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    for f in tokenizer_folder().iterdir():
        shutil.copy(f, folder / f.name)
    return folder


def start(engine: str, folder: Path, port: int, max_batch: int, log, profile: Optional[Path] = None,
          prefill_step: Optional[int] = None) -> subprocess.Popen:
    """Start a server; `engine` is metalgen or mlx_lm, with "@N" for a max batch of N (else max_batch); a
    metalgen server writes its JSONL trace to `profile` if given, and feeds prompts `prefill_step` tokens a
    chunk if given (else its default)."""
    engine, _, batch = engine.partition("@")
    max_batch = int(batch or max_batch)
    if engine == "metalgen":
        cmd = [sys.executable, "-m", "metalgen", "serve", "--model", str(folder), "--port", str(port),
               "--max-batch", str(max_batch)] + (["--profile", str(profile)] if profile else [])
        cmd += ["--prefill-step-size", str(prefill_step)] if prefill_step else []
    else:
        cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(folder), "--port", str(port),
               "--decode-concurrency", str(max_batch), "--prompt-concurrency", str(min(max_batch, 8))]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))


async def request(port: int, path: str, body: dict) -> Dict:
    """One streamed request: {ttft, end, tokens} (seconds from its start; tokens from the usage chunk,
    else the count of content chunks)."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    data = json.dumps(dict(body, stream=True, stream_options={"include_usage": True})).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()
    status = (await reader.readline()).decode()
    if " 200 " not in status:
        raise RuntimeError(f"{path}: {status.strip()} {(await reader.read())[:300]!r}")
    ttft, chunks, tokens = None, 0, None
    while True:
        line = await reader.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        obj = json.loads(payload)
        if obj.get("usage"):
            tokens = obj["usage"].get("completion_tokens")
        for c in obj.get("choices") or []:
            piece = c.get("text") or (c.get("delta") or {}).get("content")
            if piece:
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
    writer.close()
    return {"ttft": ttft, "end": time.perf_counter() - t0, "tokens": tokens if tokens is not None else chunks}


def prompt_text(rng: random.Random, n_tokens: int) -> str:
    # the words above are one token each with a leading space in Qwen's vocabulary (about)
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens))


async def level(port: int, name: str, concurrency: int, prompt_tokens: int, gen_tokens: int, seed: int,
                deadline: Optional[float] = None) -> Dict:
    """One run of a level. With `deadline` (seconds), requests still open then are dropped, and the run
    reports what finished by then over the deadline (`"requests"` of `"expected"`): a server that stalls
    under the load gives a row, not a run past the machine's time."""
    rng = random.Random(seed)
    per_client = 2
    results: List[Dict] = []
    # the prompts are drawn up front, so that a run's prompts do not depend on which requests finish first
    prompts = [[f"{i} {j} " + prompt_text(rng, prompt_tokens) for j in range(per_client)] for i in range(concurrency)]

    async def client(i: int) -> None:
        for prompt in prompts[i]:
            body = {"model": name, "prompt": prompt, "max_tokens": gen_tokens, "temperature": 0.0}
            results.append(await request(port, "/v1/completions", body))

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(client(i)) for i in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=deadline)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for t in tasks:  # a request's error (not a cancellation at the deadline) is the run's
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()
    wall = time.perf_counter() - t0 if not pending else deadline
    if not results:
        raise RuntimeError(f"no request of {concurrency} streams finished within {deadline} s")
    tokens = sum(r["tokens"] for r in results)
    ttfts = sorted(r["ttft"] for r in results if r["ttft"] is not None)
    rates = [(r["tokens"] - 1) / (r["end"] - r["ttft"]) for r in results if r["ttft"] and r["tokens"] > 1]
    return {"concurrency": concurrency, "requests": len(results), "expected": concurrency * per_client,
            "completion_tokens": tokens, "wall_s": wall,
            "aggregate_tok_s": tokens / wall, "ttft_p50_ms": 1e3 * statistics.median(ttfts),
            "ttft_p99_ms": 1e3 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "stream_tok_s_median": statistics.median(rates) if rates else None}


async def chat_turns(port: int, name: str, chat_tokens: int, seed: int) -> Dict:
    rng = random.Random(seed)
    # one token a turn, its whole latency the time to first token: a random model's first pieces may be
    # whitespace that a server holds back (a thinking block could still open), which would blur a TTFT
    body = {"model": name, "max_tokens": 1, "temperature": 0.0}
    # the reply's text is not needed for timing: the second turn appends a fixed assistant message
    turn2 = [{"role": "assistant", "content": "It lists places and things."},
             {"role": "user", "content": "Name three of them."}]
    # a first conversation of the same length, both turns, warms the server (kernels for a prompt this long,
    # and for a short one after a long cached prefix, are built on first use); then the measured one: its
    # first turn cold, its second turn after the first
    warm = [{"role": "user", "content": prompt_text(rng, chat_tokens) + "\nSummarize that."}]
    await request(port, "/v1/chat/completions", dict(body, messages=warm))
    await request(port, "/v1/chat/completions", dict(body, messages=warm + turn2))
    first = [{"role": "user", "content": prompt_text(rng, chat_tokens) + "\nSummarize that."}]
    t1 = (await request(port, "/v1/chat/completions", dict(body, messages=first)))["end"]
    second = first + turn2
    t2 = (await request(port, "/v1/chat/completions", dict(body, messages=second)))["end"]
    return {"chat_tokens": chat_tokens, "turn1_ttft_ms": 1e3 * t1, "turn2_ttft_ms": 1e3 * t2, "speedup": t1 / t2}


def table_row(r: Dict) -> str:
    """A level's row of the table: a run cut short by --level-timeout shows how many of its requests finished."""
    def rate(x, done, digits=0):
        k, n = done.split("/")
        return f"{x:.{digits}f}" + ("" if k == n else f" ({done})")

    done = r.get("runs_requests") or [f"{r['requests']}/{r['requests']}"] * len(r["runs_tok_s"])
    every = " / ".join(rate(x, d) for x, d in zip(r["runs_tok_s"], done))
    agg = rate(r["aggregate_tok_s"], f"{r['requests']}/{r.get('expected', r['requests'])}", 1)
    per_stream = f"{r['stream_tok_s_median']:.1f}" if r["stream_tok_s_median"] else "-"
    return (f"| {r['engine']} | {r['concurrency']} | {agg} | {every} | {r['ttft_p50_ms']:.1f} | "
            f"{r['ttft_p99_ms']:.1f} | {per_stream} |")


def reported_run(runs: List[Dict]) -> Dict:
    """The run a level reports: of three or more, the median one (by aggregate tokens/s) of those after the
    first, which meets batch sizes and prompt shapes the server has not run yet (MLX builds kernels on first
    use); of fewer, the last."""
    if len(runs) < 3:
        return runs[-1]
    warm = sorted(runs[1:], key=lambda r: r["aggregate_tok_s"])
    return warm[(len(warm) - 1) // 2]


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 600.0, path: str = "/v1/models") -> None:
    """Poll `path` of the server `proc` started on `port` until it answers (an error if it exits or times out)."""
    import urllib.request

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("the server did not come up")


def svg_plot(rows: List[Dict], path: Path) -> None:
    """Aggregate tokens/s against concurrency, one line an engine, log-2 x axis; plain SVG."""
    import math

    engines = sorted({r["engine"] for r in rows})
    xs = sorted({r["concurrency"] for r in rows})
    ymax = max(r["aggregate_tok_s"] for r in rows) * 1.1
    W, H, L, B = 640, 400, 60, 40

    def px(c):
        span = max(1e-9, math.log2(xs[-1]) - math.log2(xs[0]))
        return L + (W - L - 20) * (math.log2(c) - math.log2(xs[0])) / span

    def py(y):
        return H - B - (H - B - 20) * y / ymax

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
             f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
             f'<line x1="{L}" y1="{H - B}" x2="{W - 20}" y2="{H - B}" stroke="black"/>',
             f'<line x1="{L}" y1="20" x2="{L}" y2="{H - B}" stroke="black"/>',
             f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle">concurrent streams</text>',
             f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" text-anchor="middle">'
             'aggregate tokens/s</text>']
    for c in xs:
        parts.append(f'<text x="{px(c):.0f}" y="{H - B + 15}" text-anchor="middle">{c}</text>')
    for k in range(5):
        y = ymax * k / 4
        parts.append(f'<text x="{L - 5}" y="{py(y) + 4:.0f}" text-anchor="end">{y:.0f}</text>')
    colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"]
    for i, e in enumerate(engines):
        pts = sorted((r["concurrency"], r["aggregate_tok_s"]) for r in rows if r["engine"] == e)
        path_d = " ".join(f"{px(c):.1f},{py(y):.1f}" for c, y in pts)
        parts.append(f'<polyline points="{path_d}" fill="none" stroke="{colors[i % 4]}" stroke-width="2"/>')
        parts.append(f'<text x="{L + 10}" y="{30 + 16 * i}" fill="{colors[i % 4]}">{e}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--engines", default="metalgen,mlx_lm")
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--chat-tokens", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each level: of 3 or more the median of those after the first is reported, "
                         "else the last")
    ap.add_argument("--interleave", action="store_true",
                    help="start every engine's server at once and run each level's runs engine after engine, so "
                         "that the machine's drift over the runs falls on every engine alike")
    ap.add_argument("--level-timeout", type=float, default=None,
                    help="seconds a run of a level may take: requests open then are dropped and the run reports "
                         "what finished (its row says how many of how many)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefill-step-size", type=int, default=None,
                    help="metalgen servers' --prefill-step-size (default: theirs)")
    ap.add_argument("--profile", action="store_true",
                    help="metalgen servers write a JSONL trace (OUT/trace_<engine>.jsonl: prefill chunks, decode "
                         "steps, readbacks, each step's delivery of tokens)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder = write_checkpoint(args.model, out / "checkpoint")
    engines = args.engines.split(",")
    concurrency = [int(x) for x in args.concurrency.split(",")]
    rows = []
    servers: Dict[str, tuple] = {}  # engine -> (process, port, log)

    def serve(engine: str) -> int:
        """Start `engine`'s server, wait for it, warm it; its port."""
        port = free_port()
        log = open(out / f"server_{engine.replace('@', '_b')}.log", "w")
        trace = out / f"trace_{engine.replace('@', '_b')}.jsonl" if args.profile else None
        proc = start(engine, folder, port, args.max_batch, log, trace, args.prefill_step_size)
        servers[engine] = proc, port, log
        wait_ready(port, proc)
        asyncio.run(level(port, str(folder), 1, 16, 8, args.seed))  # warm-up: kernels built, first graphs made
        return port

    def stop(engine: str) -> None:
        proc, _, log = servers.pop(engine)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

    def run_level(engine: str, port: int, c: int, seed: int) -> Dict:
        return asyncio.run(level(port, str(folder), c, args.prompt_tokens, args.gen_tokens, seed, args.level_timeout))

    def report(engine: str, runs: List[Dict]) -> Dict:
        r = dict(reported_run(runs), engine=engine, model=args.model, max_batch=args.max_batch,
                 runs_tok_s=[x["aggregate_tok_s"] for x in runs],
                 runs_requests=[f"{x['requests']}/{x['expected']}" for x in runs])
        print(json.dumps(r), flush=True)
        print("level:", table_row(r), flush=True)  # as it comes, for a run that its machine's time cuts short
        jl.write(json.dumps(r) + "\n")
        rows.append(r)
        return r

    def chat(engine: str, port: int) -> None:
        r = dict(asyncio.run(chat_turns(port, str(folder), args.chat_tokens, args.seed)), engine=engine,
                 model=args.model)
        print(json.dumps(r), flush=True)
        jl.write(json.dumps(r) + "\n")
        rows.append(r)

    # each run of a level its own prompts: a run given the prompts of the one before would find them in the
    # server's prefix cache (or part of them, as its budget evicts), and measure that. Engines interleaved
    # get the same prompts in a run (each server has a cache of its own)
    def seeds(c: int) -> List[int]:
        return [args.seed * 1_000_003 + 1009 * c + run for run in range(args.repeats)]

    with open(out / "serve_load.jsonl", "a") as jl:
        try:
            if args.interleave:
                ports = {engine: serve(engine) for engine in engines}
                for c in concurrency:
                    runs: Dict[str, List[Dict]] = {engine: [] for engine in engines}
                    for seed in seeds(c):  # a run of each engine in turn: the machine's drift falls on both
                        for engine in engines:
                            runs[engine].append(run_level(engine, ports[engine], c, seed))
                    for engine in engines:
                        report(engine, runs[engine])
                if args.chat_tokens:
                    for engine in engines:
                        chat(engine, ports[engine])
            else:
                for engine in engines:
                    port = serve(engine)
                    for c in concurrency:
                        report(engine, [run_level(engine, port, c, seed) for seed in seeds(c)])
                    if args.chat_tokens:
                        chat(engine, port)
                    stop(engine)
        finally:
            for engine in list(servers):
                stop(engine)
    levels = [r for r in rows if "concurrency" in r]
    lines = [f"# {args.model}: prompt ~{args.prompt_tokens}, {args.gen_tokens} tokens, max batch {args.max_batch}",
             "", "| engine | streams | aggregate tok/s | every run's tok/s | TTFT p50 ms | TTFT p99 ms | per-stream tok/s |",
             "|---|---|---|---|---|---|---|"]
    for r in levels:
        lines.append(table_row(r))
    if any(r["requests"] < r.get("expected", r["requests"]) for r in levels):
        lines.append(f"\nA rate marked (k/n) counts the k of n requests that finished within --level-timeout "
                     f"{args.level_timeout:g} s, over that time.")
    for r in rows:
        if "chat_tokens" in r:
            lines.append(f"\n{r['engine']}: {r['chat_tokens']}-token chat, first token of turn 1 "
                         f"{r['turn1_ttft_ms']:.1f} ms, turn 2 {r['turn2_ttft_ms']:.1f} ms ({r['speedup']:.1f}x)")
    (out / "serve_load.md").write_text("\n".join(lines) + "\n")
    if levels:
        svg_plot(levels, out / "serve_load.svg")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
