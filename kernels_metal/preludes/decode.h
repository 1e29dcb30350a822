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
// A lane reads 16-byte chunks 8 lane + 256 j in round trips of up to four, every chunk of a trip loaded before
// its first multiply; a trip of four adds its dots to the sum as one term, a shorter (the row's last) one by
// one. Every lane takes its trips in one loop, so that a row of K <= 1024 costs the lane-group one round trip:
// where the lanes' last trips differ (K = 896: four chunks in lanes 0-15, three in 16-31), a loop of whole trips
// and a separate short one run the two kinds of lanes one after the other, two round trips a row
// (docs/decode.md, "One loop of trips"). Result in every lane.
template <typename T>
MG_FN float mg_warp_dot(const MG_DEVICE T* w, MG_SHARED_PTR const T* xs, uint32_t K, uint32_t lane) {
  float acc = 0.0f;
  for (uint32_t k = lane * 8u; k < K; k += 1024u) {
    mg_u4 r[4];
#pragma unroll
    for (uint32_t j = 0; j < 4u; ++j) {
      if (k + 256u * j < K) r[j] = MG_LOAD_U4_NC(w + k + 256u * j);
    }
    if (k + 768u < K) {
      acc += mg_dot8<T>(r[0], MG_LOAD_SHARED_U4(xs + k)) + mg_dot8<T>(r[1], MG_LOAD_SHARED_U4(xs + k + 256u)) +
             mg_dot8<T>(r[2], MG_LOAD_SHARED_U4(xs + k + 512u)) + mg_dot8<T>(r[3], MG_LOAD_SHARED_U4(xs + k + 768u));
    } else {
#pragma unroll
      for (uint32_t j = 0; j < 3u; ++j) {
        if (k + 256u * j < K) acc += mg_dot8<T>(r[j], MG_LOAD_SHARED_U4(xs + k + 256u * j));
      }
    }
  }
  return mg_lanes_sum(acc);
}

// The n 16-byte chunks of a row (K values at w) that mg_warp_dot's lane reads, values 8 lane + 256 j (none past K),
// asked for into the thread's own slots sl[256 j + tid] without registers (the megakernel's copies a phase ahead)
template <typename T>
MG_FN void mg_copy_row_slots(MG_SHARED_PTR mg_u4* sl, const MG_DEVICE T* w, uint32_t K, uint32_t n, uint32_t lane,
                             uint32_t tid) {
  for (uint32_t j = 0; j < n; ++j) {
    const uint32_t k = lane * 8u + 256u * j;
    if (k < K) MG_ASYNC_COPY16(sl + j * 256u + tid, w + k);
  }
}

// mg_warp_dot of a row whose lane chunks are in shared memory: chunk j of the lane (values 8 lane + 256 j) at
// sl[256 j + tid], as a group's thread copied them; the same sums in the same order, so the same bits
template <typename T>
MG_FN float mg_warp_dot_slots(MG_SHARED_PTR const mg_u4* sl, MG_SHARED_PTR const T* xs, uint32_t K, uint32_t lane,
                              uint32_t tid) {
  float acc = 0.0f;
  uint32_t k = lane * 8u;
  uint32_t j = tid;
  for (; k + 768u < K; k += 1024u, j += 1024u) {
    acc += mg_dot8<T>(MG_LOAD_SHARED_U4(sl + j), MG_LOAD_SHARED_U4(xs + k)) +
           mg_dot8<T>(MG_LOAD_SHARED_U4(sl + j + 256u), MG_LOAD_SHARED_U4(xs + k + 256u)) +
           mg_dot8<T>(MG_LOAD_SHARED_U4(sl + j + 512u), MG_LOAD_SHARED_U4(xs + k + 512u)) +
           mg_dot8<T>(MG_LOAD_SHARED_U4(sl + j + 768u), MG_LOAD_SHARED_U4(xs + k + 768u));
  }
  for (uint32_t i = 0; i < 3u; ++i) {
    if (k + 256u * i < K) acc += mg_dot8<T>(MG_LOAD_SHARED_U4(sl + j + 256u * i), MG_LOAD_SHARED_U4(xs + k + 256u * i));
  }
  return mg_lanes_sum(acc);
}

// mg_warp_dot2 (gate and up) of two rows whose lane chunks are in shared memory: chunk j of the lane at sl1[256 j + tid]
// and sl2[256 j + tid]; the same sums in the same order
template <typename T>
MG_FN mg_f2 mg_warp_dot2_slots(MG_SHARED_PTR const mg_u4* sl1, MG_SHARED_PTR const mg_u4* sl2, MG_SHARED_PTR const T* xs,
                               uint32_t K, uint32_t lane, uint32_t tid) {
  float a = 0.0f;
  float b = 0.0f;
  for (uint32_t k = lane * 8u, j = tid; k < K; k += 256u, j += 256u) {
    const mg_u4 x = MG_LOAD_SHARED_U4(xs + k);
    a += mg_dot8<T>(MG_LOAD_SHARED_U4(sl1 + j), x);
    b += mg_dot8<T>(MG_LOAD_SHARED_U4(sl2 + j), x);
  }
  mg_f2 r;
  r.x = mg_lanes_sum(a);
  r.y = mg_lanes_sum(b);
  return r;
}

// acc plus one lane's dots of up to N 16-byte chunks of two rows, w1 . x1 and w2 . x2 at k + 256 j < k1, in
// order of j, both rows' chunks loaded before the first multiply (one round trip for the two)
template <typename T, int N>
MG_FN mg_f2 mg_chunks_dot2x(const MG_DEVICE T* w1, MG_SHARED_PTR const T* x1, const MG_DEVICE T* w2,
                            MG_SHARED_PTR const T* x2, uint32_t k, uint32_t k1, mg_f2 acc) {
  mg_u4 p[N];
  mg_u4 q[N];
#pragma unroll
  for (uint32_t j = 0; j < (uint32_t)N; ++j) {
    if (k + 256u * j < k1) {
      p[j] = MG_LOAD_U4_NC(w1 + k + 256u * j);
      q[j] = MG_LOAD_U4_NC(w2 + k + 256u * j);
    }
  }
#pragma unroll
  for (uint32_t j = 0; j < (uint32_t)N; ++j) {
    if (k + 256u * j < k1) {
      acc.x += mg_dot8<T>(p[j], MG_LOAD_SHARED_U4(x1 + k + 256u * j));
      acc.y += mg_dot8<T>(q[j], MG_LOAD_SHARED_U4(x2 + k + 256u * j));
    }
  }
  return acc;
}

