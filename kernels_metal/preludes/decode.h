// metalgen decode helpers, shared by decode_layer (both GPU backends) and decode_megakernel:
// warp-wide dot products of weight rows (global memory) with a vector held in shared memory.
// Written only in the prelude vocabulary; appended after preludes/common.h.
#pragma once

// dot of 8 packed 16-bit values with 8 others, float32
template <typename T>
MG_FN float mg_dot8(mg_u4 a, mg_u4 b) {
  const mg_f2 a0 = mg_unpack2<T>(a.x);
  const mg_f2 a1 = mg_unpack2<T>(a.y);
  const mg_f2 a2 = mg_unpack2<T>(a.z);
  const mg_f2 a3 = mg_unpack2<T>(a.w);
  const mg_f2 b0 = mg_unpack2<T>(b.x);
  const mg_f2 b1 = mg_unpack2<T>(b.y);
  const mg_f2 b2 = mg_unpack2<T>(b.z);
  const mg_f2 b3 = mg_unpack2<T>(b.w);
  return a0.x * b0.x + a0.y * b0.y + a1.x * b1.x + a1.y * b1.y + a2.x * b2.x + a2.y * b2.y +
         a3.x * b3.x + a3.y * b3.y;
}

// acc plus one lane's dots of up to N 16-byte chunks, w[k + 256 j] . xs[k + 256 j] for k + 256 j < k1,
// in order of j, every chunk loaded before the first multiply (one round trip). STREAM: streaming
// loads that leave no L1 line (decode v2); else read-only loads.
template <typename T, int N, bool STREAM>
MG_FN float mg_chunks_dot(const MG_DEVICE T* w, MG_SHARED_PTR const T* xs, uint32_t k, uint32_t k1, float acc) {
  mg_u4 r[N];
#pragma unroll
  for (uint32_t j = 0; j < (uint32_t)N; ++j) {
    if (k + 256u * j < k1) {
      if (STREAM) {
        r[j] = MG_LOAD_U4_STREAM(w + k + 256u * j);
      } else {
        r[j] = MG_LOAD_U4_NC(w + k + 256u * j);
      }
    }
  }
#pragma unroll
  for (uint32_t j = 0; j < (uint32_t)N; ++j) {
    if (k + 256u * j < k1) acc += mg_dot8<T>(r[j], MG_LOAD_SHARED_U4(xs + k + 256u * j));
  }
  return acc;
}

// One lane-group (32 lanes): dot(w[0:K], xs[0:K]), K a multiple of 8, xs 16-byte aligned.
// Each lane reads 16 bytes at a time, four rows of 16 bytes in flight; the last (up to three)
// chunks of a lane are all loaded before the first multiply too, so a row of K <= 1024 costs one
// round trip to memory. Result in every lane.
template <typename T>
MG_FN float mg_warp_dot(const MG_DEVICE T* w, MG_SHARED_PTR const T* xs, uint32_t K, uint32_t lane) {
  float acc = 0.0f;
  uint32_t k = lane * 8u;
  for (; k + 768u < K; k += 1024u) {
    const mg_u4 w0 = MG_LOAD_U4_NC(w + k);
    const mg_u4 w1 = MG_LOAD_U4_NC(w + k + 256u);
    const mg_u4 w2 = MG_LOAD_U4_NC(w + k + 512u);
    const mg_u4 w3 = MG_LOAD_U4_NC(w + k + 768u);
    acc += mg_dot8<T>(w0, MG_LOAD_SHARED_U4(xs + k)) + mg_dot8<T>(w1, MG_LOAD_SHARED_U4(xs + k + 256u)) +
           mg_dot8<T>(w2, MG_LOAD_SHARED_U4(xs + k + 512u)) + mg_dot8<T>(w3, MG_LOAD_SHARED_U4(xs + k + 768u));
  }
  acc = mg_chunks_dot<T, 3, false>(w, xs, k, K, acc);
  return mg_lanes_sum(acc);
}

