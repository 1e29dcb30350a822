"""Where the 12 Hz speech decoder's time goes, and what the alternatives cost (GPU probe).

    PYTHONPATH=. python3 benchmarks/tts_decoder_probe.py [frames ...]

For each chunk length (frames incl. left context) prints the decoder's time per call, split by
stage (quantizer + pre_conv, transformer, upsample, each decoder block, output), for the current
form (convs as GEMMs, float32) and for variants swapped in by patching the module: MLX's own
conv1d / conv_transpose1d, a compiled SnakeBeta, bf16 weights. Each variant's output is compared
with the current form's (max abs difference).
"""

from __future__ import annotations

import statistics
import sys
import time

import mlx.core as mx
import numpy as np

import metalgen.tts
from metalgen.models.qwen3_tts import speech_decoder as sd

REPS = 5


def timed(fn, reps=REPS):
    mx.eval(fn())
    mx.synchronize()
    ts = []
    for _ in range(reps):
        tic = time.perf_counter()
        mx.eval(fn())
        mx.synchronize()
        ts.append(time.perf_counter() - tic)
    return statistics.median(ts) * 1e3


def stages(dec, codes):
    """Callables for each stage, fed the previous stage's evaluated output."""
    out = {}
    h = dec.pre_conv(dec.quantizer.decode(codes))
    mx.eval(h)
    out["quant+pre_conv"] = (lambda: dec.pre_conv(dec.quantizer.decode(codes)))
    x1 = h
    out["transformer"] = (lambda: dec.pre_transformer(x1))
    h = dec.pre_transformer(h)
    mx.eval(h)
    x2 = h

    def up():
        y = x2
        for u, b in dec.upsample:
            y = b(u(y))
        return y

    out["upsample"] = up
    h = up()
    mx.eval(h)
    x = h
    for i, layer in enumerate(dec.decoder):
        xi = x
        out[f"decoder[{i}] {type(layer).__name__}"] = (lambda layer=layer, xi=xi: layer(xi))
        x = layer(xi)
        mx.eval(x)
    return out


def conv_native(x, weight, bias, dilation=1, stride=1):
    y = mx.conv1d(x, weight, stride=stride, dilation=dilation)
    return y if bias is None else y + bias


def convt_native(x, weight, bias, stride):
    y = mx.conv_transpose1d(x, weight, stride=stride)
    return y if bias is None else y + bias


@mx.compile
def _snake(x, alpha, beta):
    a = mx.exp(alpha)
    b = mx.exp(beta)
    return x + (1.0 / (b + 1e-9)) * mx.square(mx.sin(x * a))


def snake_compiled(self, x):
    return _snake(x, self.alpha, self.beta)


def snake_plain(self, x):
    a = mx.exp(self.alpha)
    b = mx.exp(self.beta)
    return x + (1.0 / (b + 1e-9)) * mx.square(mx.sin(x * a))


ORIG = dict(conv=sd.conv1d_gemm, convt=sd.conv_transpose1d_gemm, snake=sd.SnakeBeta.__call__)


def patch(conv=None, convt=None, snake=None):
    sd.conv1d_gemm = conv or ORIG["conv"]
    sd.conv_transpose1d_gemm = convt or ORIG["convt"]
    sd.SnakeBeta.__call__ = snake or ORIG["snake"]


def main():
    lengths = [int(a) for a in sys.argv[1:]] or [2, 4, 14, 37, 73]
    tts = metalgen.tts.load("dummy:qwen3-tts-0.6b")
    dec = tts.speech.decoder
    print(f"backend {mx.default_device()}, decoder params fp32, upsample {dec.total_upsample}")
    rng = np.random.default_rng(0)
    variants = [
        ("gemm (current)", {}),
        ("uncompiled snake", dict(snake=snake_plain)),
        ("native conv", dict(conv=conv_native)),
        ("native conv+convT", dict(conv=conv_native, convt=convt_native)),
        ("compiled snake", dict(snake=snake_compiled)),
        ("native conv + compiled snake", dict(conv=conv_native, snake=snake_compiled)),
    ]
    for T in lengths:
        codes = mx.array(rng.integers(0, 2048, (1, T, 16)).astype(np.int32))
        patch()
        base = dec(codes)
        mx.eval(base)
        print(f"\n== {T} frames ({T * 80} ms of audio)")
        for name, kw in variants:
            patch(**kw)
            try:
                ms = timed(lambda: dec(codes))
                diff = float(mx.max(mx.abs(dec(codes) - base)).item()) / max(float(mx.max(mx.abs(base)).item()), 1e-30)
                print(f"  {name:32s} {ms:8.2f} ms/call  {ms / T:6.2f} ms/frame  max|diff|/max|x| {diff:.2e}")
            except Exception as e:  # noqa: BLE001
                print(f"  {name:32s} failed: {type(e).__name__}: {str(e)[:150]}")
        if T in (14, 37):
            for name, kw in (variants[0], variants[-1]):
                patch(**kw)
                print(f"  stages, {name}:")
                for sname, fn in stages(dec, codes).items():
                    print(f"    {sname:40s} {timed(fn):8.3f} ms")
    # the whole decoder compiled (one trace per chunk length)
    patch()
    whole = mx.compile(dec.__call__)
    for T in lengths:
        codes = mx.array(rng.integers(0, 2048, (1, T, 16)).astype(np.int32))
        try:
            ms = timed(lambda: whole(codes))
            base = dec(codes)
            diff = float(mx.max(mx.abs(whole(codes) - base)).item()) / max(float(mx.max(mx.abs(base)).item()), 1e-30)
            print(f"  compiled decoder T={T:3d} {ms:8.2f} ms/call  {ms / T:6.2f} ms/frame  rel diff {diff:.2e}")
        except Exception as e:  # noqa: BLE001
            print(f"  compiled decoder failed: {type(e).__name__}: {str(e)[:200]}")
            break
    # bf16: weights and activations
    patch()
    from mlx.utils import tree_flatten, tree_map

    params32 = dec.parameters()
    dec.update(tree_map(lambda a: a.astype(mx.bfloat16) if a.dtype == mx.float32 else a, params32))
    for T in lengths:
        codes = mx.array(rng.integers(0, 2048, (1, T, 16)).astype(np.int32))
        for name, kw in (variants[0], variants[-1]):
            patch(**kw)
            try:
                ms = timed(lambda: dec(codes))
                print(f"  bf16 {name:27s} T={T:3d} {ms:8.2f} ms/call  {ms / T:6.2f} ms/frame")
            except Exception as e:  # noqa: BLE001
                print(f"  bf16 {name} failed: {type(e).__name__}: {str(e)[:150]}")
    dec.update(params32)
    patch()
    n = sum(v.size for _, v in tree_flatten(dec.parameters()))
    print(f"\ndecoder parameters: {n / 1e6:.1f} M")


if __name__ == "__main__":
    main()