// Two rows with two vectors at once: (dot(w1, x1), dot(w2, x2)) in every lane, up to four chunks of each
// row a round trip, all loaded before the first multiply (K <= 1024: the whole task at once). Gate and
// up share one vector (mg_warp_dot2); an MoE layer's down rows take two experts' activations.
template <typename T>
MG_FN mg_f2 mg_warp_dot2x(const MG_DEVICE T* w1, MG_SHARED_PTR const T* x1, const MG_DEVICE T* w2,
                          MG_SHARED_PTR const T* x2, uint32_t K, uint32_t lane) {
  mg_f2 ab;
  ab.x = 0.0f;
  ab.y = 0.0f;
  for (uint32_t k = lane * 8u; k < K; k += 1024u) ab = mg_chunks_dot2x<T, 4>(w1, x1, w2, x2, k, K, ab);
  mg_f2 r;
  r.x = mg_lanes_sum(ab.x);
  r.y = mg_lanes_sum(ab.y);
  return r;
}

// Gate and up at once: (dot(w1, xs), dot(w2, xs)) in every lane. (4 + 4 loads a lane in flight take the
// megakernel to its 128-register bound: see the GPU backend's tail prelude.)
template <typename T>
MG_FN mg_f2 mg_warp_dot2(const MG_DEVICE T* w1, const MG_DEVICE T* w2, MG_SHARED_PTR const T* xs, uint32_t K,
                         uint32_t lane) {
  return mg_warp_dot2x<T>(w1, xs, w2, xs, K, lane);
}

// Two rows of one weight with one vector, each summed exactly as mg_warp_dot sums one (the same bits as two
// calls), in the same loop of trips: both rows' chunks of a trip in flight together.
template <typename T>
MG_FN mg_f2 mg_warp_dot_pair(const MG_DEVICE T* w1, const MG_DEVICE T* w2, MG_SHARED_PTR const T* xs, uint32_t K,
                             uint32_t lane) {
  float a = 0.0f;
  float b = 0.0f;
  for (uint32_t k = lane * 8u; k < K; k += 1024u) {
    mg_u4 p[4];
    mg_u4 q[4];
#pragma unroll
    for (uint32_t j = 0; j < 4u; ++j) {
      if (k + 256u * j < K) {
        p[j] = MG_LOAD_U4_NC(w1 + k + 256u * j);
        q[j] = MG_LOAD_U4_NC(w2 + k + 256u * j);
      }
    }
    if (k + 768u < K) {
      const mg_u4 x0 = MG_LOAD_SHARED_U4(xs + k);
      const mg_u4 x1 = MG_LOAD_SHARED_U4(xs + k + 256u);
      const mg_u4 x2 = MG_LOAD_SHARED_U4(xs + k + 512u);
      const mg_u4 x3 = MG_LOAD_SHARED_U4(xs + k + 768u);
      a += mg_dot8<T>(p[0], x0) + mg_dot8<T>(p[1], x1) + mg_dot8<T>(p[2], x2) + mg_dot8<T>(p[3], x3);
      b += mg_dot8<T>(q[0], x0) + mg_dot8<T>(q[1], x1) + mg_dot8<T>(q[2], x2) + mg_dot8<T>(q[3], x3);
    } else {
#pragma unroll
      for (uint32_t j = 0; j < 3u; ++j) {
        if (k + 256u * j < K) {
          const mg_u4 x = MG_LOAD_SHARED_U4(xs + k + 256u * j);
          a += mg_dot8<T>(p[j], x);
          b += mg_dot8<T>(q[j], x);
        }
      }
    }
  }
  mg_f2 r;
  r.x = mg_lanes_sum(a);
  r.y = mg_lanes_sum(b);
  return r;
}

// --- a phase's input vector into shared memory ------------------------------------------------------
// The phases read float buffers that other groups wrote in this launch (through L2). A thread's 16-byte
// loads of a pass (4 floats each, up to 4) are all issued before the first is used: staging n values is
// then one round trip a pass, where a loop of single loads waited on most of its loads in turn (the
// norm before gate/up took 4.8 us of qwen3-8b's layer). src 16-byte aligned, n a multiple of 4.

// xs[i] = T(src[i]) for i < n; returns this thread's sum of src[i]^2 (an RMSNorm's)
template <typename T>
MG_FN float mg_stage_floats(MG_SHARED_PTR T* xs, const MG_DEVICE float* src, uint32_t n, uint32_t tid) {
  float ss = 0.0f;
  for (uint32_t b = 4u * tid; b < n; b += 4096u) {
    mg_u4 v[4];
#pragma unroll
    for (uint32_t j = 0; j < 4u; ++j) {
      if (b + 1024u * j < n) v[j] = MG_LOAD_CG_U4(src + b + 1024u * j);
    }
#pragma unroll
    for (uint32_t j = 0; j < 4u; ++j) {
      if (b + 1024u * j < n) {
        const uint32_t i = b + 1024u * j;
        const float f0 = mg_as_float(v[j].x);
        const float f1 = mg_as_float(v[j].y);
        const float f2 = mg_as_float(v[j].z);
        const float f3 = mg_as_float(v[j].w);
        xs[i] = mg_from_float<T>(f0);
        xs[i + 1u] = mg_from_float<T>(f1);
        xs[i + 2u] = mg_from_float<T>(f2);
        xs[i + 3u] = mg_from_float<T>(f3);
        ss += f0 * f0 + f1 * f1 + f2 * f2 + f3 * f3;
      }
    }
  }
  return ss;
}

// A norm weight's 16-byte chunks a thread (8 values, chunk j at 8 tid + 2048 j; N a multiple of 8), loaded
// before the norm's reduction so that their round trip overlaps it
template <int N>
struct mg_norm_chunks {
  mg_u4 v[(N + 2047) / 2048];
};
template <typename T, int N>
MG_FN mg_norm_chunks<N> mg_load_norm_weights(const MG_DEVICE T* w, uint32_t tid) {
  mg_norm_chunks<N> c;
#pragma unroll
  for (uint32_t j = 0; j < (uint32_t)((N + 2047) / 2048); ++j) {
    if (8u * tid + 2048u * j < (uint32_t)N) c.v[j] = MG_LOAD_U4_NC(w + 8u * tid + 2048u * j);
  }
  return c;
}