// Two rows with two vectors at once: (dot(w1, x1), dot(w2, x2)) in every lane, up to four chunks of each
// row a round trip, all loaded before the first multiply (K <= 1024: the whole task at once). Gate and
// up share one vector (mg_warp_dot2); an MoE layer's down rows take two experts' activations.
template <typename T>
MG_FN mg_f2 mg_warp_dot2x(const MG_DEVICE T* w1, MG_SHARED_PTR const T* x1, const MG_DEVICE T* w2,
                          MG_SHARED_PTR const T* x2, uint32_t K, uint32_t lane) {
  float a = 0.0f;
  float b = 0.0f;
  uint32_t k = lane * 8u;
  for (; k < K; k += 1024u) {
    mg_u4 p[4];
    mg_u4 q[4];
#pragma unroll
    for (uint32_t i = 0; i < 4u; ++i) {
      if (k + 256u * i < K) {
        p[i] = MG_LOAD_U4_NC(w1 + k + 256u * i);
        q[i] = MG_LOAD_U4_NC(w2 + k + 256u * i);
      }
    }
#pragma unroll
    for (uint32_t i = 0; i < 4u; ++i) {
      if (k + 256u * i < K) {
        a += mg_dot8<T>(p[i], MG_LOAD_SHARED_U4(x1 + k + 256u * i));
        b += mg_dot8<T>(q[i], MG_LOAD_SHARED_U4(x2 + k + 256u * i));
      }
    }
  }
  mg_f2 r;
  r.x = mg_lanes_sum(a);
  r.y = mg_lanes_sum(b);
  return r;
}

// Gate and up at once: (dot(w1, xs), dot(w2, xs)) in every lane. (4 + 4 loads a lane in flight take the
// megakernel to its 128-register bound: see the GPU backend's tail prelude.)
template <typename T>
MG_FN mg_f2 mg_warp_dot2(const MG_DEVICE T* w1, const MG_DEVICE T* w2, MG_SHARED_PTR const T* xs, uint32_t K,
                         uint32_t lane) {
  return mg_warp_dot2x<T>(w1, xs, w2, xs, K, lane);
}

// Round a float to T and back: the decode kernels round where the plain MLX path stores T.
template <typename T>
MG_FN float mg_round(float x) { return mg_to_float(mg_from_float<T>(x)); }

// --- decode v2 (MG_DECODE_V 2) ----------------------------------------------------------------------
// Partial dot of w[k0:k1] with xs[k0:k1] over one lane-group (k0, k1 multiples of 8): every lane
// issues up to 4 independent 16-byte streaming loads before the first multiply (8 took the kernel
// to 160 registers, which breaks 2 co-resident groups per multiprocessor). Result in every lane.
template <typename T>
MG_FN float mg_warp_dot_part(const MG_DEVICE T* w, MG_SHARED_PTR const T* xs, uint32_t k0, uint32_t k1,
                             uint32_t lane) {
  float acc = 0.0f;
  for (uint32_t kb = k0 + lane * 8u; kb < k1; kb += 1024u) acc = mg_chunks_dot<T, 4, true>(w, xs, kb, k1, acc);
  return mg_lanes_sum(acc);
}

// Split-K matrix-vector product: acc[row] += W[row, :] . xs for rows [0, N), K a multiple of 8,
// cut into tasks (row, K slice of 256 * per elements) spread over all `nw` lane-groups of the
// grid, `per` (1..4 loads a lane, one round trip) chosen so that there are about as many tasks as
// lane-groups.
// Each task adds its partial sum into acc (float, zeroed beforehand) with one atomic add.
// metalgen/decode/reference.py (splitk_tasks) mirrors this partition.
template <typename T>
MG_FN void mg_splitk_gemv(const MG_DEVICE T* W, MG_SHARED_PTR const T* xs, uint32_t N, uint32_t K,
                          MG_DEVICE float* acc, uint32_t gw, uint32_t nw, uint32_t lane) {
  const uint32_t lanes = nw * 32u;
  uint32_t per = (N * (K / 8u) + lanes - 1u) / lanes;
  per = per < 1u ? 1u : (per > 4u ? 4u : per);
  const uint32_t kt = 256u * per;
  const uint32_t nk = (K + kt - 1u) / kt;
  for (uint32_t t = gw; t < N * nk; t += nw) {
    const uint32_t row = t / nk;
    const uint32_t k0 = (t - row * nk) * kt;
    const uint32_t k1 = k0 + kt < K ? k0 + kt : K;
    const float p = mg_warp_dot_part<T>(W + (size_t)row * (size_t)K, xs, k0, k1, lane);
    if (lane == 0) MG_DEVICE_ADD_F32(acc + row, p);
  }
}
