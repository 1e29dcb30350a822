"""Grid-barrier cost on a CUDA GPU, and the megakernel's time per token against the grid size.

    PYTHONPATH=. python benchmarks/decode_barrier_probe.py [shape]     # default qwen2.5-0.5b

1. A kernel that does nothing but N grid barriers, timed per launch (each launch evaluated, median
   of 15) at N = 0 and N = n: (t_n - t_0) / n is the cost of one barrier. Two barriers:
   `counting`: the old one, a counter in a 4-byte zero-initialized output (MLX's small managed pool,
   advised read-mostly), k-th barrier waits for k * groups; `flip`: the new one (mg_grid_barrier in
   kernels_metal/preludes/cuda.h), one word in a 1 MiB zeroed input never reset, top bit flipped.
2. The megakernel (all layers, one launch) per token at several grid sizes, each token evaluated
   (the old probe evaluated only its last launch of 20 and divided by 20: it under-reported 20x),
   and with the LM head + argmax + .item() as in generation.
"""
import statistics
import sys
import time

import mlx.core as mx

from kernels_metal import source as S


BODY = r"""
  const int n = params[0];
  const int mode = params[1];
  unsigned int* word = (unsigned int*)(buf);
  for (int k = 0; k < n; ++k) {
    if (mode == 0) {
      mg_grid_barrier_counting(cnt, (unsigned int)(k + 1) * gridDim.x);
    } else {
      mg_grid_barrier(word);
    }
  }
"""


def timed(fn, reps=15, warm=2):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def launcher(k, buf, nb, mode):
    """launch(n): one evaluated launch of a barrier-probe kernel `k` (inputs buf, params [n, mode];
    one uint32 output) doing n barriers in `nb` groups of 256."""

    def launch(n):
        p = mx.array([n, mode], mx.int32)
        (o,) = k(inputs=[buf, p], grid=(nb * 256, 1, 1), threadgroup=(256, 1, 1),
                 output_shapes=[(1,)], output_dtypes=[mx.uint32], init_value=0)
        mx.eval(o)

    return launch


def barrier_costs(groups_list):
    header = S.prelude("cuda.h")
    k = mx.fast.cuda_kernel(name="mg_barrier_probe", input_names=["buf", "params"], output_names=["cnt"],
                            source=BODY, header=header)
    buf = mx.zeros((1 << 18,), mx.uint32)
    mx.eval(buf)
    rows = []
    for mode, name, n in ((0, "counting", 8), (1, "flip", 1000)):
        for nb in groups_list:
            launch = launcher(k, buf, nb, mode)
            t0 = timed(lambda: launch(0))
            tn = timed(lambda: launch(n), reps=7 if mode == 0 else 15)
            per = (tn - t0) / n * 1e6
            rows.append((name, nb, n, t0 * 1e6, tn * 1e6, per))
            print(f"barrier {name:<8} groups {nb:>4}: launch {t0 * 1e6:8.1f} us, with {n} barriers "
                  f"{tn * 1e6:10.1f} us -> {per:8.2f} us/barrier", flush=True)
    return rows


def megakernel_times(shape, groups_list):
    from metalgen.api import load
    from metalgen.decode.gpu import MegakernelDecoder
    from metalgen.decode.path import stacked_weights
    from metalgen.decode.stacked import empty_state

    m, _ = load(f"dummy:{shape}")
    w = stacked_weights(m)
    rows = []
    for nb in groups_list:
        dec = MegakernelDecoder(w, blocks=nb)
        st = dec.prepare(empty_state(w, 1024))
        tok = mx.array([5], mx.int32)

        def bare():
            mx.eval(dec.step(st, tok))

        def full():
            t = mx.argmax(m.logits(dec.step(st, tok)), axis=-1).astype(mx.int32)
            t.item()

        tb = timed(bare, reps=40, warm=3)
        tf = timed(full, reps=40, warm=3)
        rows.append((nb, tb, tf))
        print(f"megakernel {shape} groups {nb:>4}: {tb * 1e3:.3f} ms/token (kernel, eval each), "
              f"{tf * 1e3:.3f} ms/token with LM head + argmax + item ({1 / tf:.0f} tok/s)", flush=True)
    return rows


if __name__ == "__main__":
    shape = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-0.5b"
    bar = barrier_costs([8, 33, 132, 264])
    mk = megakernel_times(shape, [66, 132, 264])
    print("\n==== barrier probe")
    for r in bar:
        print(f"{r[0]:<9}{r[1]:>5} groups {r[5]:9.2f} us/barrier")
    for nb, tb, tf in mk:
        print(f"mk {shape} {nb:>4} groups {tb * 1e3:7.3f} ms kernel {tf * 1e3:7.3f} ms token")
