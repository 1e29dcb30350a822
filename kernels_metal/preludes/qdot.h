// metalgen matrix-vector helpers shared by the GEMV and expert kernels: one lane's 16 bytes of a
// weight row (dense: 8 values of T; MLX affine 4-bit: 32 values; 8-bit: 16 values, low bits first)
// dotted with the matching values of x in device memory (16-byte aligned), float32.
// Written only in the prelude vocabulary; appended after preludes/common.h.
#pragma once

// 8 dense values: sum w_i x_i
template <typename T>
MG_FN float mg_chunk_dot(mg_u4 w, const MG_DEVICE T* x) {
  const mg_u4 xr = MG_LOAD_U4(x);
  const mg_f2 w0 = mg_unpack2<T>(w.x);
  const mg_f2 w1 = mg_unpack2<T>(w.y);
  const mg_f2 w2 = mg_unpack2<T>(w.z);
  const mg_f2 w3 = mg_unpack2<T>(w.w);
  const mg_f2 x0 = mg_unpack2<T>(xr.x);
  const mg_f2 x1 = mg_unpack2<T>(xr.y);
  const mg_f2 x2 = mg_unpack2<T>(xr.z);
  const mg_f2 x3 = mg_unpack2<T>(xr.w);
  return w0.x * x0.x + w0.y * x0.y + w1.x * x1.x + w1.y * x1.y + w2.x * x2.x + w2.y * x2.y + w3.x * x3.x +
         w3.y * x3.y;
}

// Quantized chunks as (sum q_i x_i, sum x_i), with their x values given as 16-byte words (8 values
// each) loaded by the caller from wherever x lives; the caller applies the chunk's group scale s and
// bias b: sum w_i x_i = s * dq + b * sx (a chunk lies inside one group: group sizes are multiples of 32).
// 8 bits: two 32-bit words of 4 values each with their x word
template <typename T>
MG_FN mg_f2 mg_q8_words(uint32_t wa, uint32_t wb, mg_u4 xr, mg_f2 acc) {
  uint32_t xw[4];
  xw[0] = xr.x;
  xw[1] = xr.y;
  xw[2] = xr.z;
  xw[3] = xr.w;
  for (int t = 0; t < 4; ++t) {
    const mg_f2 xv = mg_unpack2<T>(xw[t]);
    const uint32_t word = t < 2 ? wa : wb;
    const uint32_t sh = 16u * (uint32_t)(t & 1);
    acc.x += xv.x * (float)((word >> sh) & 0xFFu) + xv.y * (float)((word >> (sh + 8u)) & 0xFFu);
    acc.y += xv.x + xv.y;
  }
  return acc;
}

// Sums of one 4-bit chunk (32 values) against x: sum x q for two rows of codes and sum x
struct mg_q4_sums {
  float d1;
  float d2;
  float sx;
};

// The sum of a 4-bit chunk's 32 values of x, in the order mg_q4_chunk_inplace adds them (word by word, each
// word's pair first: the same bits, which tests/test_kernels_qdot.py holds them to)
template <typename T>
MG_FN float mg_q4_chunk_xsum(mg_u4 x0, mg_u4 x1, mg_u4 x2, mg_u4 x3) {
  const uint32_t w[16] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w,
                          x2.x, x2.y, x2.z, x2.w, x3.x, x3.y, x3.z, x3.w};
  float sx = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const mg_f2 v = mg_unpack2<T>(w[i]);
    sx += v.x + v.y;
  }
  return sx;
}