// The RMSNorm of a staged vector: xs[i] = T(float(xs[i]) * r * w[i]) for i < N
template <typename T, int N>
MG_FN void mg_norm_staged(MG_SHARED_PTR T* xs, mg_norm_chunks<N> wv, float r, uint32_t tid) {
#pragma unroll
  for (uint32_t j = 0; j < (uint32_t)((N + 2047) / 2048); ++j) {
    const uint32_t i = 8u * tid + 2048u * j;
    if (i < (uint32_t)N) {
      const mg_u4 xv = MG_LOAD_SHARED_U4(xs + i);
      const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
      const uint32_t ww[4] = {wv.v[j].x, wv.v[j].y, wv.v[j].z, wv.v[j].w};
#pragma unroll
      for (uint32_t c = 0; c < 4u; ++c) {
        const mg_f2 a = mg_unpack2<T>(xw[c]);
        const mg_f2 g = mg_unpack2<T>(ww[c]);
        xs[i + 2u * c] = mg_from_float<T>(a.x * r * g.x);
        xs[i + 2u * c + 1u] = mg_from_float<T>(a.y * r * g.y);
      }
    }
  }
}

// --- weights as the decode kernels read them -----------------------------------------------------------
// A weight matrix of rows of K values: dense (QB 0: T values) or MLX affine-quantized (QB 4 / 8: K * QB / 32
// 32-bit words a row, low bits first, with K / GS scales `s` and biases `b` a row; w = s * q + b). Every
// row access of the decode body goes through mg_wrow_*: QB and GS are template constants, so a dense
// build compiles to exactly the dense helpers above (a quantized build's `w` is its words, cast). Needs
// preludes/qdot.h.

// Where a K-long vector in shared memory keeps its 32-value chunks' sums (mg_chunk_sums writes them, a 4-bit row's
// dot with PS reads them): the K / 32 words right after its values
template <typename T>
MG_FN MG_SHARED_PTR float* mg_chunk_sums_of(MG_SHARED_PTR const T* xs, uint32_t K) {
  return (MG_SHARED_PTR float*)(xs + K);
}

// (PS 2) the chunks' fixed-point scales (mg_chunk_fix): the K / 32 words after their sums
template <typename T>
MG_FN MG_SHARED_PTR float* mg_chunk_scales_of(MG_SHARED_PTR const T* xs, uint32_t K) {
  return mg_chunk_sums_of<T>(xs, K) + K / 32u;
}

// One lane's chunk of a quantized row (VPC values at x, in shared memory), scaled by its group's s and b
// (PS, 4 bits: the chunk's sum of x is sx, from mg_chunk_sums, not added up again here; PS 2: x in fixed point,
// the chunk's scale fx, mg_chunk_fix)
template <typename T, int QB, int PS = 0>
MG_FN float mg_qchunk_shared(mg_u4 w, MG_SHARED_PTR const T* x, float s, float b, float sx = 0.0f, float fx = 0.0f) {
  const mg_u4 x0 = MG_LOAD_SHARED_U4(x);
  const mg_u4 x1 = MG_LOAD_SHARED_U4(x + 8);
  mg_f2 d;
  if (PS == 2 && QB == 4) {
    const mg_q4_isums q = mg_q4_chunk_fixed<false>(w, w, x0, x1, MG_LOAD_SHARED_U4(x + 16), MG_LOAD_SHARED_U4(x + 24));
    return s * ((float)q.d1 * fx) + b * sx;
  }
  if (PS && QB == 4) {
    const mg_q4_sums q = mg_q4_chunk_inplace<T, false, false>(w, w, x0, x1, MG_LOAD_SHARED_U4(x + 16),
                                                              MG_LOAD_SHARED_U4(x + 24));
    return s * q.d1 + b * sx;
  }
  if (QB == 4) {
    d = mg_qdot_chunk<T, 4>(w, x0, x1, MG_LOAD_SHARED_U4(x + 16), MG_LOAD_SHARED_U4(x + 24));
  } else {
    d = mg_qdot_chunk<T, 8>(w, x0, x1, x0, x1);
  }
  return s * d.x + b * d.y;
}

// Two 4-bit rows' chunks at k against x (in shared memory) as (each row's sum of q x, the chunk's sum of x): the float
// dot (PS 0: the sum of x added up here; PS 1: read from xsum, mg_chunk_sums) or, PS 2, the integer dot with x in
// fixed point (mg_chunk_fix) times the chunk's scale from xscl, the sum from xsum
template <typename T, int PS>
MG_FN mg_q4_sums mg_q4_pair_chunk(mg_u4 p, mg_u4 q, MG_SHARED_PTR const T* x, uint32_t k, MG_SHARED_PTR const float* xsum,
                                  MG_SHARED_PTR const float* xscl) {
  const mg_u4 x0 = MG_LOAD_SHARED_U4(x + k);
  const mg_u4 x1 = MG_LOAD_SHARED_U4(x + k + 8);
  const mg_u4 x2 = MG_LOAD_SHARED_U4(x + k + 16);
  const mg_u4 x3 = MG_LOAD_SHARED_U4(x + k + 24);
  if (PS == 2) {
    const mg_q4_isums e = mg_q4_chunk_fixed<true>(p, q, x0, x1, x2, x3);
    const float f = xscl[k / 32u];
    mg_q4_sums r;
    r.d1 = (float)e.d1 * f;
    r.d2 = (float)e.d2 * f;
    r.sx = xsum[k / 32u];
    return r;
  }
  mg_q4_sums d = mg_q4_chunk_inplace<T, true, !PS>(p, q, x0, x1, x2, x3);
  if (PS) d.sx = xsum[k / 32u];
  return d;
}

