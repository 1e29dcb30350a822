// metalgen kernel prelude: CUDA (NVRTC through mx.fast.cuda_kernel). Defines the shared
// vocabulary that every body in kernels_metal/bodies is written in (see docs/kernels.md). Its twin
// for the Apple backend defines the same names. MLX's generated source already includes
// cuda_bf16.h / cuda_fp16.h (through its device utilities) and cooperative_groups.h.
#pragma once

#define MG_FN __device__ __forceinline__
#define MG_SHARED(type, name, n) __shared__ type name[n]
#define MG_SHARED_PTR
#define MG_BARRIER() __syncthreads()
#define MG_LOAD_U4(ptr) (*((const uint4*)(ptr)))
#define MG_WARP 32u

typedef uint4 mg_u4;
typedef float2 mg_f2;

#define MG_SHARED_ATOMIC_U32(name, n) __shared__ unsigned int name[n]
#define MG_SHARED_ATOMIC_F32(name, n) __shared__ float name[n]
#define MG_ATOMIC_ADD_U32(arr, i, v) atomicAdd(&(arr)[i], (unsigned int)(v))
#define MG_ATOMIC_LOAD_U32(arr, i) (*(volatile unsigned int*)&(arr)[i])
#define MG_ATOMIC_STORE_U32(arr, i, v) ((arr)[i] = (unsigned int)(v))
#define MG_ATOMIC_MIN_U32(arr, i, v) atomicMin(&(arr)[i], (unsigned int)(v))
#define MG_ATOMIC_MAX_U32(arr, i, v) atomicMax(&(arr)[i], (unsigned int)(v))
#define MG_ATOMIC_ADD_F32(arr, i, v) atomicAdd(&(arr)[i], (float)(v))
#define MG_ATOMIC_LOAD_F32(arr, i) (*(volatile float*)&(arr)[i])
#define MG_ATOMIC_STORE_F32(arr, i, v) ((arr)[i] = (float)(v))

