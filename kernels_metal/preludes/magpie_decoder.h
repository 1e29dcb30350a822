// metalgen Magpie decoder step helpers (bodies/magpie_decoder.body), written only in the prelude
// vocabulary; appended after preludes/common.h. The vectors a projection reads sit in shared memory as
// float32 (already rounded to the activation dtype where the MLX path rounds), so one set of helpers
// serves 16-bit and float32 weights alike.
#pragma once

// 16 bytes of weights (8 16-bit values, or 4 floats) dotted with the matching floats of x (shared,
// 16-byte aligned)
template <typename T>
MG_FN float mg_mp_cdot(mg_u4 w, MG_SHARED_PTR const float* x) {
  const mg_u4 xa = MG_LOAD_SHARED_U4(x);
  const mg_u4 xb = MG_LOAD_SHARED_U4(x + 4);
  const mg_f2 a = mg_unpack2<T>(w.x);
  const mg_f2 b = mg_unpack2<T>(w.y);
  const mg_f2 c = mg_unpack2<T>(w.z);
  const mg_f2 d = mg_unpack2<T>(w.w);
  return a.x * mg_as_float(xa.x) + a.y * mg_as_float(xa.y) + b.x * mg_as_float(xa.z) + b.y * mg_as_float(xa.w) +
         c.x * mg_as_float(xb.x) + c.y * mg_as_float(xb.y) + d.x * mg_as_float(xb.z) + d.y * mg_as_float(xb.w);
}

template <>
MG_FN float mg_mp_cdot<float>(mg_u4 w, MG_SHARED_PTR const float* x) {
  const mg_u4 xa = MG_LOAD_SHARED_U4(x);
  return mg_as_float(w.x) * mg_as_float(xa.x) + mg_as_float(w.y) * mg_as_float(xa.y) +
         mg_as_float(w.z) * mg_as_float(xa.z) + mg_as_float(w.w) * mg_as_float(xa.w);
}

// One lane-group: a weight row w[0:K] dotted with R <= 2 vectors xs[r * K : (r + 1) * K] at once (the
// CFG rows share every weight load). K * sizeof(T) a multiple of 16. Lane l takes the 16-byte chunks
// l, l + 32, ...; NC chunks a lane are loaded before the first multiply (one round trip for a row of
// up to 32 * NC chunks: K = 3072 in 16 bits is 12 a lane, three round trips). Result in every lane:
// x for row 0, y for row 1.
template <typename T, int R>
MG_FN mg_f2 mg_mp_dot(const MG_DEVICE T* w, MG_SHARED_PTR const float* xs, uint32_t K, uint32_t lane) {
  constexpr uint32_t E = 16u / (uint32_t)sizeof(T);
  constexpr uint32_t NC = 4u;
  float a = 0.0f;
  float b = 0.0f;
  for (uint32_t k = lane * E; k < K; k += 32u * E * NC) {
    mg_u4 c[NC];
#pragma unroll
    for (uint32_t j = 0; j < NC; ++j) {
      if (k + 32u * E * j < K) c[j] = MG_LOAD_U4_NC(w + k + 32u * E * j);
    }
#pragma unroll
    for (uint32_t j = 0; j < NC; ++j) {
      const uint32_t kk = k + 32u * E * j;
      if (kk < K) {
        a += mg_mp_cdot<T>(c[j], xs + kk);
        if (R > 1) b += mg_mp_cdot<T>(c[j], xs + K + kk);
      }
    }
  }
  mg_f2 r;
  r.x = mg_lanes_sum(a);
  r.y = R > 1 ? mg_lanes_sum(b) : 0.0f;
  return r;
}

// LayerNorm without bias (torch.nn.LayerNorm(d, bias=False)) of v[0:n] in shared memory, in place:
// v = round((v - mean) / sqrt(var + eps) * w), mean and (biased) variance in float32, two passes.
// Every thread of the group calls it (block reductions); red: 32 shared floats.
template <typename T>
MG_FN void mg_mp_layer_norm(MG_SHARED_PTR float* v, const MG_DEVICE T* w, int n, float eps,
                            MG_SHARED_PTR float* red, uint32_t tid, uint32_t nthreads) {
  float s = 0.0f;
  for (int i = (int)tid; i < n; i += (int)nthreads) s += v[i];
  const float mean = mg_block_sum(s, red, tid, nthreads) / (float)n;
  float q = 0.0f;
  for (int i = (int)tid; i < n; i += (int)nthreads) {
    const float c = v[i] - mean;
    q += c * c;
  }
  const float r = mg_rsqrt(mg_block_sum(q, red, tid, nthreads) / (float)n + eps);
  for (int i = (int)tid; i < n; i += (int)nthreads) {
    v[i] = mg_to_float(mg_from_float<T>((v[i] - mean) * r * mg_to_float(w[i])));
  }
  MG_BARRIER();
}

// GELU, tanh form (torch's approximate="tanh", mlx.nn.gelu_approx), in float32; tanh(u) as
// 1 - 2 / (exp(2u) + 1), which saturates to +-1 without overflow trouble
MG_FN float mg_mp_gelu(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const float t = 1.0f - 2.0f / (mg_exp(2.0f * u) + 1.0f);
  return 0.5f * x * (1.0f + t);
}

// Round a float to T and back: the kernel rounds where the reference (and the MLX path) stores T.
template <typename T>
MG_FN float mg_mp_round(float x) { return mg_to_float(mg_from_float<T>(x)); }
