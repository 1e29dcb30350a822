// metalgen kernel prelude: Metal. Defines the shared vocabulary that every body in
// kernels_metal/bodies is written in (see docs/kernels.md). Its twin for the other GPU backend
// defines the same names. Included through the `header=` argument of mx.fast.metal_kernel, after
// MLX's own Metal utilities (metal_stdlib, bfloat16_t).
#pragma once

#define MG_FN inline
#define MG_SHARED(type, name, n) threadgroup type name[n]
#define MG_SHARED_PTR threadgroup
#define MG_BARRIER() threadgroup_barrier(metal::mem_flags::mem_threadgroup)
#define MG_LOAD_U4(ptr) (*((const device uint4*)(ptr)))
#define MG_WARP 32u

typedef uint4 mg_u4;
typedef float2 mg_f2;

// shared-memory atomics (floats are kept as their bits and added by compare-and-swap)
#define MG_SHARED_ATOMIC_U32(name, n) threadgroup atomic_uint name[n]
#define MG_SHARED_ATOMIC_F32(name, n) threadgroup atomic_uint name[n]
#define MG_ATOMIC_ADD_U32(arr, i, v) atomic_fetch_add_explicit(&(arr)[i], (uint)(v), metal::memory_order_relaxed)
#define MG_ATOMIC_LOAD_U32(arr, i) atomic_load_explicit(&(arr)[i], metal::memory_order_relaxed)
#define MG_ATOMIC_STORE_U32(arr, i, v) atomic_store_explicit(&(arr)[i], (uint)(v), metal::memory_order_relaxed)
#define MG_ATOMIC_MIN_U32(arr, i, v) atomic_fetch_min_explicit(&(arr)[i], (uint)(v), metal::memory_order_relaxed)
#define MG_ATOMIC_MAX_U32(arr, i, v) atomic_fetch_max_explicit(&(arr)[i], (uint)(v), metal::memory_order_relaxed)
#define MG_ATOMIC_ADD_F32(arr, i, v) mg_shared_add_f32(&(arr)[i], (v))
#define MG_ATOMIC_LOAD_F32(arr, i) as_type<float>(atomic_load_explicit(&(arr)[i], metal::memory_order_relaxed))
#define MG_ATOMIC_STORE_F32(arr, i, v) atomic_store_explicit(&(arr)[i], as_type<uint>((float)(v)), metal::memory_order_relaxed)

MG_FN void mg_shared_add_f32(threadgroup atomic_uint* p, float v) {
  uint old = atomic_load_explicit(p, metal::memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(
      p, &old, as_type<uint>(as_type<float>(old) + v), metal::memory_order_relaxed,
      metal::memory_order_relaxed)) {
  }
}

// lane (SIMD-group) collectives, 32 lanes
MG_FN float mg_lanes_sum(float v) { return metal::simd_sum(v); }
MG_FN float mg_lanes_max(float v) { return metal::simd_max(v); }
MG_FN float mg_lanes_xor(float v, uint32_t m) { return metal::simd_shuffle_xor(v, (ushort)m); }
MG_FN int mg_lanes_xor_i(int v, uint32_t m) { return metal::simd_shuffle_xor(v, (ushort)m); }
MG_FN float mg_lanes_prefix_sum(float v) { return metal::simd_prefix_inclusive_sum(v); }
MG_FN uint32_t mg_lanes_prefix_sum_u(uint32_t v) { return metal::simd_prefix_inclusive_sum(v); }

// lane matching (the sampler's warp-aggregated histograms): the mask of the lanes holding the same
// value as this one (every lane calls; one vote per distinct value, the SIMD group has no match
// instruction), the lowest set bit's index, the set bits' count, and a barrier of the SIMD group that
// orders its threadgroup-memory accesses
MG_FN uint32_t mg_lanes_match_u(uint32_t v) {
  uint32_t todo = 0xffffffffu;
  uint32_t mine = 0u;
  while (todo != 0u) {
    const uint32_t b = metal::simd_shuffle(v, (ushort)metal::ctz(todo));
    const uint32_t m = (uint32_t)static_cast<uint64_t>(metal::simd_ballot(v == b));
    if (v == b) mine = m;
    todo &= ~m;
  }
  return mine;
}
MG_FN uint32_t mg_ctz(uint32_t m) { return metal::ctz(m); }
MG_FN uint32_t mg_popc(uint32_t m) { return metal::popcount(m); }
#define MG_WARP_SYNC() metal::simdgroup_barrier(metal::mem_flags::mem_threadgroup)
// a group barrier that also orders the group's device-memory writes before its later reads
#define MG_BARRIER_DEVICE() threadgroup_barrier(metal::mem_flags::mem_device | metal::mem_flags::mem_threadgroup)

// math, float32
MG_FN float mg_exp(float x) { return metal::precise::exp(x); }
MG_FN float mg_log(float x) { return metal::precise::log(x); }
MG_FN float mg_rsqrt(float x) { return metal::precise::rsqrt(x); }
MG_FN float mg_fmax(float a, float b) { return metal::max(a, b); }
MG_FN float mg_fmin(float a, float b) { return metal::min(a, b); }
MG_FN float mg_fabs(float x) { return metal::fabs(x); }
MG_FN float mg_inf() { return INFINITY; }
MG_FN uint32_t mg_as_uint(float x) { return as_type<uint32_t>(x); }
MG_FN float mg_as_float(uint32_t x) { return as_type<float>(x); }
// c + the products of a's two signed 16-bit halves with b's bytes 0, 1 (lo) or 2, 3 (hi), signed
MG_FN int mg_dp2a_lo(uint32_t a, uint32_t b, int c) {
  return c + (int)(short)(a & 0xFFFFu) * (int)(char)(b & 0xFFu) + (int)(short)(a >> 16) * (int)(char)((b >> 8) & 0xFFu);
}
MG_FN int mg_dp2a_hi(uint32_t a, uint32_t b, int c) {
  return c + (int)(short)(a & 0xFFFFu) * (int)(char)((b >> 16) & 0xFFu) + (int)(short)(a >> 16) * (int)(char)(b >> 24);
}
MG_FN int mg_rint_i(float x) { return (int)metal::rint(x); }

