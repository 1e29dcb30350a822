"""Grid-barrier variants on a CUDA GPU: the cost of one barrier, (t_n - t_0) / n for a kernel that
does nothing but n barriers (each launch evaluated, median of 15), at 132 and 264 groups of 256.

    PYTHONPATH=. python3 benchmarks/barrier_variants_probe.py

  fence   mg_grid_barrier (kernels_metal/preludes/cuda.h): __threadfence, atomicAdd, acquire-load spin
          with an 8-64 ns back-off, __threadfence
  fence0  the same without the back-off
  relacq  a release atomic add and an acquire-load spin (no full fences), with the back-off
  relacq0 the same without the back-off
"""

import mlx.core as mx

from kernels_metal import source as S
from decode_barrier_probe import launcher, timed  # this folder (the scripts run as `python3 benchmarks/...`)


VARIANTS = r"""
__device__ __forceinline__ unsigned int probe_atom_add_release(unsigned int* p, unsigned int v) {
  unsigned int old;
  asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
template <int FENCE, int SLEEP>
__device__ __forceinline__ void probe_barrier(unsigned int* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int inc = (blockIdx.x == 0) ? (0x80000000u - (gridDim.x - 1u)) : 1u;
    unsigned int old;
    if (FENCE) {
      __threadfence();
      old = atomicAdd(bar, inc);
    } else {
      old = probe_atom_add_release(bar, inc);
    }
    unsigned int ns = 8u;
    while (((mg_load_acquire_u32(bar) ^ old) & 0x80000000u) == 0u) {
      if (SLEEP) {
        __nanosleep(ns);
        if (ns < 64u) ns <<= 1;
      }
    }
    if (FENCE) __threadfence();
  }
  __syncthreads();
}
"""

BODY = r"""
  const int n = params[0];
  const int mode = params[1];
  unsigned int* word = (unsigned int*)(buf);
  for (int k = 0; k < n; ++k) {
    if (mode == 0) probe_barrier<1, 1>(word);
    else if (mode == 1) probe_barrier<1, 0>(word);
    else if (mode == 2) probe_barrier<0, 1>(word);
    else probe_barrier<0, 0>(word);
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = word[0];
"""


def main():
    header = S.prelude("cuda.h") + VARIANTS
    k = mx.fast.cuda_kernel(name="mg_barrier_variants", input_names=["buf", "params"], output_names=["out"],
                            source=BODY, header=header)
    for mode, name in enumerate(("fence", "fence0", "relacq", "relacq0")):
        for nb in (132, 264):
            buf = mx.zeros((1 << 16,), mx.uint32)
            mx.eval(buf)
            launch = launcher(k, buf, nb, mode)
            t0 = timed(lambda: launch(0))
            tn = timed(lambda: launch(2000))
            print(f"barrier {name:<8} groups {nb:>4}: {(tn - t0) / 2000 * 1e6:6.3f} us/barrier "
                  f"(launch {t0 * 1e6:6.1f} us)", flush=True)


if __name__ == "__main__":
    main()
