"""The GEMV (gemv.body) with R rows of W a lane-group, against R = 1 and MLX's own product (quantized: at the
vocabulary heads and the dispatch rule's shapes, against mx.quantized_matmul; with --dense, bf16 at the heads
against mx.matmul): us a call (kernels_metal.check's bench: 20 calls queued, median of 7), the bytes read a
second, and whether every R gives R = 1's bits.

    PYTHONPATH=. python3 benchmarks/qgemv_rows_probe.py [--rows 1,2,4,8] [--bits 4,8] [--m 1,4] [--models a,b] [--dense]

With --models (dummy shapes), also the pipelined greedy token of each (the megakernel, its LM head through the
GEMV) with gpu.QGEMV_ROWS at each R, twice over, in one process (benchmarks/decode_step_probe.py's timing); with
--dense, the head through mx.matmul (R0) and through the dense GEMV at each R.
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from kernels_metal import gpu
from kernels_metal.check import bench, rnd

# (K, N): the heads of qwen2.5-0.5b, qwen3-0.6b, qwen3-4b, qwen3-8b (tied or not, the same product), then the
# layer shapes the rule sends to the GEMV at 3-4 rows
SHAPES = [(896, 151936), (1024, 151936), (2560, 151936), (4096, 151936), (2560, 9728), (9728, 2560)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 4, 8])
    ap.add_argument("--bits", type=lambda v: [int(x) for x in v.split(",")], default=[4, 8])
    ap.add_argument("--m", type=lambda v: [int(x) for x in v.split(",")], default=[1, 4])
    ap.add_argument("--models", type=lambda v: [x for x in v.split(",") if x], default=[])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--dense", action="store_true",
                    help="the dense GEMV (bf16) at the heads against mx.matmul instead, and with --models the token "
                         "with the head through mx.matmul (R0) or the dense GEMV at each R")
    args = ap.parse_args()
    if args.dense:
        dense(args.rows, args.m)
        if args.models:
            tokens(args.models, [0] + args.rows, args.tokens, dense=True)
        return
    if args.models:
        tokens(args.models, args.rows, args.tokens)
    for bits in args.bits:
        for K, N in SHAPES:
            wq, s, b = mx.quantize(rnd((N, K), mx.bfloat16, 0.05), group_size=64, bits=bits)
            nbytes = wq.nbytes + s.nbytes + b.nbytes
            for M in args.m:
                x = rnd((M, K))
                cells = row_cells(lambda R: gpu.gemv_quantized(x, wq, s, b, 64, bits, rows=R), args.rows, nbytes,
                                  "mlx", lambda: mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=64,
                                                                     bits=bits))
                print(f"q{bits} M{M} K{K:5d} N{N:6d}: " + "  ".join(cells), flush=True)


def row_cells(ours, rows, nbytes, label, theirs):
    """The cells of one product: MLX's (`theirs`) time, then ours (`ours(R)`) at each R, with the bytes read a
    second and whether R gave R = 1's bits."""
    base = ours(1)
    t = bench(theirs)
    cells = [f"{label} {t * 1e6:7.1f} ({nbytes / t / 1e12:.2f} TB/s)"]
    for R in rows:
        same = bool(mx.array_equal(ours(R), base).item())
        t = bench(lambda: ours(R))
        cells.append(f"R{R} {t * 1e6:7.1f} ({nbytes / t / 1e12:.2f} TB/s{'' if same else ', OTHER BITS'})")
    return cells


def dense(rows, ms):
    for K, N in SHAPES[:4]:
        w = rnd((N, K), mx.bfloat16, 0.05)
        for M in ms:
            x = rnd((M, K))
            cells = row_cells(lambda R: gpu.gemv(x, w, rows=R), rows, w.nbytes, "matmul", lambda: x @ w.T)
            print(f"bf16 M{M} K{K:5d} N{N:6d}: " + "  ".join(cells), flush=True)


def tokens(models, rows, n, dense=False):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from decode_step_probe import fresh, pipelined

    from metalgen.api import load

    qrows, drows = gpu.QGEMV_ROWS, gpu.DENSE_GEMV_ROWS
    for shape in models:
        model, _ = load(f"dummy:{shape}")
        step, first = fresh(model, 4 * len(rows) * n + 16)

        def full(t):
            return mx.argmax(step(t), axis=-1).astype(mx.int32)

        cells = []
        for _ in range(2):
            for R in rows:
                if dense:
                    # (R 0: the head through mx.matmul, the dispatch rule's choice; R > 0: the dense GEMV forced)
                    gpu.DENSE_GEMV, gpu.DENSE_GEMV_ROWS = R > 0, R or 1
                else:
                    gpu.QGEMV_ROWS = R
                try:
                    cells.append(f"R{R} {pipelined(full, first, n):7.1f}")
                finally:
                    gpu.QGEMV_ROWS, gpu.DENSE_GEMV, gpu.DENSE_GEMV_ROWS = qrows, False, drows
        print(f"{shape}: us a pipelined greedy token, " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
