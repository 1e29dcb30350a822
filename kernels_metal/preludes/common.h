// metalgen kernel helpers shared by every backend, written only in the prelude vocabulary.
// Appended after the backend's own prelude in every generated kernel.
#pragma once

// Block-wide reductions. Every thread of the group must call them (they hold barriers), the group
// size is a multiple of 32, and `buf` is a shared array of at least 32 floats.
MG_FN float mg_block_sum(float v, MG_SHARED_PTR float* buf, uint32_t tid, uint32_t nthreads) {
  v = mg_lanes_sum(v);
  const uint32_t lane = tid & 31u;
  const uint32_t wid = tid >> 5;
  const uint32_t nw = (nthreads + 31u) >> 5;
  MG_BARRIER();
  if (lane == 0) buf[wid] = v;
  MG_BARRIER();
  float r = lane < nw ? buf[lane] : 0.0f;
  return mg_lanes_sum(r);
}

MG_FN float mg_block_max(float v, MG_SHARED_PTR float* buf, uint32_t tid, uint32_t nthreads) {
  v = mg_lanes_max(v);
  const uint32_t lane = tid & 31u;
  const uint32_t wid = tid >> 5;
  const uint32_t nw = (nthreads + 31u) >> 5;
  MG_BARRIER();
  if (lane == 0) buf[wid] = v;
  MG_BARRIER();
  float r = lane < nw ? buf[lane] : -mg_inf();
  return mg_lanes_max(r);
}

// (value, index) argmax; ties go to the smaller index.
struct mg_arg {
  float v;
  int i;
};

MG_FN mg_arg mg_arg_better(mg_arg a, mg_arg b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

MG_FN mg_arg mg_lanes_argmax(mg_arg a) {
  for (uint32_t o = 16; o > 0; o >>= 1) {
    mg_arg b;
    b.v = mg_lanes_xor(a.v, o);
    b.i = mg_lanes_xor_i(a.i, o);
    a = mg_arg_better(a, b);
  }
  return a;
}

MG_FN mg_arg mg_block_argmax(mg_arg a, MG_SHARED_PTR float* bufv, MG_SHARED_PTR int* bufi,
                             uint32_t tid, uint32_t nthreads) {
  a = mg_lanes_argmax(a);
  const uint32_t lane = tid & 31u;
  const uint32_t wid = tid >> 5;
  const uint32_t nw = (nthreads + 31u) >> 5;
  MG_BARRIER();
  if (lane == 0) {
    bufv[wid] = a.v;
    bufi[wid] = a.i;
  }
  MG_BARRIER();
  mg_arg r;
  r.v = lane < nw ? bufv[lane] : -mg_inf();
  r.i = lane < nw ? bufi[lane] : 0x7fffffff;
  return mg_lanes_argmax(r);
}

// The sampler's counter-based generator (identical to kernels_metal.reference._mix32 etc.).
MG_FN uint32_t mg_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

MG_FN uint32_t mg_row_key(uint32_t seed, uint32_t counter, uint32_t row) {
  uint32_t base = mg_mix32(mg_mix32(seed + 0x9E3779B9u) ^ counter);
  return mg_mix32(base ^ (row * 0x85EBCA6Bu + 0x9E3779B9u));
}

MG_FN float mg_uniform(uint32_t key, uint32_t v) {
  uint32_t bits = mg_mix32(key ^ mg_mix32(v));
  return ((float)(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

// Order-preserving map of a float to an unsigned key (larger float -> larger key).
MG_FN uint32_t mg_float_key(float f) {
  uint32_t u = mg_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Block-wide inclusive prefix sums in thread order (every thread calls; buf: 32 shared slots).
MG_FN uint32_t mg_block_prefix_u(uint32_t v, MG_SHARED_PTR uint32_t* buf, uint32_t tid) {
  const uint32_t lane = tid & 31u;
  const uint32_t wid = tid >> 5;
  uint32_t p = mg_lanes_prefix_sum_u(v);
  MG_BARRIER();
  if (lane == 31u) buf[wid] = p;
  MG_BARRIER();
  for (uint32_t w = 0; w < wid; ++w) p += buf[w];
  return p;
}

MG_FN float mg_block_prefix_f(float v, MG_SHARED_PTR float* buf, uint32_t tid) {
  const uint32_t lane = tid & 31u;
  const uint32_t wid = tid >> 5;
  float p = mg_lanes_prefix_sum(v);
  MG_BARRIER();
  if (lane == 31u) buf[wid] = p;
  MG_BARRIER();
  for (uint32_t w = 0; w < wid; ++w) p += buf[w];
  return p;
}