// element conversion
template <typename T>
MG_FN float mg_to_float(T x) { return static_cast<float>(x); }
template <typename T>
MG_FN T mg_from_float(float x) { return static_cast<T>(x); }

// two packed 16-bit elements of a 32-bit word -> two floats (low half first)
template <typename T>
MG_FN mg_f2 mg_unpack2(uint32_t u);
template <>
MG_FN mg_f2 mg_unpack2<bfloat16_t>(uint32_t u) {
  return mg_f2(as_type<float>(u << 16), as_type<float>(u & 0xFFFF0000u));
}
template <>
MG_FN mg_f2 mg_unpack2<half>(uint32_t u) {
  return mg_f2(as_type<half2>(u));
}

// --- matrix units (the grouped expert GEMM, moe_gemm) -------------------------------------------
// Same names as the other GPU prelude: one SIMD-group's product of an 8 x 8 slice of A and an 8 x 8
// slice of B (both k-contiguous in threadgroup memory, rows `ld` elements apart) into a float 8 x 8
// simdgroup matrix. Each lane holds two elements of a simdgroup matrix, (fm, fn) and (fm, fn + 1)
// (the layout MLX's steel GEMM relies on); the 16-bit inputs are widened as they are loaded.
#define MG_MMA_M 8u
#define MG_MMA_N 8u
#define MG_MMA_K 8u
struct mg_mma_acc {
  metal::simdgroup_float8x8 m;
};
MG_FN void mg_mma_zero(thread mg_mma_acc& acc) { acc.m = metal::simdgroup_float8x8(0.0f); }
MG_FN uint4 mg_u4_zero() { return uint4(0u, 0u, 0u, 0u); }
// the accumulator's elements held by this lane: MG_MMA_ELEMS of them, element i at (row, column)
// (mg_mma_row(i, lane), mg_mma_col(i, lane)) of the fragment
#define MG_MMA_ELEMS 2u
MG_FN float mg_mma_get(thread mg_mma_acc& acc, uint32_t i) { return acc.m.thread_elements()[i]; }
MG_FN uint32_t mg_mma_row(uint32_t i, uint32_t lane) {
  (void)i;
  return ((lane / 4u) & 4u) + ((lane / 2u) % 4u);
}
MG_FN uint32_t mg_mma_col(uint32_t i, uint32_t lane) { return ((lane / 4u) & 2u) * 2u + (lane % 2u) * 2u + i; }
template <typename T>
MG_FN void mg_mma(thread mg_mma_acc& acc, const threadgroup T* a, uint32_t lda, const threadgroup T* b,
                  uint32_t ldb, uint32_t lane) {
  const uint32_t fm = mg_mma_row(0u, lane);
  const uint32_t fn = mg_mma_col(0u, lane);
  metal::simdgroup_float8x8 fa;
  metal::simdgroup_float8x8 fb;
  fa.thread_elements()[0] = float(a[fm * lda + fn]);
  fa.thread_elements()[1] = float(a[fm * lda + fn + 1u]);
  // B as stored is (n, k); the product wants (k, n): element (k = fm, n = fn) is b[fn * ldb + fm]
  fb.thread_elements()[0] = float(b[fn * ldb + fm]);
  fb.thread_elements()[1] = float(b[(fn + 1u) * ldb + fm]);
  metal::simdgroup_multiply_accumulate(acc.m, fa, fb, acc.m);
}

// --- decode kernels (decode_layer) -----------------------------------------------------------------
// Same names as the other GPU prelude. This backend promises no co-residency of groups, so there is
// no grid barrier here: its decode path launches decode_layer once per phase (docs/decode.md).
#define MG_DEVICE device
#define MG_LOAD_CG(ptr) (*(ptr))
#define MG_LOAD_CG_U4(ptr) (*((const device uint4*)(ptr)))
#define MG_LOAD_U4_NC(ptr) (*((const device uint4*)(ptr)))
#define MG_LOAD_SHARED_U4(ptr) (*((const threadgroup uint4*)(ptr)))
#define MG_MUT(type, ptr) ((device type*)(ptr))
#define MG_HAS_GRID_BARRIER 0
#define MG_LOAD_U4_STREAM(ptr) (*((const device uint4*)(ptr)))
// the other backend's asynchronous copy into a thread's own slot of shared memory: here a plain copy, done
// when the thread passes it, so committing and waiting are nothing. Nothing is gained by it here, and the
// slots would take threadgroup memory past the 32 KB a Metal group may have: the decode body does not use it
#define MG_HAS_ASYNC_COPY 0
#define MG_ASYNC_COPY16(dst, src) (*((threadgroup uint4*)(dst)) = *((const device uint4*)(src)))
#define MG_ASYNC_COMMIT()
#define MG_ASYNC_WAIT(n)
#define MG_DEVICE_ADD_F32(ptr, v) mg_device_add_f32((device atomic_uint*)(ptr), (float)(v))

// float add on device memory by compare-and-swap (decode v2's split-K partial sums; this backend
// runs them in the per-phase path, where the next launch reads the sums)
MG_FN void mg_device_add_f32(device atomic_uint* p, float v) {
  uint old = atomic_load_explicit(p, metal::memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(
      p, &old, as_type<uint>(as_type<float>(old) + v), metal::memory_order_relaxed,
      metal::memory_order_relaxed)) {
  }
}