// 4 bits, one chunk of one or two rows (TWO) against the same x, codes read where they lie: code i of a
// word masked in place is 16^i q, an exact float, so a code costs a mask, a conversion and a multiply-add
// (not also a shift: 3769 -> 3470 us a qwen3-8b-4bit token, H200, 2026-11-26); the products of each
// position i are summed apart and scaled by 16^-i once a chunk, and x is unpacked and summed once for both
// rows.
// (SX false: the caller has the chunk's sum of x from elsewhere, and sx is left 0)
template <typename T, bool TWO, bool SX = true>
MG_FN mg_q4_sums mg_q4_chunk_inplace(mg_u4 w1, mg_u4 w2, mg_u4 x0, mg_u4 x1, mg_u4 x2, mg_u4 x3) {
  float c[8];
  float e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    c[i] = 0.0f;
    e[i] = 0.0f;
  }
  float sx = 0.0f;
  const uint32_t wa[4] = {w1.x, w1.y, w1.z, w1.w};
  const uint32_t wb[4] = {w2.x, w2.y, w2.z, w2.w};
  const mg_u4 xs[4] = {x0, x1, x2, x3};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t xw[4] = {xs[j].x, xs[j].y, xs[j].z, xs[j].w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const mg_f2 xv = mg_unpack2<T>(xw[t]);
      const uint32_t lo = 0xFu << (8 * t);
      const uint32_t hi = 0xF0u << (8 * t);
      c[2 * t] += xv.x * (float)(wa[j] & lo);
      c[2 * t + 1] += xv.y * (float)(wa[j] & hi);
      if (TWO) {
        e[2 * t] += xv.x * (float)(wb[j] & lo);
        e[2 * t + 1] += xv.y * (float)(wb[j] & hi);
      }
      // (the sum in line with the products: mg_q4_chunk_xsum gives the same bits apart, and the host test holds
      // the two to that; calling it here instead reorders this function's code and its registers)
      if (SX) sx += xv.x + xv.y;
    }
  }
  mg_q4_sums r;
  r.d1 = c[7];
  r.d2 = e[7];
#pragma unroll
  for (int i = 6; i >= 0; --i) {
    r.d1 = r.d1 * 0.0625f + c[i];
    r.d2 = r.d2 * 0.0625f + e[i];
  }
  r.sx = sx;
  return r;
}

// 4 bits against x in 16-bit fixed point (MG_Q4_FIXED): one chunk of one or two rows as integer sums of q X, where
// each 16-byte word of x holds its 8 values' X as the pairs (X0, X2), (X4, X6), (X1, X3), (X5, X7)
// (mg_chunk_fix writes them): a word's even codes, masked into bytes, meet the first two pairs, its odd codes the
// last two, 4 integer pair dots a word of codes
struct mg_q4_isums {
  int d1;
  int d2;
};
// acc plus one word of 8 codes against its word of x in fixed point
MG_FN int mg_q4_word_fixed(uint32_t w, mg_u4 x, int acc) {
  const uint32_t lo = w & 0x0F0F0F0Fu;         // codes 0, 2, 4, 6
  const uint32_t hi = (w >> 4) & 0x0F0F0F0Fu;  // codes 1, 3, 5, 7
  acc = mg_dp2a_lo(x.x, lo, acc);
  acc = mg_dp2a_hi(x.y, lo, acc);
  acc = mg_dp2a_lo(x.z, hi, acc);
  return mg_dp2a_hi(x.w, hi, acc);
}

template <bool TWO>
MG_FN mg_q4_isums mg_q4_chunk_fixed(mg_u4 w1, mg_u4 w2, mg_u4 x0, mg_u4 x1, mg_u4 x2, mg_u4 x3) {
  const uint32_t wa[4] = {w1.x, w1.y, w1.z, w1.w};
  const uint32_t wb[4] = {w2.x, w2.y, w2.z, w2.w};
  const mg_u4 xs[4] = {x0, x1, x2, x3};
  mg_q4_isums r;
  r.d1 = 0;
  r.d2 = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    r.d1 = mg_q4_word_fixed(wa[j], xs[j], r.d1);
    if (TWO) r.d2 = mg_q4_word_fixed(wb[j], xs[j], r.d2);
  }
  return r;
}

