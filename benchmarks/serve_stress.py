"""Fault stress of `metalgen serve` (issue 17): many requests from many concurrent clients, some of which
go away mid-stream or before their first token, then a check that the server is back to idle.

    PYTHONPATH=. python3 benchmarks/serve_stress.py [--url http://127.0.0.1:8080 | --model dummy:qwen3-0.6b
        --max-batch 8] [--requests 500] [--clients 64] [--max-tokens 32] [--cancel 0.3] [--seed 0]
        [--api-key KEY] [--json OUT]

Without --url it starts its own server (`metalgen serve`, in a process of its own on a free port) and
stops it afterwards. Each of --clients clients sends requests one after another until --requests have been
sent in all; each request is drawn from a generator seeded with --seed and its number, so a run is the
same requests whatever the scheduling: a chat or a text completion, streamed or not, sometimes n=2 or
logprobs, a random short prompt and max_tokens; a fraction --cancel of them is cancelled, half by a client
that reads one to three chunks of a stream and then drops the connection, half by one that drops it right
after sending (before its first token, streamed or not).

Reported (one JSON object; also written to --json): completed (a 200 whose every choice has a
finish_reason, streams ending in [DONE]), cancelled, errors (anything else, with samples), stuck (no answer
within --timeout), and after the run whether the engine went back to idle (GET /debug/engine: no jobs, no
queued requests, no batch rows, none waiting) with the server's memory (MLX active and cache memory, the
process RSS) before and after. Exit status 1 if a request errored or stuck or the engine did not go idle.
The client is the standard library only (asyncio streams), as benchmarks/serve_load.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from typing import Dict, List, Optional, Tuple
from urllib.parse import urlparse

from benchmarks.serve_load import free_port, wait_ready

WORDS = ("river stone garden light window market paper silver number music table winter summer letter "
         "bridge forest morning evening station engine harbor mountain village ocean signal pattern").split()


def plan(seed: int, i: int, name: str, max_tokens: int, cancel: float) -> Tuple[str, dict, str]:
    """Request i of a run: (path, body, action); action is "complete", "drop_mid_stream" or "drop_early"."""
    rng = random.Random(seed * 1_000_003 + i)
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    body = {"model": name, "max_tokens": rng.randint(1, max_tokens), "temperature": rng.choice([0.0, 0.7]),
            "stream": rng.random() < 0.6}
    if rng.random() < 0.5:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": words}]
        if rng.random() < 0.1:
            body.update(logprobs=True, top_logprobs=2)
    else:
        path = "/v1/completions"
        body["prompt"] = words
    if rng.random() < 0.1:
        body.update(n=2, seed=rng.randint(0, 1000))
    if body["stream"] and rng.random() < 0.3:
        body["stream_options"] = {"include_usage": True}
    action = "complete"
    if rng.random() < cancel:
        action = "drop_mid_stream" if body["stream"] and rng.random() < 0.5 else "drop_early"
    if action == "drop_mid_stream":
        body["max_tokens"] = max(body["max_tokens"], 4)  # (a stream of one chunk could end before the drop)
    return path, body, action


async def _send(host: str, port: int, method: str, path: str, body: Optional[dict], api_key: Optional[str]):
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
    data = json.dumps(body).encode() if body is not None else b""
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    await writer.drain()
    return reader, writer


async def _head(reader) -> int:
    """The response's status (its headers read)."""
    status = int((await reader.readline()).split()[1])
    while (await reader.readline()).strip():
        pass
    return status


def _finished(obj: dict) -> List[int]:
    return [c.get("index", 0) for c in obj.get("choices") or [] if c.get("finish_reason")]


async def one(host: str, port: int, path: str, body: dict, action: str, rng: random.Random,
              api_key: Optional[str]) -> Tuple[str, str]:
    """Run one planned request: ("completed" | "cancelled" | "error", detail)."""
    reader, writer = await _send(host, port, "POST", path, body, api_key)
    try:
        if action == "drop_early":
            await asyncio.sleep(rng.uniform(0, 0.01))
            writer.transport.abort()  # gone before its first token (a reset, not a polite close)
            return "cancelled", ""
        status = await _head(reader)
        if status != 200:
            return "error", f"{status} {(await reader.read())[:200]!r}"
        want = set(range(body.get("n", 1)))
        if not body["stream"]:
            obj = json.loads(await reader.read())
            done = set(_finished(obj))
            return ("completed", "") if done == want else ("error", f"finish reasons of {sorted(done)} only")
        drop_after = rng.randint(1, 3) if action == "drop_mid_stream" else None
        chunks, done = 0, set()
        while True:
            line = await reader.readline()
            if not line:
                return "error", "the stream ended without [DONE]"
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                return ("completed", "") if done == want else ("error", f"finish reasons of {sorted(done)} only")
            obj = json.loads(payload)
            if "error" in obj:
                return "error", json.dumps(obj)[:200]
            done.update(_finished(obj))
            chunks += 1
            if drop_after is not None and chunks >= drop_after and done != want:
                writer.transport.abort()  # gone mid-stream
                return "cancelled", ""
    finally:
        writer.close()