// One round trip of two 4-bit rows against one vector (gate and up): a lane's chunks at k (p0, q0) and, when more,
// at k2 = k + 1024 (p1, q1), added to the rows' sums ac.x and ac.y (in this order: the bits of the loop it came from);
// PS as mg_q4_pair_chunk's (xscl: PS 2's chunk scales)
template <typename T, int GS, int PS = 0>
MG_FN mg_f2 mg_q4_pair_trip(mg_u4 p0, mg_u4 q0, mg_u4 p1, mg_u4 q1, bool more, uint32_t k, const MG_DEVICE T* s1,
                            const MG_DEVICE T* b1, const MG_DEVICE T* s2, const MG_DEVICE T* b2, MG_SHARED_PTR const T* x,
                            mg_f2 ac, MG_SHARED_PTR const float* xsum, MG_SHARED_PTR const float* xscl = 0) {
  float a = ac.x;
  float c = ac.y;
  const mg_q4_sums d0 = mg_q4_pair_chunk<T, PS>(p0, q0, x, k, xsum, xscl);
  a += mg_to_float(s1[k / GS]) * d0.d1 + mg_to_float(b1[k / GS]) * d0.sx;
  c += mg_to_float(s2[k / GS]) * d0.d2 + mg_to_float(b2[k / GS]) * d0.sx;
  if (more) {
    const uint32_t k2 = k + 1024u;
    const mg_q4_sums d1 = mg_q4_pair_chunk<T, PS>(p1, q1, x, k2, xsum, xscl);
    a += mg_to_float(s1[k2 / GS]) * d1.d1 + mg_to_float(b1[k2 / GS]) * d1.sx;
    c += mg_to_float(s2[k2 / GS]) * d1.d2 + mg_to_float(b2[k2 / GS]) * d1.sx;
  }
  ac.x = a;
  ac.y = c;
  return ac;
}

// Lane-group dots of two quantized rows with two vectors in shared memory (SAME: both rows take x1, whose
// values are then unpacked and summed once); each lane's chunks of both rows are loaded before the first
// multiply, two chunks a row a round trip (a 4-bit row of K <= 2048 is one). PS (SAME, 4 bits): the chunks' sums
// of x are at mg_chunk_sums_of(x1, K).
template <typename T, int QB, int GS, bool SAME, int PS = 0>
MG_FN mg_f2 mg_qwarp_dot2x(const MG_DEVICE uint32_t* w1, const MG_DEVICE T* s1, const MG_DEVICE T* b1,
                           MG_SHARED_PTR const T* x1, const MG_DEVICE uint32_t* w2, const MG_DEVICE T* s2,
                           const MG_DEVICE T* b2, MG_SHARED_PTR const T* x2, uint32_t K, uint32_t lane) {
  const uint32_t QBS = QB ? (uint32_t)QB : 32u;  // (a dense build never calls this)
  const uint32_t VPC = QBS == 4u ? 32u : 16u;    // values a 16-byte chunk holds
  float a = 0.0f;
  float c = 0.0f;
  for (uint32_t k = lane * VPC; k < K; k += 64u * VPC) {
    const uint32_t k2 = k + 32u * VPC;
    const bool more = k2 < K;
    const mg_u4 p0 = MG_LOAD_U4_NC(w1 + k * QBS / 32u);
    const mg_u4 q0 = MG_LOAD_U4_NC(w2 + k * QBS / 32u);
    mg_u4 p1 = p0;
    mg_u4 q1 = q0;
    if (more) {
      p1 = MG_LOAD_U4_NC(w1 + k2 * QBS / 32u);
      q1 = MG_LOAD_U4_NC(w2 + k2 * QBS / 32u);
    }
    if (SAME && QB == 4) {
      mg_f2 ac;
      ac.x = a;
      ac.y = c;
      ac = mg_q4_pair_trip<T, GS, PS>(p0, q0, p1, q1, more, k, s1, b1, s2, b2, x1, ac, mg_chunk_sums_of<T>(x1, K),
                                      mg_chunk_scales_of<T>(x1, K));
      a = ac.x;
      c = ac.y;
      continue;
    }
    a += mg_qchunk_shared<T, QB>(p0, x1 + k, mg_to_float(s1[k / GS]), mg_to_float(b1[k / GS]));
    if (more) a += mg_qchunk_shared<T, QB>(p1, x1 + k2, mg_to_float(s1[k2 / GS]), mg_to_float(b1[k2 / GS]));
    c += mg_qchunk_shared<T, QB>(q0, x2 + k, mg_to_float(s2[k / GS]), mg_to_float(b2[k / GS]));
    if (more) c += mg_qchunk_shared<T, QB>(q1, x2 + k2, mg_to_float(s2[k2 / GS]), mg_to_float(b2[k2 / GS]));
  }
  mg_f2 r;
  r.x = mg_lanes_sum(a);
  r.y = mg_lanes_sum(c);
  return r;
}

// Two 4-bit rows (words w1, w2 with their scales and biases) dotted with one vector, as mg_qwarp_dot2x<T, 4, GS, true>
// sums them (the same bits), the lane's first round trip given: chunks p0, q0 at k = 32 lane and p1, q1 at k + 1024
// (those past K unused), which the caller had copied ahead (the gate/up phase, decode_layer.body)
template <typename T, int GS, int PS = 0>
MG_FN mg_f2 mg_q4_pair_dot_first(mg_u4 p0, mg_u4 q0, mg_u4 p1, mg_u4 q1, const MG_DEVICE uint32_t* w1,
                                 const MG_DEVICE T* s1, const MG_DEVICE T* b1, const MG_DEVICE uint32_t* w2,
                                 const MG_DEVICE T* s2, const MG_DEVICE T* b2, MG_SHARED_PTR const T* x, uint32_t K,
                                 uint32_t lane) {
  mg_f2 ac;
  ac.x = 0.0f;
  ac.y = 0.0f;
  uint32_t k = lane * 32u;
  MG_SHARED_PTR const float* xsum = mg_chunk_sums_of<T>(x, K);
  MG_SHARED_PTR const float* xscl = mg_chunk_scales_of<T>(x, K);
  if (k < K) ac = mg_q4_pair_trip<T, GS, PS>(p0, q0, p1, q1, k + 1024u < K, k, s1, b1, s2, b2, x, ac, xsum, xscl);
  for (k += 2048u; k < K; k += 2048u) {
    const bool more = k + 1024u < K;
    const mg_u4 f0 = MG_LOAD_U4_NC(w1 + k / 8u);
    const mg_u4 g0 = MG_LOAD_U4_NC(w2 + k / 8u);
    mg_u4 f1 = f0;
    mg_u4 g1 = g0;
    if (more) {
      f1 = MG_LOAD_U4_NC(w1 + (k + 1024u) / 8u);
      g1 = MG_LOAD_U4_NC(w2 + (k + 1024u) / 8u);
    }
    ac = mg_q4_pair_trip<T, GS, PS>(f0, g0, f1, g1, more, k, s1, b1, s2, b2, x, ac, xsum, xscl);
  }
  mg_f2 r;
  r.x = mg_lanes_sum(ac.x);
  r.y = mg_lanes_sum(ac.y);
  return r;
}

