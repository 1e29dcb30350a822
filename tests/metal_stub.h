// A host-C++ stand-in for the parts of the Metal Shading Language (and of MLX's Metal utilities)
// that kernels_metal's Metal prelude and bodies use, so that CI can run `g++ -fsyntax-only` over
// every generated Metal kernel in the signature mx.fast.metal_kernel wraps around it. It declares,
// it does not implement: nothing compiled against it is ever run.
#pragma once
#include <cmath>
#include <cstdint>

// address-space qualifiers
#define device
#define constant
#define threadgroup
#define thread

typedef unsigned int uint;
typedef unsigned short ushort;

struct uint3 {
  uint x, y, z;
};
struct uint4 {
  uint x, y, z, w;
  uint4() = default;
  uint4(uint, uint, uint, uint);
};
struct half {
  half() = default;
  half(float);
  operator float() const;
};
typedef half float16_t;
struct bfloat {
  bfloat() = default;
  bfloat(float);
  operator float() const;
};
typedef bfloat bfloat16_t;
struct half2 {
  half x, y;
};
struct float2 {
  float x, y;
  float2() = default;
  float2(float, float);
  explicit float2(half2);
};

struct atomic_uint {
  uint v;
};

template <typename To, typename From>
To as_type(From);

namespace metal {
enum class mem_flags { mem_none, mem_device, mem_threadgroup, mem_texture };
enum memory_order { memory_order_relaxed };
void threadgroup_barrier(mem_flags);
mem_flags operator|(mem_flags, mem_flags);
struct simd_vote {
  explicit operator uint64_t() const;
};
simd_vote simd_ballot(bool);
uint simd_shuffle(uint, ushort);
uint ctz(uint);
uint popcount(uint);
void simdgroup_barrier(mem_flags);
float simd_sum(float);
float simd_max(float);
float simd_shuffle_xor(float, ushort);
int simd_shuffle_xor(int, ushort);
float simd_prefix_inclusive_sum(float);
uint simd_prefix_inclusive_sum(uint);
float max(float, float);
float min(float, float);
float fabs(float);
float rint(float);
struct simdgroup_float8x8 {
  simdgroup_float8x8() = default;
  explicit simdgroup_float8x8(float);
  float* thread_elements();
};
void simdgroup_multiply_accumulate(simdgroup_float8x8&, const simdgroup_float8x8&, const simdgroup_float8x8&,
                                   const simdgroup_float8x8&);
namespace precise {
float exp(float);
float log(float);
float rsqrt(float);
}  // namespace precise
}  // namespace metal

using metal::threadgroup_barrier;
using metal::mem_flags;

uint atomic_fetch_add_explicit(threadgroup atomic_uint*, uint, metal::memory_order);
uint atomic_fetch_min_explicit(threadgroup atomic_uint*, uint, metal::memory_order);
uint atomic_fetch_max_explicit(threadgroup atomic_uint*, uint, metal::memory_order);
uint atomic_load_explicit(threadgroup atomic_uint*, metal::memory_order);
void atomic_store_explicit(threadgroup atomic_uint*, uint, metal::memory_order);
bool atomic_compare_exchange_weak_explicit(threadgroup atomic_uint*, uint*, uint, metal::memory_order,
                                           metal::memory_order);