// A whole 16-byte chunk: 32 4-bit values with x0..x3, or 16 8-bit values with x0, x1 (x2, x3 unused)
template <typename T, int QB>
MG_FN mg_f2 mg_qdot_chunk(mg_u4 w, mg_u4 x0, mg_u4 x1, mg_u4 x2, mg_u4 x3) {
  mg_f2 acc;
  if (QB == 4) {
    const mg_q4_sums s = mg_q4_chunk_inplace<T, false>(w, w, x0, x1, x2, x3);
    acc.x = s.d1;
    acc.y = s.sx;
    return acc;
  }
  acc.x = 0.0f;
  acc.y = 0.0f;
  acc = mg_q8_words<T>(w.x, w.y, x0, acc);
  acc = mg_q8_words<T>(w.z, w.w, x1, acc);
  return acc;
}

// The chunk with x in device memory (16-byte aligned)
template <typename T, int QB>
MG_FN mg_f2 mg_chunk_qdot(mg_u4 w, const MG_DEVICE T* x) {
  const mg_u4 x0 = MG_LOAD_U4(x);
  const mg_u4 x1 = MG_LOAD_U4(x + 8);
  if (QB == 4) return mg_qdot_chunk<T, 4>(w, x0, x1, MG_LOAD_U4(x + 16), MG_LOAD_U4(x + 24));
  return mg_qdot_chunk<T, 8>(w, x0, x1, x0, x1);
}

// One lane's partial dot of a weight row with x over [0, K): dense rows of T (QB 0), or MLX-quantized
// rows (QB 4 / 8) with the row's scales and biases (one per GS values). Lane `lane` of a lane-group
// takes chunks lane, lane + 32, ...; the caller sums the lanes. Two chunks a lane are loaded before the
// first multiply.
template <typename T, int QB, int GS, typename S>
MG_FN float mg_lane_row_dot(const MG_DEVICE uint32_t* w, const MG_DEVICE S* sc, const MG_DEVICE S* bi,
                            const MG_DEVICE T* x, uint32_t K, uint32_t lane) {
  // values a chunk holds, and 32-bit words per chunk (always 4)
  const uint32_t VPC = QB == 0 ? 8u : (QB == 4 ? 32u : 16u);
  float acc = 0.0f;
  uint32_t k = lane * VPC;
  for (; k + 32u * VPC < K; k += 64u * VPC) {
    const uint32_t k2 = k + 32u * VPC;
    const mg_u4 w0 = MG_LOAD_U4(w + (QB == 0 ? k / 2u : k * (uint32_t)QB / 32u));
    const mg_u4 w1 = MG_LOAD_U4(w + (QB == 0 ? k2 / 2u : k2 * (uint32_t)QB / 32u));
    if (QB == 0) {
      acc += mg_chunk_dot<T>(w0, x + k) + mg_chunk_dot<T>(w1, x + k2);
    } else {
      const mg_f2 d0 = mg_chunk_qdot<T, QB>(w0, x + k);
      const mg_f2 d1 = mg_chunk_qdot<T, QB>(w1, x + k2);
      acc += mg_to_float(sc[k / (uint32_t)GS]) * d0.x + mg_to_float(bi[k / (uint32_t)GS]) * d0.y;
      acc += mg_to_float(sc[k2 / (uint32_t)GS]) * d1.x + mg_to_float(bi[k2 / (uint32_t)GS]) * d1.y;
    }
  }
  if (k < K) {
    const mg_u4 w0 = MG_LOAD_U4(w + (QB == 0 ? k / 2u : k * (uint32_t)QB / 32u));
    if (QB == 0) {
      acc += mg_chunk_dot<T>(w0, x + k);
    } else {
      const mg_f2 d0 = mg_chunk_qdot<T, QB>(w0, x + k);
      acc += mg_to_float(sc[k / (uint32_t)GS]) * d0.x + mg_to_float(bi[k / (uint32_t)GS]) * d0.y;
    }
  }
  return acc;
}