async def get_json(host: str, port: int, path: str, api_key: Optional[str]) -> dict:
    reader, writer = await _send(host, port, "GET", path, None, api_key)
    try:
        status = await _head(reader)
        body = await reader.read()
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {body[:200]!r}")
        return json.loads(body)
    finally:
        writer.close()


def idle(state: dict) -> bool:
    return not any(state.get(k) for k in ("jobs", "queued", "rows", "waiting"))


async def stress(host: str, port: int, name: str, *, requests: int = 500, clients: int = 64, max_tokens: int = 32,
                 cancel: float = 0.3, seed: int = 0, api_key: Optional[str] = None, timeout: float = 120.0,
                 idle_timeout: float = 30.0) -> Dict:
    """Run the stress against a server on host:port serving `name`; the report (see the module's doc)."""
    before = await get_json(host, port, "/debug/engine", api_key)
    counts = {"completed": 0, "cancelled": 0, "error": 0, "stuck": 0}
    samples: List[str] = []
    issued = iter(range(requests))

    async def client() -> None:
        for i in issued:  # a shared iterator: each request is sent once, by whichever client is free
            path, body, action = plan(seed, i, name, max_tokens, cancel)
            rng = random.Random(seed * 7_919 + i)
            try:
                outcome, detail = await asyncio.wait_for(one(host, port, path, body, action, rng, api_key), timeout)
            except asyncio.TimeoutError:
                outcome, detail = "stuck", f"no answer in {timeout} s"
            except (OSError, ValueError, IndexError) as e:
                outcome, detail = "error", f"{type(e).__name__}: {e}"
            counts[outcome] += 1
            if detail and len(samples) < 10:
                samples.append(f"#{i} {path} {action}: {detail}")

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    after = await get_json(host, port, "/debug/engine", api_key)
    while not idle(after["engine"]) and time.perf_counter() - t1 < idle_timeout:
        await asyncio.sleep(0.05)
        after = await get_json(host, port, "/debug/engine", api_key)
    return {"requests": requests, "clients": clients, "completed": counts["completed"],
            "cancelled": counts["cancelled"], "errors": counts["error"], "stuck": counts["stuck"],
            "wall_s": round(wall, 2), "engine_idle": idle(after["engine"]),
            "idle_after_s": round(time.perf_counter() - t1, 2), "engine": after["engine"],
            "memory_before": before["memory"], "memory_after": after["memory"], "error_samples": samples}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=None, help="a running server (default: start one)")
    ap.add_argument("--model", default="dummy:qwen3-0.6b", help="the model of the server started (without --url)")
    ap.add_argument("--max-batch", type=int, default=8, help="of the server started (without --url)")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32, help="each request asks for 1 to this many")
    ap.add_argument("--cancel", type=float, default=0.3, help="fraction of requests cancelled by their client")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a request counts as stuck")
    ap.add_argument("--api-key", default=os.environ.get("METALGEN_API_KEY"))
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    proc = None
    if args.url:
        u = urlparse(args.url)
        host, port = u.hostname or "127.0.0.1", u.port or 80
    else:
        host, port = "127.0.0.1", free_port()
        cmd = [sys.executable, "-m", "metalgen", "serve", "--model", args.model, "--port", str(port),
               "--max-batch", str(args.max_batch)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if args.api_key:
            env["METALGEN_API_KEY"] = args.api_key  # not on the command line, where ps shows it
        proc = subprocess.Popen(cmd, env=env)
    try:
        if proc is not None:
            wait_ready(port, proc, path="/health")
        name = asyncio.run(get_json(host, port, "/v1/models", args.api_key))["data"][0]["id"]
        report = asyncio.run(stress(host, port, name, requests=args.requests, clients=args.clients,
                                    max_tokens=args.max_tokens, cancel=args.cancel, seed=args.seed,
                                    api_key=args.api_key, timeout=args.timeout))
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["errors"] == report["stuck"] == 0 and report["engine_idle"] else 1


if __name__ == "__main__":
    sys.exit(main())
