"""NanoCodec decode speed on a GPU, by variant: ms per decoded frame for the chunk lengths the streamed
pipeline decodes (chunk + the 25-frame left context), and each variant's waveform against the current
path's (correlation, max abs difference). Variants: gemm (the current conv1d as one GEMM over k shifted
copies), conv (MLX's own conv1d), compiled (mx.compile over the whole decode), bf16 (weights and
activations in bfloat16), and their combinations.

    PYTHONPATH=. python3 benchmarks/magpie_codec_probe.py [--model dummy:magpie-357m] [--log out.txt]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

import metalgen.models.qwen3_tts.speech_decoder as SD
from metalgen.tts import load

LOG = []


def say(s):
    print(s, flush=True)
    LOG.append(s)


def conv1d_mlx(x, weight, bias, dilation=1, stride=1):
    y = mx.conv1d(x, weight, stride=stride, dilation=dilation)
    return y if bias is None else y + bias


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:magpie-357m")
    ap.add_argument("--log", default=None)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    tts = load(args.model)
    codec = tts.codec
    rng = np.random.default_rng(0)
    C, V = codec.args.num_codebooks, codec.args.codebook_size
    lengths = [29, 49, 89, 153]
    codes = {n: mx.array(rng.integers(0, V, (1, C, n)).astype(np.int32)) for n in lengths}
    gemm = SD.conv1d_gemm
    base = {}
    say(f"# codec probe {mx.default_device()} {args.model}")
    for name in ("gemm", "conv", "compiled", "conv+compiled", "bf16", "bf16+conv", "bf16+conv+compiled"):
        SD.conv1d_gemm = conv1d_mlx if "conv" in name else gemm
        dtype = mx.bfloat16 if "bf16" in name else mx.float32
        codec.set_dtype(dtype)
        mx.eval(codec.parameters())
        fn = mx.compile(codec.decode) if "compiled" in name else codec.decode
        row = []
        for n in lengths:
            out = fn(codes[n])
            mx.eval(out)
            ts = []
            for _ in range(args.reps):
                t = time.perf_counter()
                mx.eval(fn(codes[n]))
                ts.append(time.perf_counter() - t)
            ms = statistics.median(ts) * 1e3
            w = np.array(out.astype(mx.float32)).ravel()
            if name == "gemm":
                base[n] = w
                cmp = ""
            else:
                b = base[n]
                cmp = f" corr {np.corrcoef(w, b)[0, 1]:.6f} maxabs {np.abs(w - b).max():.2e}"
            row.append(f"{n}f {ms:7.2f} ms ({ms / max(1, n - 25):.3f}/new frame){cmp}")
        say(f"{name:20s} " + " | ".join(row))
    SD.conv1d_gemm = gemm
    if args.log:
        with open(args.log, "w") as f:
            f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
