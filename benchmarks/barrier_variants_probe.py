"""Grid-barrier variants on a CUDA GPU: the cost of one barrier, (t_n - t_0) / n for a kernel that
does nothing but n barriers (each launch evaluated, median of 15), at 132 and 264 groups of 256.

    PYTHONPATH=. python3 benchmarks/barrier_variants_probe.py

  fence   mg_grid_barrier (kernels_metal/preludes/cuda.h): __threadfence, atomicAdd, acquire-load spin
          with an 8-64 ns back-off, __threadfence
  fence0  the same without the back-off
  relacq  a release atomic add and an acquire-load spin (no full fences), with the back-off
  relacq0 the same without the back-off
  red     a release red (no old value waited for), thread 0 keeping the word's parity from a load at the launch's
          start, the acquire-load spin with the back-off
  red0    the same without the back-off
  splitS  probe_barrier_split<S>: S 64-bit counters, block g arriving on counter g mod S, S lanes of warp 0 waiting
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
template <int SLEEP>
__device__ __forceinline__ void probe_barrier_red(unsigned int* bar, unsigned int& parity) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int inc = (blockIdx.x == 0) ? (0x80000000u - (gridDim.x - 1u)) : 1u;
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" : : "l"(bar), "r"(inc) : "memory");
    parity ^= 0x80000000u;
    unsigned int ns = 8u;
    while ((mg_load_acquire_u32(bar) & 0x80000000u) != parity) {
      if (SLEEP) {
        __nanosleep(ns);
        if (ns < 64u) ns <<= 1;
      }
    }
  }
  __syncthreads();
}
__device__ __forceinline__ unsigned long long probe_add_release_u64(unsigned long long* p, unsigned long long v) {
  unsigned long long old;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("atom.release.gpu.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
#else
  __threadfence();
  old = atomicAdd(p, v);
#endif
  return old;
}

__device__ __forceinline__ unsigned long long probe_load_acquire_u64(const unsigned long long* p) {
  unsigned long long v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
  v = *((const volatile unsigned long long*)p);
#endif
  return v;
}

// A grid barrier over S counters instead of one word: block g arrives on counter g mod S (ctr[16 c], each on its
// own 128-byte line), so that an L2 slice takes a S-th of the arrivals one after another, and lanes 0 .. S - 1 of
// warp 0 each wait for one counter. The counters only grow (64-bit: no wrap), zeroed with the buffer: counter c
// holds n_c (its blocks) times the barriers completed, so a block's arrival tells it which barrier this is (old / n_c)
// and every counter's target. Every launch on the counters must have the same grid and S.
template <int S>
__device__ __forceinline__ void probe_barrier_split(unsigned long long* ctr) {
  __syncthreads();
  if (threadIdx.x < 32u) {
    const unsigned int nb = gridDim.x;
    const unsigned int mine = blockIdx.x % (unsigned int)S;
    unsigned long long b = 0ull;
    if (threadIdx.x == 0u) {
      const unsigned int n_mine = nb / (unsigned int)S + (mine < nb % (unsigned int)S ? 1u : 0u);
      b = probe_add_release_u64(ctr + 16u * mine, 1ull) / n_mine;
    }
    b = __shfl_sync(0xffffffffu, b, 0);
    if (threadIdx.x < (unsigned int)S) {
      const unsigned int c = threadIdx.x;
      const unsigned long long target = (b + 1ull) * (nb / (unsigned int)S + (c < nb % (unsigned int)S ? 1u : 0u));
      unsigned int ns = 8u;
      while (probe_load_acquire_u64(ctr + 16u * c) < target) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
        __nanosleep(ns);
        if (ns < 64u) ns <<= 1;
#endif
      }
    }
    __syncwarp();
  }
  __syncthreads();
}
"""

BODY = r"""
  const int n = params[0];
  const int mode = params[1];
  unsigned int* word = (unsigned int*)(buf);
  unsigned int parity = threadIdx.x == 0 ? (mg_load_acquire_u32(word) & 0x80000000u) : 0u;
  unsigned long long* ctr = (unsigned long long*)(buf);
  for (int k = 0; k < n; ++k) {
    if (mode == 0) probe_barrier<1, 1>(word);
    else if (mode == 1) probe_barrier<1, 0>(word);
    else if (mode == 2) probe_barrier<0, 1>(word);
    else if (mode == 3) probe_barrier<0, 0>(word);
    else if (mode == 4) probe_barrier_red<1>(word, parity);
    else if (mode == 5) probe_barrier_red<0>(word, parity);
    else if (mode == 6) probe_barrier_split<4>(ctr);
    else if (mode == 7) probe_barrier_split<8>(ctr);
    else if (mode == 8) probe_barrier_split<16>(ctr);
    else probe_barrier_split<32>(ctr);
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = word[0];
"""


def main():
    header = S.prelude("cuda.h") + VARIANTS
    k = mx.fast.cuda_kernel(name="mg_barrier_variants", input_names=["buf", "params"], output_names=["out"],
                            source=BODY, header=header)
    names = ("fence", "fence0", "relacq", "relacq0", "red", "red0", "split4", "split8", "split16", "split32")
    for mode, name in enumerate(names):
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
