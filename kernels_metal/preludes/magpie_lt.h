// metalgen helpers of the Magpie local-transformer kernel (bodies/magpie_lt.body): lane-group dot products
// of weight rows (any of bf16 / f16 / f32, read 16 bytes at a time) with one or two float32 vectors in
// shared memory, and the one-group top-k / draw over a row of logits held in shared memory.
// Written only in the prelude vocabulary; appended after preludes/common.h.
#pragma once

// the dot of one 16-byte chunk of weights (16 / sizeof(T) values) with x[0 ..): 16-bit types unpack two
// values a word; float32 (the specialization) reads the words as floats
template <typename T>
MG_FN float mgl_chunk_dot(mg_u4 w, MG_SHARED_PTR const float* x) {
  const mg_f2 a0 = mg_unpack2<T>(w.x);
  const mg_f2 a1 = mg_unpack2<T>(w.y);
  const mg_f2 a2 = mg_unpack2<T>(w.z);
  const mg_f2 a3 = mg_unpack2<T>(w.w);
  return a0.x * x[0] + a0.y * x[1] + a1.x * x[2] + a1.y * x[3] + a2.x * x[4] + a2.y * x[5] + a3.x * x[6] +
         a3.y * x[7];
}
template <>
MG_FN float mgl_chunk_dot<float>(mg_u4 w, MG_SHARED_PTR const float* x) {
  return mg_as_float(w.x) * x[0] + mg_as_float(w.y) * x[1] + mg_as_float(w.z) * x[2] + mg_as_float(w.w) * x[3];
}

// One lane group (32 lanes): (w . x0, w . x1) for a weight row of K values (K a multiple of 32 * values a
// chunk; w 16-byte aligned), in every lane. x1 is read only when `two` (the CFG row). Up to 4 chunks a lane
// are loaded before the first multiply (a bf16 row of 768 is 3 chunks a lane: one round trip).
template <typename T, int K>
MG_FN mg_f2 mgl_row_dot(const MG_DEVICE T* w, MG_SHARED_PTR const float* x0, MG_SHARED_PTR const float* x1,
                        bool two, uint32_t lane) {
  const uint32_t VPC = 16u / (uint32_t)sizeof(T);  // values a chunk
  const uint32_t NCH = (uint32_t)K / (32u * VPC);  // chunks a lane
  float a = 0.0f;
  float b = 0.0f;
  for (uint32_t c0 = 0u; c0 < NCH; c0 += 4u) {
    mg_u4 r[4];
#pragma unroll
    for (uint32_t i = 0u; i < 4u; ++i) {
      if (c0 + i < NCH) r[i] = MG_LOAD_U4_NC(w + ((c0 + i) * 32u + lane) * VPC);
    }
#pragma unroll
    for (uint32_t i = 0u; i < 4u; ++i) {
      if (c0 + i < NCH) {
        const uint32_t k = ((c0 + i) * 32u + lane) * VPC;
        a += mgl_chunk_dot<T>(r[i], x0 + k);
        if (two) b += mgl_chunk_dot<T>(r[i], x1 + k);
      }
    }
  }
  mg_f2 out;
  out.x = mg_lanes_sum(a);
  out.y = two ? mg_lanes_sum(b) : 0.0f;
  return out;
}

// LayerNorm without bias (torch.nn.LayerNorm(bias=False)) of `rows` rows of D values in place in shared
// memory (row r at x + r * stride), float32: (x - mean) * rsqrt(var + eps) * w. Every thread calls.
template <typename T>
MG_FN void mgl_layer_norm(MG_SHARED_PTR float* x, uint32_t stride, uint32_t rows, uint32_t D, const MG_DEVICE T* w,
                          float eps, MG_SHARED_PTR float* red, uint32_t tid, uint32_t nt) {
  for (uint32_t r = 0u; r < rows; ++r) {
    MG_SHARED_PTR float* xr = x + r * stride;
    float s = 0.0f;
    for (uint32_t i = tid; i < D; i += nt) s += xr[i];
    const float mean = mg_block_sum(s, red, tid, nt) / (float)D;
    float q = 0.0f;
    for (uint32_t i = tid; i < D; i += nt) q += (xr[i] - mean) * (xr[i] - mean);
    const float rstd = mg_rsqrt(mg_block_sum(q, red, tid, nt) / (float)D + eps);
    for (uint32_t i = tid; i < D; i += nt) xr[i] = (xr[i] - mean) * rstd * mg_to_float(w[i]);
  }
  MG_BARRIER();
}

