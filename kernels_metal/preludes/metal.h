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

// math, float32
MG_FN float mg_exp(float x) { return metal::precise::exp(x); }
MG_FN float mg_log(float x) { return metal::precise::log(x); }
MG_FN float mg_rsqrt(float x) { return metal::precise::rsqrt(x); }
MG_FN float mg_fmax(float a, float b) { return metal::max(a, b); }
MG_FN float mg_fmin(float a, float b) { return metal::min(a, b); }
MG_FN float mg_inf() { return INFINITY; }
MG_FN uint32_t mg_as_uint(float x) { return as_type<uint32_t>(x); }
MG_FN float mg_as_float(uint32_t x) { return as_type<float>(x); }

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

// --- decode kernels (decode_layer) -----------------------------------------------------------------
// Same names as the other GPU prelude. This backend promises no co-residency of groups, so there is
// no grid barrier here: its decode path launches decode_layer once per phase (docs/decode.md).
#define MG_DEVICE device
#define MG_LOAD_CG(ptr) (*(ptr))
#define MG_LOAD_U4_NC(ptr) (*((const device uint4*)(ptr)))
#define MG_LOAD_SHARED_U4(ptr) (*((const threadgroup uint4*)(ptr)))
#define MG_MUT(type, ptr) ((device type*)(ptr))
#define MG_HAS_GRID_BARRIER 0
#define MG_LOAD_U4_STREAM(ptr) (*((const device uint4*)(ptr)))
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