// chunks a lane a round trip of a quantized row's dot (2: 3470, 4: 3400, 6: 3382 us a qwen3-8b-4bit token,
// H200, 2026-11-26: 4 is the 16 registers of a row pair's 2 + 2 chunks)
#ifndef MG_QROW_CHUNKS
#define MG_QROW_CHUNKS 4
#endif

// Lane-group dot of one quantized row with xs: MG_QROW_CHUNKS chunks a lane a round trip, all loaded before
// the first multiply (a 4-bit row of K <= 4096 is one trip).
template <typename T, int QB, int GS, int PS = 0>
MG_FN float mg_qwarp_dot(const MG_DEVICE uint32_t* w, const MG_DEVICE T* s, const MG_DEVICE T* b,
                         MG_SHARED_PTR const T* xs, uint32_t K, uint32_t lane) {
  MG_SHARED_PTR const float* xsum = mg_chunk_sums_of<T>(xs, K);    // (PS, 4 bits)
  MG_SHARED_PTR const float* xscl = mg_chunk_scales_of<T>(xs, K);  // (PS 2)
  const uint32_t QBS = QB ? (uint32_t)QB : 32u;  // (a dense build never calls this)
  const uint32_t VPC = QBS == 4u ? 32u : 16u;    // values a 16-byte chunk holds
  float a = 0.0f;
  for (uint32_t k = lane * VPC; k < K; k += 32u * VPC * (uint32_t)MG_QROW_CHUNKS) {
    mg_u4 r[MG_QROW_CHUNKS];
#pragma unroll
    for (uint32_t j = 0; j < (uint32_t)MG_QROW_CHUNKS; ++j) {
      if (k + 32u * VPC * j < K) r[j] = MG_LOAD_U4_NC(w + (k + 32u * VPC * j) * QBS / 32u);
    }
#pragma unroll
    for (uint32_t j = 0; j < (uint32_t)MG_QROW_CHUNKS; ++j) {
      const uint32_t kj = k + 32u * VPC * j;
      if (kj < K) {
        a += mg_qchunk_shared<T, QB, PS>(r[j], xs + kj, mg_to_float(s[kj / GS]), mg_to_float(b[kj / GS]),
                                         PS && QB == 4 ? xsum[kj / 32u] : 0.0f,
                                         PS == 2 && QB == 4 ? xscl[kj / 32u] : 0.0f);
      }
    }
  }
  return mg_lanes_sum(a);
}

// Row `row` of (w, s, b) dotted with xs (PS: a 4-bit row reads the chunks' sums of x after xs, mg_chunk_sums;
// PS 2: x in fixed point, mg_chunk_fix)
template <typename T, int QB, int GS, int PS = 0>
MG_FN float mg_wrow_dot(const MG_DEVICE T* w, const MG_DEVICE T* s, const MG_DEVICE T* b, size_t row,
                        MG_SHARED_PTR const T* xs, uint32_t K, uint32_t lane) {
  if (QB == 0) return mg_warp_dot<T>(w + row * K, xs, K, lane);
  const MG_DEVICE uint32_t* wq = (const MG_DEVICE uint32_t*)w + row * (K * (uint32_t)QB / 32u);
  return mg_qwarp_dot<T, QB, GS, PS>(wq, s + row * (K / GS), b + row * (K / GS), xs, K, lane);
}

// Rows r1 of (w1, s1, b1) and r2 of (w2, s2, b2) dotted with x1 and x2
template <typename T, int QB, int GS>
MG_FN mg_f2 mg_wrow_dot2x(const MG_DEVICE T* w1, const MG_DEVICE T* s1, const MG_DEVICE T* b1, size_t r1,
                          MG_SHARED_PTR const T* x1, const MG_DEVICE T* w2, const MG_DEVICE T* s2,
                          const MG_DEVICE T* b2, size_t r2, MG_SHARED_PTR const T* x2, uint32_t K, uint32_t lane) {
  if (QB == 0) return mg_warp_dot2x<T>(w1 + r1 * K, x1, w2 + r2 * K, x2, K, lane);
  const uint32_t KW = K * (uint32_t)QB / 32u;
  return mg_qwarp_dot2x<T, QB, GS, false>((const MG_DEVICE uint32_t*)w1 + r1 * KW, s1 + r1 * (K / GS), b1 + r1 * (K / GS), x1,
                                   (const MG_DEVICE uint32_t*)w2 + r2 * KW, s2 + r2 * (K / GS), b2 + r2 * (K / GS), x2, K, lane);
}

// Rows r1 and r2 dotted with one vector (gate and up)
template <typename T, int QB, int GS, int PS = 0>
MG_FN mg_f2 mg_wrow_dot2(const MG_DEVICE T* w1, const MG_DEVICE T* s1, const MG_DEVICE T* b1, size_t r1,
                         const MG_DEVICE T* w2, const MG_DEVICE T* s2, const MG_DEVICE T* b2, size_t r2,
                         MG_SHARED_PTR const T* xs, uint32_t K, uint32_t lane) {
  if (QB == 0) return mg_warp_dot2<T>(w1 + r1 * K, w2 + r2 * K, xs, K, lane);
  const uint32_t KW = K * (uint32_t)QB / 32u;
  return mg_qwarp_dot2x<T, QB, GS, true, PS>((const MG_DEVICE uint32_t*)w1 + r1 * KW, s1 + r1 * (K / GS),
                                             b1 + r1 * (K / GS), xs, (const MG_DEVICE uint32_t*)w2 + r2 * KW,
                                             s2 + r2 * (K / GS), b2 + r2 * (K / GS), xs, K, lane);
}

