"""A phase boundary of the megakernel in isolation: every group writes its part of a vector, then every
group reads all of it. Two ways to wait for the writers, timed per round on a CUDA GPU:

    PYTHONPATH=. python3 benchmarks/exchange_probe.py

  barrier   the writes, mg_grid_barrier (kernels_metal/preludes/cuda.h), then plain L2 loads: what the
            megakernel does between phases
  tagged    no barrier: each 32-bit word carries its value's 16 high bits (a bf16 value is exact there)
            and a 16-bit tag of the round that wrote it; a reader loads its words again until every tag
            is the round's (one store of a word is seen whole, so the value comes with its tag)

Each round can also stream `--load` 16-byte loads a thread from a weight buffer before its writes (8:
about 8.6 MB a round at 264 groups, a phase's weights on a 0.6B model), so that readers that spin do so
while other groups still load, as in the kernel. Per round: (t_n - t_0) / n over one launch each, the
median of 9 launches. The groups whose part of the vector is empty skip the reads, as a phase's groups
without rows would.
"""

from __future__ import annotations

import argparse

import mlx.core as mx

from kernels_metal import source as S
from decode_barrier_probe import timed  # this folder (the scripts run as `python3 benchmarks/...`)


HELPERS = r"""
__device__ __forceinline__ unsigned int probe_ld_relaxed(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void probe_st_relaxed(unsigned int* p, unsigned int v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
"""

BODY = r"""
  const int n = params[0];
  const int mode = params[1];
  const int V = params[2];
  const int WL = params[3];
  const unsigned int base = (unsigned int)params[4];
  const unsigned int nb = gridDim.x;
  const unsigned int g = blockIdx.x;
  const unsigned int t = threadIdx.x;
  unsigned int* bar = (unsigned int*)buf;   // the barrier's word, on its own line
  unsigned int* xa = (unsigned int*)buf + 64;  // two vectors of V words, alternating by round
  const uint4* wt = (const uint4*)wts;
  __shared__ float xs[8192];
  const unsigned int per = ((unsigned int)V + nb - 1u) / nb;
  const bool writes = g * per < (unsigned int)V;
  float acc = 0.0f;
  for (int k = 0; k < n; ++k) {
    unsigned int* x = xa + (k & 1) * V;
    const unsigned int tag = ((base + (unsigned int)k) % 65535u) + 1u;
    for (int j = 0; j < WL; ++j) {
      const uint4 w = __ldg(wt + ((size_t)(k & 3) * nb + g) * 256u * (size_t)WL + (size_t)j * 256u + t);
      acc += __uint_as_float(w.x & 0x3f800000u);
    }
    const unsigned int i0 = g * per + t;
    if (t < per && i0 < (unsigned int)V) {
      const unsigned int bits = __float_as_uint((float)(k + (int)i0)) & 0xffff0000u;
      if (mode == 0) x[i0] = bits;
      else probe_st_relaxed(x + i0, bits | tag);
    }
    if (mode == 0) {
      mg_grid_barrier(bar);
      if (writes)
        for (int i = (int)t; i < V; i += 256) xs[i] = __uint_as_float(__ldcg(x + i));
    } else if (writes) {
      // every word of the thread asked for at once, then only those whose tag is not yet the round's
      unsigned int wv[16];
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if ((int)t + 256 * j < V) wv[j] = probe_ld_relaxed(x + t + 256 * j);
      unsigned int ns = 8u;
      for (;;) {
        bool ok = true;
#pragma unroll
        for (int j = 0; j < 16; ++j)
          if ((int)t + 256 * j < V && (wv[j] & 0xffffu) != tag) ok = false;
        if (ok) break;
        if (mode == 2) {
          __nanosleep(ns);
          if (ns < 64u) ns <<= 1;
        }
#pragma unroll
        for (int j = 0; j < 16; ++j)
          if ((int)t + 256 * j < V && (wv[j] & 0xffffu) != tag) wv[j] = probe_ld_relaxed(x + t + 256 * j);
      }
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if ((int)t + 256 * j < V) xs[t + 256 * j] = __uint_as_float(wv[j] & 0xffff0000u);
    }
    __syncthreads();
    acc += xs[(t * 7u + (unsigned int)k) % (unsigned int)V];
    __syncthreads();
  }
  out[g * 256u + t] = acc;
"""

MODES = ("barrier", "tagged", "tagged+sleep")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", default="264")
    ap.add_argument("--words", default="1024,3072")
    ap.add_argument("--load", default="0,8")
    ap.add_argument("--rounds", type=int, default=2000)
    a = ap.parse_args()
    header = S.prelude("cuda.h") + HELPERS
    k = mx.fast.cuda_kernel(name="mg_exchange_probe", input_names=["buf", "wts", "params"], output_names=["out"],
                            source=BODY, header=header)
    buf = mx.zeros((1 << 16,), mx.uint32)
    counter = [0]
    for nb in (int(s) for s in a.groups.split(",")):
        wl_max = max(int(s) for s in a.load.split(","))
        wts = mx.zeros((max(1, 4 * nb * 256 * wl_max * 4),), mx.uint32)
        mx.eval(buf, wts)

        def launch(n, mode, V, WL):
            p = mx.array([n, mode, V, WL, counter[0] % 65535], mx.int32)
            counter[0] += max(n, 1)
            (o,) = k(inputs=[buf, wts, p], grid=(nb * 256, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[(nb * 256,)], output_dtypes=[mx.float32])
            mx.eval(o)

        for V in (int(s) for s in a.words.split(",")):
            for WL in (int(s) for s in a.load.split(",")):
                for mode, name in enumerate(MODES):
                    t0 = timed(lambda: launch(0, mode, V, WL), reps=9, warm=1)
                    tn = timed(lambda: launch(a.rounds, mode, V, WL), reps=9, warm=1)
                    print(f"groups {nb:>4} words {V:>5} loads {WL:>2} {name:<13} {(tn - t0) / a.rounds * 1e6:7.3f} us a round",
                          flush=True)


if __name__ == "__main__":
    main()