MG_FN float mg_lanes_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
MG_FN float mg_lanes_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
MG_FN float mg_lanes_xor(float v, uint32_t m) { return __shfl_xor_sync(0xffffffffu, v, (int)m); }
MG_FN int mg_lanes_xor_i(int v, uint32_t m) { return __shfl_xor_sync(0xffffffffu, v, (int)m); }
MG_FN float mg_lanes_prefix_sum(float v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    float n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}
MG_FN uint32_t mg_lanes_prefix_sum_u(uint32_t v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    uint32_t n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// lane matching (the sampler's warp-aggregated histograms): the mask of the lanes holding the same
// value as this one (every lane calls), the lowest set bit's index, the set bits' count, and a barrier
// of the warp that orders its shared-memory accesses
MG_FN uint32_t mg_lanes_match_u(uint32_t v) { return __match_any_sync(0xffffffffu, v); }
MG_FN uint32_t mg_ctz(uint32_t m) { return (uint32_t)(__ffs((int)m) - 1); }
MG_FN uint32_t mg_popc(uint32_t m) { return (uint32_t)__popc(m); }
#define MG_WARP_SYNC() __syncwarp()
// a group barrier that also orders the group's device-memory writes before its later reads
#define MG_BARRIER_DEVICE() __syncthreads()

MG_FN float mg_exp(float x) { return expf(x); }
MG_FN float mg_log(float x) { return logf(x); }
MG_FN float mg_rsqrt(float x) { return rsqrtf(x); }
MG_FN float mg_fmax(float a, float b) { return fmaxf(a, b); }
MG_FN float mg_fmin(float a, float b) { return fminf(a, b); }
MG_FN float mg_fabs(float x) { return fabsf(x); }
MG_FN float mg_inf() { return __int_as_float(0x7f800000); }
MG_FN uint32_t mg_as_uint(float x) { return __float_as_uint(x); }
MG_FN float mg_as_float(uint32_t x) { return __uint_as_float(x); }
// c + the products of a's two signed 16-bit halves with b's bytes 0, 1 (lo) or 2, 3 (hi), signed
MG_FN int mg_dp2a_lo(uint32_t a, uint32_t b, int c) { return __dp2a_lo((int)a, (int)b, c); }
MG_FN int mg_dp2a_hi(uint32_t a, uint32_t b, int c) { return __dp2a_hi((int)a, (int)b, c); }
MG_FN int mg_rint_i(float x) { return __float2int_rn(x); }

template <typename T>
MG_FN float mg_to_float(T x) { return static_cast<float>(x); }
template <>
MG_FN float mg_to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
MG_FN float mg_to_float<__half>(__half x) { return __half2float(x); }
template <typename T>
MG_FN T mg_from_float(float x) { return static_cast<T>(x); }
template <>
MG_FN __nv_bfloat16 mg_from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <>
MG_FN __half mg_from_float<__half>(float x) { return __float2half(x); }

template <typename T>
MG_FN mg_f2 mg_unpack2(uint32_t u);
template <>
MG_FN mg_f2 mg_unpack2<__nv_bfloat16>(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
}
template <>
MG_FN mg_f2 mg_unpack2<__half>(uint32_t u) {
  __half2 h = *reinterpret_cast<__half2*>(&u);
  return __half22float2(h);
}

// --- matrix units (the grouped expert GEMM, moe_gemm) -------------------------------------------
// One warp's product of a MG_MMA_M x MG_MMA_K slice of A and a MG_MMA_N x MG_MMA_K slice of B (both
// k-contiguous in shared memory, rows `ld` elements apart) into a float MG_MMA_M x MG_MMA_N accumulator:
// mma.sync m16n8k16 (sm_80 and later). Fragment layout (PTX ISA, m16n8k16 floating point): with
// g = lane / 4 and q = lane % 4, A's registers hold (g, 2q..2q+1), (g+8, 2q..), (g, 2q+8..),
// (g+8, 2q+8..); B's (k = 2q..2q+1, n = g) and (k = 2q+8.., n = g); C's (g, 2q..2q+1) and (g+8, 2q..).
#define MG_MMA_M 16u
#define MG_MMA_N 8u
#define MG_MMA_K 16u
struct mg_mma_acc {
  float c[4];
};
MG_FN void mg_mma_zero(mg_mma_acc& acc) { acc.c[0] = acc.c[1] = acc.c[2] = acc.c[3] = 0.0f; }
MG_FN uint4 mg_u4_zero() { return make_uint4(0u, 0u, 0u, 0u); }
// the instruction for one input type (PTX's name for it: bf16, f16), as a specialization of mg_mma_issue
template <typename T>
MG_FN void mg_mma_issue(mg_mma_acc& acc, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1);
#define MG_MMA_ISSUE(CTYPE, PTYPE)                                                                           \
  template <>                                                                                               \
  MG_FN void mg_mma_issue<CTYPE>(mg_mma_acc & acc, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,      \
                                 uint32_t b0, uint32_t b1) {                                                \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTYPE "." PTYPE ".f32 {%0, %1, %2, %3}, "         \
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                            \
                 : "+f"(acc.c[0]), "+f"(acc.c[1]), "+f"(acc.c[2]), "+f"(acc.c[3])                           \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                                   \
  }
MG_MMA_ISSUE(__nv_bfloat16, "bf16")
MG_MMA_ISSUE(__half, "f16")
#undef MG_MMA_ISSUE
template <typename T>
MG_FN void mg_mma(mg_mma_acc& acc, const T* a, uint32_t lda, const T* b, uint32_t ldb, uint32_t lane) {
  const uint32_t g = lane >> 2;
  const uint32_t q2 = (lane & 3u) * 2u;
  const uint32_t* ar0 = (const uint32_t*)(a + g * lda + q2);
  const uint32_t* ar8 = (const uint32_t*)(a + (g + 8u) * lda + q2);
  const uint32_t* br = (const uint32_t*)(b + g * ldb + q2);
  mg_mma_issue<T>(acc, ar0[0], ar8[0], ar0[4], ar8[4], br[0], br[4]);
}
// the accumulator's elements held by this lane: MG_MMA_ELEMS of them, element i at (row, column)
// (mg_mma_row(i, lane), mg_mma_col(i, lane)) of the fragment
#define MG_MMA_ELEMS 4u
MG_FN float mg_mma_get(const mg_mma_acc& acc, uint32_t i) { return acc.c[i]; }
MG_FN uint32_t mg_mma_row(uint32_t i, uint32_t lane) { return (lane >> 2) + (i >> 1) * 8u; }
MG_FN uint32_t mg_mma_col(uint32_t i, uint32_t lane) { return (lane & 3u) * 2u + (i & 1u); }

// --- decode kernels (decode_layer / decode_megakernel) -------------------------------------------
// Global pointers in helper signatures, loads that bypass L1 (data written by other blocks of the
// same launch), read-only streaming loads, writes through an input buffer that the kernel updates
// in place (KV cache, scratch), and the grid barrier of the persistent megakernel.
#define MG_DEVICE
#define MG_LOAD_CG(ptr) __ldcg(ptr)
#define MG_LOAD_CG_U4(ptr) __ldcg((const uint4*)(ptr))
#define MG_LOAD_U4_NC(ptr) __ldg((const uint4*)(ptr))
#define MG_LOAD_SHARED_U4(ptr) (*((const uint4*)(ptr)))
#define MG_MUT(type, ptr) ((type*)(ptr))
#define MG_HAS_GRID_BARRIER 1
// decode v2: weights streamed through L2 without an L1 line (read once per token), and a float
// add on global memory (the split-K partial sums of o_proj and down, summed in L2)
MG_FN uint4 mg_load_u4_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
#define MG_LOAD_U4_STREAM(ptr) mg_load_u4_stream((const void*)(ptr))
// 16 bytes from device memory into the thread's own shared-memory slot without a register (cp.async, through
// L2 only), in groups a thread commits and then waits on: MG_ASYNC_WAIT(n) returns when at most the n newest
// of its groups are still in flight, and the copies of the others are then visible to the thread
#define MG_HAS_ASYNC_COPY 1
#define MG_ASYNC_COPY16(dst, src)                                                                           \
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)),  \
               "l"((const void*)(src))                                                                      \
               : "memory")