// Rows r1 and r2 of one weight dotted with xs, both in flight at once, each summed as mg_wrow_dot sums it
template <typename T, int QB, int GS, int PS = 0>
MG_FN mg_f2 mg_wrow_pair(const MG_DEVICE T* w, const MG_DEVICE T* s, const MG_DEVICE T* b, size_t r1, size_t r2,
                         MG_SHARED_PTR const T* xs, uint32_t K, uint32_t lane) {
  if (QB == 0) return mg_warp_dot_pair<T>(w + r1 * K, w + r2 * K, xs, K, lane);
  return mg_wrow_dot2<T, QB, GS, PS>(w, s, b, r1, w, s, b, r2, xs, K, lane);
}

// Value i of row `row`, as float (the token's embedding row)
template <typename T, int QB, int GS>
MG_FN float mg_wrow_get(const MG_DEVICE T* w, const MG_DEVICE T* s, const MG_DEVICE T* b, size_t row, uint32_t i,
                        uint32_t K) {
  if (QB == 0) return mg_to_float(w[row * (size_t)K + i]);
  const uint32_t QBS = QB ? (uint32_t)QB : 32u;  // (a dense build never gets here)
  const uint32_t word = ((const MG_DEVICE uint32_t*)w)[row * (K * QBS / 32u) + i * QBS / 32u];
  const uint32_t q = (word >> ((i % (32u / QBS)) * QBS)) & ((1u << (QBS % 32u)) - 1u);
  const size_t g = row * (K / GS) + i / GS;
  return mg_to_float(s[g]) * (float)q + mg_to_float(b[g]);
}

// Round a float to T and back: the decode kernels round where the plain MLX path stores T.
template <typename T>
MG_FN float mg_round(float x) { return mg_to_float(mg_from_float<T>(x)); }

// The sums of a vector's 32-value chunks (xs in shared memory, K a multiple of 32), made once by the group into
// mg_chunk_sums_of(xs, K): a 4-bit row's dot (PS) reads its chunk's sum there rather than adding up the
// chunk's x again for every row (the same bits: mg_q4_chunk_xsum adds them in the order the dot did). The caller
// holds a barrier before and after.
template <typename T>
MG_FN void mg_chunk_sums(MG_SHARED_PTR T* xs, uint32_t K, uint32_t tid) {
  MG_SHARED_PTR float* sums = mg_chunk_sums_of<T>(xs, K);
  for (uint32_t c = tid; c < K / 32u; c += 256u) {
    MG_SHARED_PTR const T* x = xs + 32u * c;
    sums[c] = mg_q4_chunk_xsum<T>(MG_LOAD_SHARED_U4(x), MG_LOAD_SHARED_U4(x + 8), MG_LOAD_SHARED_U4(x + 16),
                                  MG_LOAD_SHARED_U4(x + 24));
  }
}

// A staged vector (xs, K values of T, K a multiple of 32) in 16-bit fixed point for the 4-bit rows' integer dots
// (PS 2, mg_q4_chunk_fixed), in place, with each 32-value chunk's sum of x and its scale after it
// (mg_chunk_sums_of, mg_chunk_scales_of): a chunk's X = x 2^(15 - E) rounded to the nearest integer, where 2^E is
// the power of two just above its largest |x|, so |X| < 2^15 and every value within 2^7 of the largest is exact
// (x has 8 significant bits); its scale is 2^(E - 15), and a chunk whose largest |x| is below 2^-111 counts as 0.
// Each 16-byte word of 8 values becomes (X0, X2), (X4, X6), (X1, X3), (X5, X7). Four threads a chunk, a word each,
// share its largest value and sum through the lanes. The caller holds a barrier before and after.
template <typename T>
MG_FN void mg_chunk_fix(MG_SHARED_PTR T* xs, uint32_t K, uint32_t tid) {
  MG_SHARED_PTR float* sums = mg_chunk_sums_of<T>(xs, K);
  MG_SHARED_PTR float* scales = mg_chunk_scales_of<T>(xs, K);
  const uint32_t nw = K / 8u;  // words, a multiple of 4: a chunk's 4 lanes are active together
  for (uint32_t i = tid; i < (nw + 31u) / 32u * 32u; i += 256u) {
    const bool on = i < nw;
    mg_u4 v;
    v.x = v.y = v.z = v.w = 0u;
    if (on) v = MG_LOAD_SHARED_U4(xs + 8u * i);
    const mg_f2 p0 = mg_unpack2<T>(v.x);
    const mg_f2 p1 = mg_unpack2<T>(v.y);
    const mg_f2 p2 = mg_unpack2<T>(v.z);
    const mg_f2 p3 = mg_unpack2<T>(v.w);
    float m = mg_fmax(mg_fmax(mg_fmax(mg_fabs(p0.x), mg_fabs(p0.y)), mg_fmax(mg_fabs(p1.x), mg_fabs(p1.y))),
                      mg_fmax(mg_fmax(mg_fabs(p2.x), mg_fabs(p2.y)), mg_fmax(mg_fabs(p3.x), mg_fabs(p3.y))));
    m = mg_fmax(m, mg_lanes_xor(m, 1u));
    m = mg_fmax(m, mg_lanes_xor(m, 2u));
    float sx = ((p0.x + p0.y) + (p1.x + p1.y)) + ((p2.x + p2.y) + (p3.x + p3.y));
    sx += mg_lanes_xor(sx, 1u);  // (the same bits in the chunk's 4 lanes: each adds the same two terms)
    sx += mg_lanes_xor(sx, 2u);
    const uint32_t e = (mg_as_uint(m) >> 23) & 0xFFu;  // m in [2^(e - 127), 2^(e - 126)): E = e - 126
    const float f = e >= 15u ? mg_as_float((268u - e) << 23) : 0.0f;
    if (on) {
      if ((i & 3u) == 0u) {
        sums[i / 4u] = sx;
        scales[i / 4u] = e >= 15u ? mg_as_float((e - 14u) << 23) : 0.0f;
      }
      mg_u4 o;
      o.x = ((uint32_t)mg_rint_i(p0.x * f) & 0xFFFFu) | ((uint32_t)mg_rint_i(p1.x * f) << 16);
      o.y = ((uint32_t)mg_rint_i(p2.x * f) & 0xFFFFu) | ((uint32_t)mg_rint_i(p3.x * f) << 16);
      o.z = ((uint32_t)mg_rint_i(p0.y * f) & 0xFFFFu) | ((uint32_t)mg_rint_i(p1.y * f) << 16);
      o.w = ((uint32_t)mg_rint_i(p2.y * f) & 0xFFFFu) | ((uint32_t)mg_rint_i(p3.y * f) << 16);
      *(MG_SHARED_PTR mg_u4*)(xs + 8u * i) = o;
    }
  }
}