// GELU, tanh form (torch's approximate="tanh"): 0.5 x (1 + tanh(u)), tanh(u) = 1 - 2 / (exp(2u) + 1)
MG_FN float mgl_gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (2.0f - 2.0f / (mg_exp(2.0f * u) + 1.0f));
}

// One group's draw from a row of V logits in shared memory `lg` (float32), with the sampler's rules and
// hash (bodies/sample.body, one group, no top-p / min-p / penalty): temperature <= 0 the argmax of the raw
// logits; else s = lg / temp, keep key(s) >= the key of the k-th largest (ties kept; k <= 0 or >= V: all),
// Gumbel-max with mg_uniform(rkey, v); ties to the smaller id. The k-th largest key comes from the same
// radix descent as the sampler's (4 passes of 8 bits, warp-aggregated per-warp bins, no atomics), so it
// equals the sampler's for the same row. Every thread of the group (256 threads) calls; the result is in
// every thread. wc: 8 x 256 shared words; redf, redi, redu: 32 shared slots each; sel: 3.
MG_FN int mgl_draw(MG_SHARED_PTR const float* lg, uint32_t V, float temp, int top_k, uint32_t rkey,
                   MG_SHARED_PTR uint32_t* wc, MG_SHARED_PTR float* redf, MG_SHARED_PTR int* redi,
                   MG_SHARED_PTR uint32_t* redu, MG_SHARED_PTR uint32_t* sel, uint32_t tid, uint32_t nt) {
  const uint32_t lane = tid & 31u;
  const uint32_t wid = tid >> 5;
  mg_arg best;
  best.v = -mg_inf();
  best.i = 0x7fffffff;
  if (!(temp > 0.0f)) {
    for (uint32_t v = tid; v < V; v += nt) {
      mg_arg c;
      c.v = lg[v];
      c.i = (int)v;
      best = mg_arg_better(best, c);
    }
    return mg_block_argmax(best, redf, redi, tid, nt).i;
  }
  uint32_t kkey = 0u;
  if (top_k > 0 && (uint32_t)top_k < V) {
    const uint32_t nsteps = (V + nt - 1u) / nt;
    MG_SHARED_PTR uint32_t* mc = wc + 256u * wid;
    uint32_t prefix = 0u;
    uint32_t mask = 0u;
    uint32_t kr = (uint32_t)top_k;
    for (uint32_t pass = 0u; pass < 4u; ++pass) {
      const uint32_t shift = 24u - 8u * pass;
      for (uint32_t i = tid; i < 2048u; i += nt) wc[i] = 0u;
      MG_BARRIER();
      for (uint32_t st = 0u; st < nsteps; ++st) {
        const uint32_t v = st * nt + tid;
        bool pend = false;
        uint32_t bin = 0u;
        if (v < V) {
          const uint32_t key = mg_float_key(lg[v] / temp);
          if ((key & mask) == prefix) {
            pend = true;
            bin = (key >> shift) & 255u;
          }
        }
        // lanes that hit the same bin: the lowest adds their count to its warp's bins (no atomics)
        const uint32_t peers = mg_lanes_match_u(pend ? bin : 0xffffffffu);
        if (pend && lane == mg_ctz(peers)) mc[bin] += mg_popc(peers);
        MG_WARP_SYNC();
      }
      MG_BARRIER();
      // thread t holds bin 255 - t: prefix sums in thread order run from the largest keys down
      const uint32_t b = 255u - tid;
      uint32_t c = 0u;
      for (uint32_t k = 0u; k < 8u; ++k) c += wc[256u * k + b];
      const uint32_t cum = mg_block_prefix_u(c, redu, tid);
      if (cum >= kr && cum - c < kr) {
        sel[0] = b;
        sel[1] = cum - c;
        sel[2] = cum == kr ? 1u : 0u;
      }
      MG_BARRIER();
      prefix |= sel[0] << shift;
      mask |= 255u << shift;
      kr -= sel[1];
      const bool whole = sel[2] != 0u;
      MG_BARRIER();
      if (whole) break;  // the chosen bin completes the k: its lowest key keeps the same set
    }
    kkey = prefix;
  }
  for (uint32_t v = tid; v < V; v += nt) {
    const float s = lg[v] / temp;
    if (mg_float_key(s) >= kkey) {
      mg_arg c;
      c.v = s + (-mg_log(-mg_log(mg_uniform(rkey, v))));
      c.i = (int)v;
      best = mg_arg_better(best, c);
    }
  }
  return mg_block_argmax(best, redf, redi, tid, nt).i;
}