#define MG_ASYNC_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define MG_ASYNC_WAIT(n) asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory")
#define MG_DEVICE_ADD_F32(ptr, v) atomicAdd((ptr), (float)(v))
// integer adds, mins and maxes on device memory (the sampler's cross-group histograms and their bins' lowest
// and highest keys: order-free, so every run and every group sees the same sums)
#define MG_DEVICE_ADD_U32(ptr, v) atomicAdd((ptr), (unsigned int)(v))
#define MG_DEVICE_MIN_U32(ptr, v) atomicMin((ptr), (unsigned int)(v))
#define MG_DEVICE_MAX_U32(ptr, v) atomicMax((ptr), (unsigned int)(v))
typedef unsigned long long mg_u64;
#define MG_DEVICE_ADD_U64(ptr, v) atomicAdd((ptr), (mg_u64)(v))

// All blocks of the grid must be co-resident (MLX launches without cooperative groups): the
// caller keeps the grid at most (SM count x blocks per SM).
//
// `bar` is one 32-bit word in a large, device-only buffer that the host never reads (the decode
// scratch; not a small MLX output: MLX's CUDA allocator puts allocations of <= 8 bytes in a
// managed pool advised read-mostly, shared with the sampled tokens that the host reads, so every
// atomic there faulted: ~5 us per block per barrier, measured). It is zeroed once and never reset
// (it must hold 0 or 0x80000000 between barriers: it alternates between the two).
// Arrival flips its top bit: block 0 adds 0x80000000 - (gridDim.x - 1), every other block adds 1,
// so a complete barrier adds exactly 0x80000000 and leaves the low bits as they were. Each block
// waits until the top bit differs from the value it saw at arrival. No target or base is needed,
// so launches stay correct in whatever order the host builds them (they run one after another on
// the stream). One thread per block arrives (atom.release.gpu) and polls with ld.acquire.gpu and a
// short __nanosleep back-off.
MG_FN unsigned int mg_load_acquire_u32(const unsigned int* p) {
  unsigned int v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
#else
  v = *((const volatile unsigned int*)p);
#endif
  return v;
}