// What a phase's 4-bit rows read after the staged vector xs (K values): its chunks' sums (PS 1, mg_chunk_sums), or
// those with the vector in fixed point and the chunks' scales (PS 2, mg_chunk_fix). The caller holds a barrier
// before and after.
template <typename T, int PS>
MG_FN void mg_chunks_for_rows(MG_SHARED_PTR T* xs, uint32_t K, uint32_t tid) {
  if (PS == 2) {
    mg_chunk_fix<T>(xs, K, tid);
  } else if (PS) {
    mg_chunk_sums<T>(xs, K, tid);
  }
}

// Rows base + r (r < n) of a weight dotted with xs (K long), each rounded to T and added to the residual h[r],
// rounded again (the plain path's matmul, then its add): lane-group gw of nw takes rows gw, gw + nw, ...;
// with PAIRS two rows a round trip (r and r + nw), the same bits
template <typename T, int QB, int GS, bool PAIRS, int PS = 0>
MG_FN void mg_rows_add_residual(const MG_DEVICE T* w, const MG_DEVICE T* s, const MG_DEVICE T* b, size_t base,
                                MG_SHARED_PTR const T* xs, uint32_t K, uint32_t n, MG_DEVICE float* h, uint32_t gw,
                                uint32_t nw, uint32_t lane) {
  uint32_t r = gw;
  if (PAIRS) {
    for (; r + nw < n; r += 2u * nw) {
      // (the residual's values asked for with the rows rather than after their dots: a round trip less a row)
      const float h0 = MG_LOAD_CG(h + r);
      const float h1 = MG_LOAD_CG(h + r + nw);
      const mg_f2 ab = mg_wrow_pair<T, QB, GS, PS>(w, s, b, base + r, base + r + nw, xs, K, lane);
      if (lane == 0) {
        h[r] = mg_round<T>(h0 + mg_round<T>(ab.x));
        h[r + nw] = mg_round<T>(h1 + mg_round<T>(ab.y));
      }
    }
  }
  for (; r < n; r += nw) {
    const float h0 = MG_LOAD_CG(h + r);
    const float o = mg_round<T>(mg_wrow_dot<T, QB, GS, PS>(w, s, b, base + r, xs, K, lane));
    if (lane == 0) h[r] = mg_round<T>(h0 + o);
  }
}

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

// 16 bytes of shared memory that is only 4-byte aligned (MG_LOAD_SHARED_U4 needs 16): the decode
// attention's restaged query heads and new key and value, in a lane-group's slot of wm
MG_FN mg_u4 mg_shared_words4(MG_SHARED_PTR const uint32_t* w) {
  mg_u4 r;
  r.x = w[0];
  r.y = w[1];
  r.z = w[2];
  r.w = w[3];
  return r;
}

// --- the attention splits' merge ----------------------------------------------------------------------
// A split's partials, pp: [split][MG_PS(D)], the split's D unnormalised values, its running max m, its sum l and
// two words of padding, so that a split's row starts on 16 bytes and the merge reads 4 values in one load.
#define MG_PS(D) ((D) + 4)

// One lane's share of a quad's merge (the 4 values from d - d % 4): the splits s = q, q + 4, q + 8, ...
// (q = d % 4), J of them a round trip, every load of a trip issued before the first is used, the trips
// joined online (a trip that raises the max rescales the sums). m is the largest of the lane's splits'
// maxes, n[k] the sum of e^(m_s - m) a_s[k] and l of e^(m_s - m) l_s over them, in split order. A split
// whose m is -inf adds nothing. The merge read one value a thread, 8 splits a round trip, in two passes (the
// max, then the sums): 10 round trips through L2 at 33 splits, what the last split of a head waited for
// after its own positions. H100, 2026-11-27, qwen3-0.6b at 16384 positions: the attention phase 33.5 us a
// layer against 35.8, the kernel 1659.6 us a token against 1737.9 (benchmarks/results/merge_quads_h100_2026-11-27/).
struct mg_mshare {
  float m;
  float n[4];
  float l;
};

template <int D, int J>
MG_FN mg_mshare mg_merge_share(const MG_DEVICE float* pp, int ns, int d) {
  const int q = d & 3;
  const int c = d - q;
  mg_mshare r;
  r.m = -mg_inf();
  r.l = 0.0f;
  for (int k = 0; k < 4; ++k) r.n[k] = 0.0f;
  for (int s0 = q; s0 < ns; s0 += 4 * J) {
    mg_u4 a[J];
    mg_u4 ml[J];
    for (int j = 0; j < J; ++j) {
      const int s = s0 + 4 * j;
      if (s < ns) {
        a[j] = MG_LOAD_CG_U4(pp + (size_t)s * MG_PS(D) + c);
        ml[j] = MG_LOAD_CG_U4(pp + (size_t)s * MG_PS(D) + D);
      } else {
        a[j] = mg_u4_zero();
        ml[j] = mg_u4_zero();
        ml[j].x = mg_as_uint(-mg_inf());
      }
    }
    float mb = r.m;
    for (int j = 0; j < J; ++j) mb = mg_fmax(mb, mg_as_float(ml[j].x));
    if (mb > -mg_inf()) {
      const float cr = r.m > -mg_inf() ? mg_exp(r.m - mb) : 0.0f;
      for (int k = 0; k < 4; ++k) r.n[k] *= cr;
      r.l *= cr;
      for (int j = 0; j < J; ++j) {
        const float mj = mg_as_float(ml[j].x);
        const float f = mj > -mg_inf() ? mg_exp(mj - mb) : 0.0f;
        r.n[0] += f * mg_as_float(a[j].x);
        r.n[1] += f * mg_as_float(a[j].y);
        r.n[2] += f * mg_as_float(a[j].z);
        r.n[3] += f * mg_as_float(a[j].w);
        r.l += f * mg_as_float(ml[j].y);
      }
      r.m = mb;
    }
  }
  return r;
}

