"""NanoCodec's share of a streamed Magpie utterance by chunk schedule, on the codec alone: random codes
pushed two frames at a time (one decoder step of the 357M checkpoint) into `CodecStream`, every chunk
read back to the host as the real pipeline does. Prints ms of codec per frame, the count of decodes and
the first chunk's ms for each (first chunk, growth, largest chunk) at each utterance length.

    PYTHONPATH=. python3 benchmarks/magpie_codec_schedule.py [--model dummy:magpie-357m] [--log out.txt]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from metalgen.magpie.streaming import CodecStream
from metalgen.tts import load

VARIANTS = [(4, 2, 64), (4, 3, 64), (4, 4, 64), (4, 4, 128), (4, 2, 128)]  # (first chunk, growth, largest chunk)


def run_stream(codec, codes: np.ndarray, first: int, growth: int, chunk: int):
    stream = CodecStream(codec, chunk, first, growth=growth)
    calls, first_ms = 0, None
    mx.synchronize()
    tic = time.perf_counter()
    for t in range(0, codes.shape[1], 2):
        for _ in stream.push(codes[:, t : t + 2]):
            calls += 1
            first_ms = first_ms or (time.perf_counter() - tic) * 1e3
    for _ in stream.flush():
        calls += 1
    return time.perf_counter() - tic, calls, first_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:magpie-357m")
    ap.add_argument("--log", default=None)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    codec = load(args.model).codec
    rng = np.random.default_rng(0)
    C, V = codec.args.num_codebooks, codec.args.codebook_size
    lines = [f"# codec schedule probe {mx.default_device()} {args.model}"]
    print(lines[0], flush=True)
    for frames in (64, 128, 256):
        codes = rng.integers(0, V, (C, frames)).astype(np.int32)
        for first, growth, chunk in VARIANTS:
            run_stream(codec, codes, first, growth, chunk)  # warm-up: traces
            runs = [run_stream(codec, codes, first, growth, chunk) for _ in range(args.reps)]
            wall = statistics.median(r[0] for r in runs)
            line = (f"{frames:4d} frames  first {first} x{growth} to {chunk:3d}: "
                    f"{wall / frames * 1e3:6.3f} ms/frame, {runs[0][1]} decodes, {wall * 1e3:7.1f} ms, "
                    f"first chunk at {statistics.median(r[2] for r in runs):6.1f} ms")
            print(line, flush=True)
            lines.append(line)
    if args.log:
        with open(args.log, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
