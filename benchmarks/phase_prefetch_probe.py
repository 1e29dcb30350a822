"""Can a megakernel phase's first weight loads be issued before its grid barrier? A kernel that runs only
phases, on a CUDA GPU: in each of n phases every lane-group of every group reads its rows of a fresh slice of
a weight buffer (rows of K 16-bit values, 4 16-byte chunks a lane a round trip, the decode GEMV's loads), sums
them, and the groups meet at the megakernel's grid barrier (kernels_metal/preludes/cuda.h). The phase's
time is (t_n - t_1) / (n - 1), each launch evaluated, median of 15. Modes, before each barrier:

  none    nothing
  l1      the next phase's first row asked of L1 (prefetch.global.L1), as tried in the decode megakernel
          (docs/decode.md, "Asked of the caches ahead": it did not pay there)
  l2      the same into L2 (prefetch.global.L2)
  regs    the next phase's first round trip loaded into registers, used after the barrier

    PYTHONPATH=. python3 benchmarks/phase_prefetch_probe.py [--mb 8] [--k 1024] [--groups 264]
"""
import argparse

import mlx.core as mx

from kernels_metal import source as S
from decode_barrier_probe import timed  # this folder (the scripts run as `python3 benchmarks/...`)


BODY = r"""
  const int n = params[0];
  const int mode = params[1];
  const int K = params[2];         // values a row
  const int rows = params[3];      // rows a phase
  const int slices = params[4];    // phases' slices in the buffer (reused cyclically)
  unsigned int* bar = (unsigned int*)(barw);
  const unsigned int lane = threadIdx.x & 31u;
  const unsigned int gw = blockIdx.x * 8u + (threadIdx.x >> 5);
  const unsigned int nw = gridDim.x * 8u;
  float acc = 0.0f;
  uint4 pre[4];
  bool have = false;
  for (int ph = 0; ph < n; ++ph) {
    const uint16_t* base = w + (size_t)(ph % slices) * (size_t)rows * (size_t)K;
    for (unsigned int r = gw; r < (unsigned int)rows; r += nw) {
      const uint16_t* row = base + (size_t)r * (size_t)K;
      for (int k = (int)lane * 8; k < K; k += 1024) {
        uint4 c[4];
        if (have && r == gw && k == (int)lane * 8) {
          for (int j = 0; j < 4; ++j) c[j] = pre[j];
        } else {
          for (int j = 0; j < 4; ++j) c[j] = (k + 256 * j < K) ? __ldg((const uint4*)(row + k + 256 * j)) : make_uint4(0, 0, 0, 0);
        }
        for (int j = 0; j < 4; ++j) acc += __uint_as_float(c[j].x ^ c[j].y ^ c[j].z ^ c[j].w) * 1e-30f;
      }
    }
    have = false;
    if (ph + 1 < n && gw < (unsigned int)rows) {
      const uint16_t* nrow = w + (size_t)((ph + 1) % slices) * (size_t)rows * (size_t)K + (size_t)gw * (size_t)K;
      if (mode == 1) {
        asm volatile("prefetch.global.L1 [%0];" ::"l"((const char*)nrow + 128 * lane) : "memory");
      } else if (mode == 2) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"((const char*)nrow + 128 * lane) : "memory");
      } else if (mode == 3) {
        for (int j = 0; j < 4; ++j) pre[j] = ((int)lane * 8 + 256 * j < K) ? __ldg((const uint4*)(nrow + lane * 8 + 256 * j)) : make_uint4(0, 0, 0, 0);
        have = true;
      }
    }
    mg_grid_barrier(bar);
  }
  if (acc == 1234.5f) out[0] = 1u;  // keeps the loads
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=8.0, help="weight bytes a phase (MB)")
    ap.add_argument("--k", type=int, default=1024, help="values a row")
    ap.add_argument("--groups", type=int, default=264)
    ap.add_argument("--phases", type=int, default=400)
    args = ap.parse_args()
    header = S.prelude("cuda.h")
    k = mx.fast.cuda_kernel(name="mg_phase_prefetch_probe", input_names=["w", "barw", "params"],
                            output_names=["out"], source=BODY, header=header)
    rows = int(args.mb * 1e6 / (2 * args.k))
    slices = max(2, int(2e9 // (rows * args.k * 2)))  # 2 GB of weights: every phase reads from memory
    w = mx.zeros((slices * rows * args.k,), mx.uint16)
    barw = mx.zeros((1 << 10,), mx.uint32)
    mx.eval(w, barw)

    def launch(n, mode):
        p = mx.array([n, mode, args.k, rows, slices], mx.int32)
        (o,) = k(inputs=[w, barw, p], grid=(args.groups * 256, 1, 1), threadgroup=(256, 1, 1),
                 output_shapes=[(1,)], output_dtypes=[mx.uint32], init_value=0)
        mx.eval(o)

    print(f"{rows} rows of {args.k} a phase ({rows * args.k * 2 / 1e6:.1f} MB), {args.groups} groups, "
          f"{slices} slices", flush=True)
    for mode, name in enumerate(("none", "l1", "l2", "regs")):
        t0 = timed(lambda: launch(1, mode))
        tn = timed(lambda: launch(args.phases, mode))
        per = (tn - t0) / (args.phases - 1) * 1e6
        print(f"  {name:<5} {per:7.2f} us a phase ({rows * args.k * 2 / per / 1e6:5.2f} TB/s)", flush=True)


if __name__ == "__main__":
    main()