// A value from its quad's 4 shares, in lane order (m_r, n_r, l_r: lane r's max, its sum for this value, its
// sum of l): M the largest m_r, then sum_r e^(m_r - M) n_r over sum_r e^(m_r - M) l_r, each sum in lane order.
// Every lane of the quad folds the same shares in the same order, so the 4 give the same bits, as does any
// other kernel that merges through mg_merge_splits.
MG_FN float mg_merge_fold(float m0, float m1, float m2, float m3, float n0, float n1, float n2, float n3, float l0,
                          float l1, float l2, float l3) {
  const float M = mg_fmax(mg_fmax(m0, m1), mg_fmax(m2, m3));
  const float f0 = m0 > -mg_inf() ? mg_exp(m0 - M) : 0.0f;
  const float f1 = m1 > -mg_inf() ? mg_exp(m1 - M) : 0.0f;
  const float f2 = m2 > -mg_inf() ? mg_exp(m2 - M) : 0.0f;
  const float f3 = m3 > -mg_inf() ? mg_exp(m3 - M) : 0.0f;
  float num = f0 * n0;
  num += f1 * n1;
  num += f2 * n2;
  num += f3 * n3;
  float den = f0 * l0;
  den += f1 * l1;
  den += f2 * l2;
  den += f3 * l3;
  return num / den;
}

MG_FN float mg_pick4(float v0, float v1, float v2, float v3, int k) {
  return k == 0 ? v0 : (k == 1 ? v1 : (k == 2 ? v2 : v3));
}

// Value d of a head's attention output from its ns splits' partials. The 4 lanes d - d % 4 .. d - d % 4 + 3
// of a quad (lane % 4 == d % 4) must call it together: each reads a quarter of the splits (mg_merge_share,
// J splits a round trip: one trip up to 4 J splits), then they swap shares (lane r ^ x gives lane r its sum
// for r's value) and fold them (mg_merge_fold).
template <int D, int J>
MG_FN float mg_merge_splits(const MG_DEVICE float* pp, int ns, int d) {
  const mg_mshare s = mg_merge_share<D, J>(pp, ns, d);
  const int q = d & 3;
  // from the lane q ^ x: its max, its sum of l, and its sum for value q (given as the lane's own q ^ x)
  const float m1 = mg_lanes_xor(s.m, 1u);
  const float m2 = mg_lanes_xor(s.m, 2u);
  const float m3 = mg_lanes_xor(s.m, 3u);
  const float l1 = mg_lanes_xor(s.l, 1u);
  const float l2 = mg_lanes_xor(s.l, 2u);
  const float l3 = mg_lanes_xor(s.l, 3u);
  const float n0 = mg_pick4(s.n[0], s.n[1], s.n[2], s.n[3], q);
  const float n1 = mg_lanes_xor(mg_pick4(s.n[0], s.n[1], s.n[2], s.n[3], q ^ 1), 1u);
  const float n2 = mg_lanes_xor(mg_pick4(s.n[0], s.n[1], s.n[2], s.n[3], q ^ 2), 2u);
  const float n3 = mg_lanes_xor(mg_pick4(s.n[0], s.n[1], s.n[2], s.n[3], q ^ 3), 3u);
  // lane r of the quad is x = q ^ r away
  const int x0 = q;
  const int x1 = q ^ 1;
  const int x2 = q ^ 2;
  const int x3 = q ^ 3;
  return mg_merge_fold(mg_pick4(s.m, m1, m2, m3, x0), mg_pick4(s.m, m1, m2, m3, x1), mg_pick4(s.m, m1, m2, m3, x2),
                       mg_pick4(s.m, m1, m2, m3, x3), mg_pick4(n0, n1, n2, n3, x0), mg_pick4(n0, n1, n2, n3, x1),
                       mg_pick4(n0, n1, n2, n3, x2), mg_pick4(n0, n1, n2, n3, x3), mg_pick4(s.l, l1, l2, l3, x0),
                       mg_pick4(s.l, l1, l2, l3, x1), mg_pick4(s.l, l1, l2, l3, x2), mg_pick4(s.l, l1, l2, l3, x3));
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

// A Gated DeltaNet layer's input projection row of canonical output o, where the canonical order is
// [q (HK DK) | k (HK DK) | v (HV DV) | z (HV DV) | b (HV) | a (HV)] (Qwen3.5's in_proj_qkv, z, b, a side
// by side). QKVZ 1: Qwen3-Next's packing per key head, in_proj_qkvz rows [q DK | k DK | v R DV | z R DV]
// for each key head, then in_proj_ba rows [b R | a R] for each (R = HV / HK value heads a key head).
template <int HK, int HV, int DK, int DV, int QKVZ>
MG_FN uint32_t mg_lin_row(uint32_t o) {
  if (!QKVZ) return o;
  constexpr uint32_t R = (uint32_t)(HV / HK);
  constexpr uint32_t P = 2u * DK + 2u * R * DV;  // rows a key head in in_proj_qkvz
  constexpr uint32_t KD = (uint32_t)(HK * DK);
  constexpr uint32_t VD = (uint32_t)(HV * DV);
  if (o < 2u * KD) {  // q, then k: key head o / DK of its part
    const uint32_t part = o / KD;
    const uint32_t i = o - part * KD;
    return (i / DK) * P + part * DK + i % DK;
  }
  if (o < 2u * KD + 2u * VD) {  // v, then z: value head h = key head * R + hr
    const uint32_t part = (o - 2u * KD) / VD;
    const uint32_t i = o - 2u * KD - part * VD;
    const uint32_t h = i / DV;
    return (h / R) * P + 2u * DK + part * R * DV + (h % R) * DV + i % DV;
  }
  const uint32_t part = (o - 2u * KD - 2u * VD) / HV;  // b, then a
  const uint32_t h = o - 2u * KD - 2u * VD - part * HV;
  return HK * P + (h / R) * 2u * R + part * R + h % R;
}
