"""What `metalgen serve` costs per token beyond the model: the batched engine's worker and the HTTP side
(detokenizing, events to the handlers, server-sent events), measured with a stand-in batch whose step takes
a fixed time and returns one token a row at once.

    PYTHONPATH=. python3 benchmarks/serve_overhead_probe.py [--step-ms 7] [--concurrency 8,32] [--tokens 128]

The stand-in sleeps `--step-ms` a step (the GPU's time, during which the worker holds no lock, as while it
waits for a readback), so a stream's rate shows how much the server adds to a step: at C streams, per
stream 1000 / (step_ms + overhead) tokens/s. The clients are benchmarks/serve_load.py's (raw sockets), in
this process: on a machine of few cores they share it with the server, so compare runs of one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from live_server import live_server  # noqa: E402
from serve_load import level  # noqa: E402

import metalgen  # noqa: E402
from metalgen.batch import BatchResponse  # noqa: E402
from metalgen.serve.app import make_app  # noqa: E402
from metalgen.serve.engine import Engine  # noqa: E402

NAME = "probe"


class InstantBatch:
    """BatchGenerator's interface as the engine uses it, without a model: every row gets a token a step
    (ids cycling through `vocab`), after `step_s` seconds."""

    def __init__(self, step_s: float, vocab: List[int], hold_s: float = 0.0):
        self.step_s, self.vocab, self.hold_s = step_s, vocab, hold_s
        self.rows: List[list] = []  # [uid, budget, generated]
        self.waiting: List[list] = []
        self.prefilling = None
        self.prefilled = 0
        self._uids = itertools.count()

    def insert(self, ids, max_tokens, *args, **kwargs) -> int:
        uid = next(self._uids)
        self.waiting.append([uid, max_tokens, 0])
        return uid

    def remove(self, uid: int) -> None:
        self.waiting = [r for r in self.waiting if r[0] != uid]
        self.rows = [r for r in self.rows if r[0] != uid]

    @property
    def joining(self) -> int:
        return len(self.waiting)

    @property
    def busy(self) -> bool:
        return bool(self.rows or self.waiting)

    def step(self) -> List[BatchResponse]:
        self.rows = [r for r in self.rows if r[2] < r[1]] + self.waiting
        self.waiting = []
        if not self.rows:
            return []
        # the engine's Python (building the step's graph) holds the GIL; MLX launching and waiting does not
        end = time.perf_counter() + self.hold_s
        while time.perf_counter() < end:
            pass
        time.sleep(self.step_s - self.hold_s)
        out = []
        for r in self.rows:
            token = self.vocab[(r[0] + r[2]) % len(self.vocab)]
            r[2] += 1
            out.append(BatchResponse(r[0], token, -1.0, "length" if r[2] >= r[1] else None))
        return out


class ProbeEngine(Engine):
    def __init__(self, *args, step_s: float, hold_s: float = 0.0, **kwargs):
        self._probe_step_s, self._probe_hold_s = step_s, hold_s
        super().__init__(*args, **kwargs)

    def _new_batch(self):
        words = "river stone garden light window market paper silver number music".split()
        vocab = [self.tokenizer.encode(" " + w, add_special_tokens=False)[0] for w in words]
        return InstantBatch(self._probe_step_s, vocab, self._probe_hold_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-ms", type=float, default=7.0)
    ap.add_argument("--concurrency", default="8,32")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hold-ms", type=float, default=0.0,
                    help="of each step, the part spent in Python holding the GIL (the engine building its graph)")
    ap.add_argument("--switch-ms", type=float, default=None,
                    help="Python's switch interval (default: Python's, 5 ms, as `metalgen serve` runs)")
    args = ap.parse_args()
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms / 1e3)
    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    engine = ProbeEngine(model, tok, NAME, decode="plain", max_batch=64, prefix_cache_gb=0,
                         step_s=args.step_ms / 1e3, hold_s=args.hold_ms / 1e3)
    print(f"stand-in step {args.step_ms} ms ({args.hold_ms} ms of it holding the GIL), {args.tokens} tokens a "
          f"request, two requests a client, switch interval {sys.getswitchinterval() * 1e3:.1f} ms")
    print(" streams  aggregate tok/s  per-stream tok/s  ms a step  (server's part)")
    with live_server(make_app(engine, args.tokens)) as port:
        for c in (int(x) for x in args.concurrency.split(",")):
            asyncio.run(level(port, NAME, c, 16, args.tokens, 0))  # warm
            r = asyncio.run(level(port, NAME, c, 16, args.tokens, 1))
            step = 1e3 / r["stream_tok_s_median"]
            print(f"{c:8d} {r['aggregate_tok_s']:16.1f} {r['stream_tok_s_median']:17.1f} {step:10.2f}  "
                  f"({step - args.step_ms:.2f})")


if __name__ == "__main__":
    main()
