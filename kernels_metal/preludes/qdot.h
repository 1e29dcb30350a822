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

// Quantized chunk, as (sum q_i x_i, sum x_i); the caller applies the chunk's group scale s and bias b:
// sum w_i x_i = s * dq + b * sx (a chunk lies inside one group: group sizes are multiples of 32).
// QB = 4: 32 values, x read as 4 loads of 16 bytes; QB = 8: 16 values, 2 loads.
template <typename T, int QB>
MG_FN mg_f2 mg_chunk_qdot(mg_u4 w, const MG_DEVICE T* x) {
  uint32_t words[4];
  words[0] = w.x;
  words[1] = w.y;
  words[2] = w.z;
  words[3] = w.w;
  float dq = 0.0f;
  float sx = 0.0f;
  for (int c = 0; c < (QB == 4 ? 4 : 2); ++c) {
    // QB 4: load c (of 4) covers word c (8 values); QB 8: load c (of 2) covers words 2c, 2c + 1
    const mg_u4 xr = MG_LOAD_U4(x + 8 * c);
    uint32_t xw[4];
    xw[0] = xr.x;
    xw[1] = xr.y;
    xw[2] = xr.z;
    xw[3] = xr.w;
    for (int t = 0; t < 4; ++t) {
      const mg_f2 xv = mg_unpack2<T>(xw[t]);
      float q0;
      float q1;
      if (QB == 4) {
        q0 = (float)((words[c] >> (8 * t)) & 0xFu);
        q1 = (float)((words[c] >> (8 * t + 4)) & 0xFu);
      } else {
        const uint32_t word = words[2 * c + (t >> 1)];
        const uint32_t sh = 16u * (uint32_t)(t & 1);
        q0 = (float)((word >> sh) & 0xFFu);
        q1 = (float)((word >> (sh + 8u)) & 0xFFu);
      }
      dq += xv.x * q0 + xv.y * q1;
      sx += xv.x + xv.y;
    }
  }
  mg_f2 r;
  r.x = dq;
  r.y = sx;
  return r;
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
