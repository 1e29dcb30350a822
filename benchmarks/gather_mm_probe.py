"""Does MLX's sorted gather_mm (the grouped GEMM mlx-lm's SwitchGLU uses for prompts) give the right
products on this backend? Expert weights as a transposed view (what mlx-lm passes) and contiguous, one
row per assignment sorted by expert, against a float32 per-row reference.

    python3 benchmarks/gather_mm_probe.py
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np


def main():
    rng = np.random.default_rng(0)
    print(f"mlx {mx.__version__} {mx.default_device()}")
    for dtype in (mx.bfloat16, mx.float32):
        for (A, E, H, I) in [(64, 8, 64, 32), (160, 8, 128, 64), (1024, 128, 2048, 768)]:
            x = mx.array(rng.standard_normal((A, 1, H)), dtype)
            w = mx.array(rng.standard_normal((E, I, H)) * 0.05, dtype)  # (E, out, in), as checkpoints store it
            idx = mx.array(np.sort(rng.integers(0, E, A)), mx.uint32)
            want = (x.astype(mx.float32) @ w.astype(mx.float32)[idx].swapaxes(-1, -2))
            for name, b in (("swapaxes view", w.swapaxes(-1, -2)), ("contiguous", mx.contiguous(w.swapaxes(-1, -2)))):
                for sorted_ in (True, False):
                    try:
                        got = mx.gather_mm(x, b, rhs_indices=idx, sorted_indices=sorted_).astype(mx.float32)
                        err = float(mx.max(mx.abs(got - want)) / mx.max(mx.abs(want)))
                    except RuntimeError as e:  # MLX's CPU gather_mm takes float32 only
                        print(f"{str(dtype):<18} A{A:<5} {name:<14} sorted={sorted_!s:<5} {e}")
                        continue
                    print(f"{str(dtype):<18} A{A:<5} E{E:<4} H{H:<5} I{I:<4} {name:<14} sorted={sorted_!s:<5} "
                          f"max rel err {err:.2e}{'  WRONG' if err > 5e-2 else ''}")


if __name__ == "__main__":
    main()