// Arrive with release semantics (the group's writes, ordered before it by the block barrier, become
// visible to whoever acquires the word); measured 1.36 us a barrier at 264 groups on the H200
// against 1.74 with full __threadfence()s around a relaxed atomicAdd
// (benchmarks/barrier_variants_probe.py).
MG_FN unsigned int mg_atomic_add_release_u32(unsigned int* p, unsigned int v) {
  unsigned int old;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
#else
  __threadfence();
  old = atomicAdd(p, v);
#endif
  return old;
}

MG_FN void mg_grid_barrier(unsigned int* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int inc = (blockIdx.x == 0) ? (0x80000000u - (gridDim.x - 1u)) : 1u;
    const unsigned int old = mg_atomic_add_release_u32(bar, inc);
    unsigned int ns = 8u;
    while (((mg_load_acquire_u32(bar) ^ old) & 0x80000000u) == 0u) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
      __nanosleep(ns);
      if (ns < 64u) ns <<= 1;
#endif
    }
  }
  __syncthreads();
}

// Ask L2 for the 128-byte lines of [p, p + bytes), thread t of n taking lines t, t + n, ..., marked to be
// evicted last: a phase's small inputs that no group of the launch wrote (norm weights, biases, a RoPE row) are
// otherwise a DRAM round trip for every group at the phase's start, the weights streamed since having pushed them out
MG_FN void mg_prefetch_l2(const void* p, uint32_t bytes, uint32_t t, uint32_t n) {
  const size_t a = __cvta_generic_to_global(p);
  for (size_t line = (a & ~(size_t)127) + 128u * t; line < a + bytes; line += 128u * n) {
    asm volatile("prefetch.global.L2::evict_last [%0];" : : "l"(line));
  }
}

// The megakernel's split merge (decode_layer.body, phase 1): thread 0 of a group whose partial of a
// head is written (and a block barrier passed) releases it and counts the group in; true for the last
// of the head's `n` groups, which then sees every partial (read through L2) and merges them.
MG_FN bool mg_arrive_last(unsigned int* count, unsigned int n) {
  __threadfence();
  const unsigned int old = atomicAdd(count, 1u);
  if (old + 1u == n) {
    __threadfence();
    return true;
  }
  return false;
}

// mg_arrive_last as one acquire-release atomic add (atom.acq_rel.gpu), the grid barrier's way (the release covers the
// group's writes, ordered before it by a block barrier; the last group's acquire, extended by a block barrier, its
// reads after): the decode kernels' split merges. H200, 2026-11-27, us a pipelined greedy token, fences / this, each
// twice: qwen2.5-0.5b 670.8, 663.9 / 658.4, 659.9; qwen3-0.6b 773.9, 784.8 / 768.8, 759.9 (docs/decode.md)
MG_FN bool mg_arrive_last_acq_rel(unsigned int* count, unsigned int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(count), "r"(1u) : "memory");
  return old + 1u == n;
#else
  return mg_arrive_last(count, n);
#endif
}

// Thread 0 of a group waits until `count` (added to with release by other groups) reaches n, as the grid
// barrier waits for its flip: an acquire load, an 8-64 ns back-off. The group's other threads wait at a block
// barrier after it.
MG_FN void mg_wait_count(const unsigned int* count, unsigned int n) {
  unsigned int ns = 8u;
  while (mg_load_acquire_u32(count) < n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    __nanosleep(ns);
    if (ns < 64u) ns <<= 1;
#endif
  }
}

// Per-step timing of the megakernel (params[15], benchmarks/decode_phase_probe.py): the SM's cycle
// counter for the steps and the global nanosecond timer once per launch, to convert cycles to time.
// Low 32 bits only (the host takes differences modulo 2^32): nothing 64-bit stays live in registers.
MG_FN unsigned int mg_cycles() { return (unsigned int)clock64(); }
MG_FN unsigned int mg_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return (unsigned int)t;
}

// The old barrier (a counter zeroed by each launch, k-th barrier waits for k * gridDim.x), kept
// for benchmarks/decode_barrier_probe.py only.
MG_FN void mg_grid_barrier_counting(unsigned int* counter, unsigned int target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    while (*((volatile unsigned int*)counter) < target) {
    }
    __threadfence();
  }
  __syncthreads();
}
