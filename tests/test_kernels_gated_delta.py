"""The gated delta rule (kernels_metal.gated_delta and its reference forms): the recurrence against
an independent float64 loop, the chunked prefill form and its within-chunk inverse against the
recurrence and numpy, continuation from a returned state, dtypes, the dispatch, the decode kernel's
largest CUDA variant (nvcc), its body emulated on the CPU (g++), and on a GPU the decode kernel against
the recurrence."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import mlx.core as mx
import numpy as np
import pytest

import kernels_metal as K
from kernels_metal import gpu
from kernels_metal import reference as ref
from kernels_metal import source as S


def inputs(L, Hk, Hv, Dk, Dv, seed, B=1, dtype=mx.float32, state=True, decay=0.3):
    rng = np.random.default_rng(seed)

    def a(*s):
        return mx.array(rng.standard_normal(s).astype(np.float32))

    q, k, v = a(B, L, Hk, Dk).astype(dtype), a(B, L, Hk, Dk).astype(dtype), a(B, L, Hv, Dv).astype(dtype)
    g = -mx.abs(a(B, L, Hv)) * decay  # log decays <= 0
    beta = mx.sigmoid(a(B, L, Hv))
    s0 = a(B, Hv, Dk, Dv) * 0.1 if state else None
    return q, k, v, g, beta, s0


def numpy_rule(q, k, v, g, beta, s0):
    """float64, one head at a time, written from the rule's definition."""
    q, k, v, g, beta = (np.array(t.astype(mx.float32), dtype=np.float64) for t in (q, k, v, g, beta))
    B, L, Hk, Dk = q.shape
    Hv, Dv = v.shape[2:]
    S = np.zeros((B, Hv, Dk, Dv)) if s0 is None else np.array(s0, dtype=np.float64)
    out = np.zeros((B, L, Hv, Dv))
    for b in range(B):
        for h in range(Hv):
            kh = h // (Hv // Hk)
            for t in range(L):
                qt = q[b, t, kh] / np.sqrt((q[b, t, kh] ** 2).sum() + 1e-6) / np.sqrt(Dk)
                kt = k[b, t, kh] / np.sqrt((k[b, t, kh] ** 2).sum() + 1e-6)
                S[b, h] *= np.exp(g[b, t, h])
                S[b, h] += np.outer(kt, beta[b, t, h] * (v[b, t, h] - kt @ S[b, h]))
                out[b, t, h] = qt @ S[b, h]
    return out, S


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def f32(x):
    return np.array(x.astype(mx.float32))


# what involves float32 matmuls (the chunked form, its inverse): exact but for the summation order on
# the CPU; MLX's CUDA backend runs them in TF32
TOL32 = 1e-4 if K.backend() == "cpu" else 3e-3


@pytest.mark.parametrize("L,Hk,Hv,Dk,Dv,state", [(1, 2, 4, 16, 8, True), (9, 2, 2, 8, 16, False),
                                                 (12, 1, 3, 16, 16, True), (7, 2, 4, 32, 32, False)])
def test_recurrence_matches_float64(L, Hk, Hv, Dk, Dv, state):
    x = inputs(L, Hk, Hv, Dk, Dv, seed=L + Hv, B=2, state=state)
    out, S = ref.gated_delta_recurrent(*x)
    want, want_S = numpy_rule(*x)
    assert out.shape == (2, L, Hv, Dv) and S.shape == (2, Hv, Dk, Dv)
    assert rel(out, want) < 1e-5 and rel(S, want_S) < 1e-5


def test_value_heads_read_consecutive_key_heads():
    # value heads 2j and 2j+1 read key head j (repeat_interleave), not heads j and j + Hk (tile): with
    # the value heads' own inputs equal in pairs, the outputs are equal in the same pairs only
    q, k, v, g, beta, s0 = inputs(5, 2, 4, 16, 16, seed=5)
    pairs = [0, 0, 1, 1]
    out = f32(ref.gated_delta_recurrent(q, k, v[:, :, pairs], g[:, :, pairs], beta[:, :, pairs], s0[:, pairs])[0])
    assert rel(out[:, :, 1], out[:, :, 0]) < 1e-6 and rel(out[:, :, 3], out[:, :, 2]) < 1e-6
    assert rel(out[:, :, 2], out[:, :, 0]) > 1e-2


@pytest.mark.parametrize("C,block", [(64, 16), (64, 8), (16, 16), (20, 16)])
def test_unit_lower_inverse_matches_numpy(C, block):
    rng = np.random.default_rng(C + block)
    A = np.tril(rng.standard_normal((2, 3, C, C)) * 0.4, -1).astype(np.float32)
    T = np.array(ref.unit_lower_inverse(mx.array(A), block))
    want = np.linalg.inv(np.eye(C) + A.astype(np.float64))
    # on the CPU the substitution is float32-exact but for the order of sums; TF32 on CUDA
    assert rel(T, want) < (TOL32 / 10 if K.backend() == "cpu" else TOL32)
    assert np.all(np.triu(T, 1) == 0)


@pytest.mark.parametrize("L", [1, 2, 63, 64, 65, 130, 200])
def test_chunked_equals_recurrence(L):
    x = inputs(L, 2, 4, 32, 16, seed=L)
    a, sa = ref.gated_delta_recurrent(*x)
    b, sb = ref.gated_delta_chunked(*x)
    assert b.shape == a.shape and sb.shape == sa.shape
    assert rel(b, a) < TOL32 and rel(sb, sa) < TOL32


@pytest.mark.parametrize("decay", [30.0, 0.0])
def test_chunked_is_safe_under_strong_and_no_decay(decay):
    # |g| up to ~100 a token: exp(G_i - G_j) above the diagonal would overflow unmasked (inf * 0 = nan);
    # g = 0: the state only accumulates
    x = inputs(100, 1, 2, 32, 32, seed=9, B=2, decay=decay)
    a, sa = ref.gated_delta_recurrent(*x)
    b, sb = ref.gated_delta_chunked(*x)
    assert np.all(np.isfinite(f32(b))) and np.all(np.isfinite(np.array(sb)))
    assert rel(b, a) < TOL32 and rel(sb, sa) < TOL32


def test_chunk_size_does_not_matter():
    x = inputs(100, 1, 2, 16, 16, seed=7)
    a, sa = ref.gated_delta_chunked(*x, chunk=64)
    b, sb = ref.gated_delta_chunked(*x, chunk=16)
    assert rel(b, a) < TOL32 and rel(sb, sa) < TOL32


def test_no_state_is_a_zero_state():
    x = inputs(70, 2, 4, 16, 16, seed=4, state=False)
    zeros = mx.zeros((1, 4, 16, 16), mx.float32)
    for L in (1, 70):
        a, sa = K.gated_delta(*(t[:, :L] for t in x[:5]), None)
        b, sb = K.gated_delta(*(t[:, :L] for t in x[:5]), zeros)
        assert rel(a, b) < 1e-6 and rel(sa, sb) < 1e-6


def test_continuation_from_the_returned_state():
    q, k, v, g, beta, s0 = inputs(90, 2, 4, 16, 8, seed=3)
    whole, s_whole = K.gated_delta(q, k, v, g, beta, s0)
    first, s1 = K.gated_delta(q[:, :70], k[:, :70], v[:, :70], g[:, :70], beta[:, :70], s0)
    rest = []
    s = s1
    for t in range(70, 90):  # then token by token, as decode does
        o, s = K.gated_delta(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1], s)
        rest.append(o)
    got = mx.concatenate([first] + rest, axis=1)
    assert rel(got, whole) < TOL32 and rel(s, s_whole) < TOL32


@pytest.mark.parametrize("L1", [64, 100])
def test_prefill_in_two_parts_equals_one(L1):
    # a prompt in two chunked calls (the second starting mid-chunk or on a chunk boundary) against the
    # float64 rule over all of it
    x = inputs(170, 2, 4, 32, 32, seed=L1, B=2)
    q, k, v, g, beta, s0 = x
    first, s1 = K.gated_delta(q[:, :L1], k[:, :L1], v[:, :L1], g[:, :L1], beta[:, :L1], s0)
    second, s2 = K.gated_delta(q[:, L1:], k[:, L1:], v[:, L1:], g[:, L1:], beta[:, L1:], s1)
    want, want_S = numpy_rule(*x)
    assert rel(mx.concatenate([first, second], axis=1), want) < TOL32 and rel(s2, want_S) < TOL32


@pytest.mark.parametrize("dtype,tol", [(mx.bfloat16, 3e-2), (mx.float16, 3e-3)])
@pytest.mark.parametrize("L", [1, 20])
def test_16_bit_inputs_give_16_bit_out_and_a_float32_state(dtype, tol, L):
    x = inputs(L, 2, 2, 16, 16, seed=11, dtype=dtype)
    out, S = K.gated_delta(*x)
    assert out.dtype == dtype and S.dtype == mx.float32
    # float32 arithmetic on the rounded inputs: the float64 rule on those, up to the output's rounding
    want, want_S = numpy_rule(*x)
    assert rel(out.astype(mx.float32), want) < tol and rel(S, want_S) < TOL32


def test_dispatch(monkeypatch):
    import kernels_metal

    x = inputs(65, 2, 4, 16, 32, seed=2)
    if K.backend() == "cpu":  # one token steps the recurrence, a prompt takes the chunked form
        one = [t[:, :1] for t in x[:5]] + [x[5]]
        assert all(rel(a, b) == 0 for a, b in zip(K.gated_delta(*one), ref.gated_delta_recurrent(*one)))
        assert all(rel(a, b) == 0 for a, b in zip(K.gated_delta(*x), ref.gated_delta_chunked(*x)))
    monkeypatch.setattr(kernels_metal, "backend", lambda: "cuda")
    assert kernels_metal._impl_for("gated_delta").__name__ == "kernels_metal.gpu"


def test_gpu_entry_falls_back_with_the_right_shapes(monkeypatch):
    # here (no GPU kernels on the CPU backend) or wherever the kernel cannot run: the reference answers,
    # and the kernel is tried only for the shapes it takes
    monkeypatch.setattr(gpu, "_STATUS", {})
    x = inputs(1, 2, 4, 64, 64, seed=1, B=2, dtype=mx.bfloat16)
    out, S = gpu.gated_delta(*x)
    want, want_S = ref.gated_delta_recurrent(*x)
    assert out.shape == (2, 1, 4, 64) and out.dtype == mx.bfloat16 and S.shape == (2, 4, 64, 64)
    assert rel(f32(out), f32(want)) < 1e-2 and rel(S, want_S) < 1e-5
    assert ("gated_delta_step", (mx.bfloat16, 64, 64)) in gpu.status()
    odd = inputs(1, 1, 2, 16, 24, seed=1)  # Dv not a multiple of 32: never the kernel
    gpu._STATUS.clear()
    assert rel(gpu.gated_delta(*odd)[0], ref.gated_delta_recurrent(*odd)[0]) < 1e-6 and not gpu.status()
    prompt = inputs(3, 1, 2, 16, 32, seed=1)  # a prompt: the chunked form, its scan over chunks tried as a kernel
    assert rel(gpu.gated_delta(*prompt)[0], ref.gated_delta_chunked(*prompt)[0]) < 1e-5
    assert list(gpu.status()) == [("gated_delta_scan", (16, 32, ref.GATED_DELTA_CHUNK))]
    wide = inputs(3, 1, 2, 256, 32, seed=1)  # key heads wider than the scan kernel's tile: never the kernel
    gpu._STATUS.clear()
    assert rel(gpu.gated_delta(*wide)[0], ref.gated_delta_chunked(*wide)[0]) == 0 and not gpu.status()


def conv_step_inputs(B, Hk, Hv, Dk, Dv, seed, dtype=mx.float32, taps=3):
    rng = np.random.default_rng(seed)

    def a(*s, scale=1.0):
        return mx.array((rng.standard_normal(s) * scale).astype(np.float32))

    C = 2 * Hk * Dk + Hv * Dv
    return (a(B, 1, C).astype(dtype), a(B, taps, C).astype(dtype), a(C, taps + 1, 1, scale=0.5).astype(dtype),
            a(B, 1, Hv).astype(dtype), a(B, 1, Hv).astype(dtype), a(Hv, scale=0.5).astype(dtype),
            a(Hv).astype(dtype), a(B, Hv, Dk, Dv) * 0.1)


def test_conv_step_is_the_conv_then_the_rule():
    # against the prompt path's pieces: mx.conv1d over the window, SiLU, numpy's gates, the recurrence
    B, Hk, Hv, Dk, Dv = 2, 2, 4, 16, 32
    mixed, cstate, w, a, b, A_log, dt_bias, S0 = conv_step_inputs(B, Hk, Hv, Dk, Dv, seed=3)
    out, conv, S = ref.gated_delta_conv_step(mixed, cstate, w, a, b, A_log, dt_bias, S0)
    window = mx.concatenate([cstate, mixed], axis=1)
    x = mx.conv1d(window, w, groups=mixed.shape[-1])
    x = x * mx.sigmoid(x)
    kd = Hk * Dk
    q, k, v = x[..., :kd].reshape(B, 1, Hk, Dk), x[..., kd:2 * kd].reshape(B, 1, Hk, Dk), x[..., 2 * kd:].reshape(B, 1, Hv, Dv)
    an, dn = np.array(a, dtype=np.float64), np.array(dt_bias, dtype=np.float64)
    g = -np.exp(np.array(A_log, dtype=np.float64)) * np.log1p(np.exp(an + dn))
    beta = 1 / (1 + np.exp(-np.array(b, dtype=np.float64)))
    want, want_S = numpy_rule(q, k, v, mx.array(g.astype(np.float32)), mx.array(beta.astype(np.float32)), S0)
    assert rel(out, want) < 1e-5 and rel(S, want_S) < 1e-5
    assert np.array_equal(np.array(conv), np.array(window[:, 1:]))


def test_conv_step_entry_falls_back_with_the_right_shapes(monkeypatch):
    monkeypatch.setattr(gpu, "_STATUS", {})
    x = conv_step_inputs(2, 2, 4, 64, 64, seed=4, dtype=mx.bfloat16)
    got, want = gpu.gated_delta_conv_step(*x), ref.gated_delta_conv_step(*x)
    assert [t.shape for t in got] == [(2, 1, 4, 64), (2, 3, 2 * 2 * 64 + 4 * 64), (2, 4, 64, 64)]
    assert [t.dtype for t in got] == [mx.bfloat16, mx.bfloat16, mx.float32]
    # on the CPU this is the reference itself; on a GPU the kernel keeps the conv output in float32
    # where the reference rounds it to bf16, so the float32 state differs at bf16's precision
    assert rel(f32(got[0]), f32(want[0])) < 1e-2 and rel(got[2], want[2]) < (1e-5 if mx.default_device() == mx.cpu else 1e-2)
    assert ("gated_delta_conv_step", (mx.bfloat16, 64, 64, 3)) in gpu.status()
    gpu._STATUS.clear()
    odd = conv_step_inputs(1, 1, 2, 16, 24, seed=4)  # Dv not a multiple of 32: never the kernel
    assert rel(gpu.gated_delta_conv_step(*odd)[0], ref.gated_delta_conv_step(*odd)[0]) == 0 and not gpu.status()


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
def test_largest_decode_variant_compiles_without_spills(tmp_path):
    # the spec's example (bf16, 128) is compiled with every kernel (test_kernels_sources.py); the
    # largest head dims hold the most state rows in registers
    spec = S.SPECS["gated_delta_step"]
    f = mx.float32
    example = dict(spec.example, dtypes=[f, f, f, f, f, f, mx.int32], out=[f, f], tmpl=[f, 256, 256, 8])
    from nvcc_batch import nvcc

    r = nvcc(S.cuda_program(dataclasses.replace(spec, example=example)), tmp_path, "gd")
    assert r.returncode == 0, r.stderr[:3000]
    assert "0 bytes spill stores" in r.stderr and "constexpr int DK = 256;" in (tmp_path / "gd.cu").read_text(), \
        r.stderr[-2000:]


# The decode body run on the CPU: each thread of a group an OS thread (C++20 std::barrier for
# MG_BARRIER, function-static arrays for the group's shared memory, a lane sum through them), groups one
# after another, T = float. Its index arithmetic, head mapping and reductions are then checked here too.
EMU_HEAD = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#define MG_FN inline
#define MG_DEVICE
#define MG_SHARED(type, name, n) static type name[n]
#define MG_SHARED_PTR
static std::barrier<>* group_barrier;
#define MG_BARRIER() group_barrier->arrive_and_wait()
thread_local uint32_t thread_id;
static float lane_values[1024];
MG_FN float mg_lanes_sum(float v) {
  lane_values[thread_id] = v;
  MG_BARRIER();
  float s = 0.0f;
  for (uint32_t i = 0; i < 32; ++i) s += lane_values[(thread_id & ~31u) + i];
  MG_BARRIER();
  return s;
}
MG_FN float mg_lanes_max(float) { abort(); }
MG_FN float mg_lanes_xor(float, uint32_t) { abort(); }
MG_FN int mg_lanes_xor_i(int, uint32_t) { abort(); }
MG_FN float mg_lanes_prefix_sum(float) { abort(); }
MG_FN uint32_t mg_lanes_prefix_sum_u(uint32_t) { abort(); }
MG_FN float mg_exp(float x) { return std::exp(x); }
MG_FN float mg_rsqrt(float x) { return 1.0f / std::sqrt(x); }
MG_FN float mg_inf() { return INFINITY; }
MG_FN uint32_t mg_as_uint(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
template <typename T> MG_FN float mg_to_float(T x) { return (float)x; }
template <typename T> MG_FN T mg_from_float(float x) { return (T)x; }
COMMON
static std::vector<float> load(const char* name) {
  std::vector<float> a;
  FILE* f = fopen(name, "rb");
  float x;
  while (fread(&x, 4, 1, f) == 1) a.push_back(x);
  fclose(f);
  return a;
}
static void save(const char* name, const std::vector<float>& a) {
  FILE* f = fopen(name, "wb");
  fwrite(a.data(), 4, a.size(), f);
  fclose(f);
}
"""
# ... then the decode step's kernel and its driver
EMULATION = EMU_HEAD + r"""
template <typename T, int DK, int DV, int NW>
void kernel(const T* q, const T* k, const T* v, const float* g, const float* beta, const float* s_in,
            const int* params, T* out, float* s_out, uint32_t mg_tid, uint32_t mg_nthreads, uint32_t mg_gid_x,
            uint32_t mg_lane, uint32_t mg_warp_id) {
BODY
}
template <int DK, int DV, int NW>
void run(int B, int Hk, int Hv) {
  auto q = load("q"), k = load("k"), v = load("v"), g = load("g"), beta = load("beta"), s = load("s");
  std::vector<float> out((size_t)B * Hv * DV, NAN), s_out(s.size(), NAN);
  const int params[2] = {Hk, Hv};
  const uint32_t n = 32 * NW;
  for (uint32_t gid = 0; gid < (uint32_t)(B * Hv * (DV / 32)); ++gid) {
    std::barrier<> bar(n);
    group_barrier = &bar;
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < n; ++t)
      threads.emplace_back([&, t] {
        thread_id = t;
        kernel<float, DK, DV, NW>(q.data(), k.data(), v.data(), g.data(), beta.data(), s.data(), params,
                                  out.data(), s_out.data(), t, n, gid, t & 31u, t >> 5);
      });
    for (auto& th : threads) th.join();
  }
  save("out", out);
  save("s_out", s_out);
}
int main(int argc, char** argv) {
  const int B = atoi(argv[1]), Hk = atoi(argv[2]), Hv = atoi(argv[3]), DK = atoi(argv[4]), DV = atoi(argv[5]);
DISPATCH
  return 2;
}
"""
EMULATED = [(2, 2, 4, 64, 64), (1, 3, 6, 128, 128), (2, 2, 2, 48, 96), (1, 1, 2, 256, 64)]  # B, Hk, Hv, Dk, Dv
GXX = shutil.which("g++")


@pytest.mark.skipif(GXX is None, reason="no C++ compiler")
def test_decode_body_emulated_on_the_cpu(tmp_path):
    dispatch = "".join(f"  if (DK == {dk} && DV == {dv}) {{ run<{dk}, {dv}, {gpu.gated_delta_warps(dk)}>(B, Hk, Hv); "
                       "return 0; }\n" for _, _, _, dk, dv in EMULATED)
    text = (EMULATION.replace("COMMON", S._read("preludes/common.h"))
            .replace("BODY", S._read("bodies/gated_delta_step.body")).replace("DISPATCH", dispatch))
    (tmp_path / "emulation.cpp").write_text(text)
    r = subprocess.run([GXX, "-std=c++20", "-O1", "-pthread", "emulation.cpp", "-o", "emulation"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:3000]
    for B, Hk, Hv, Dk, Dv in EMULATED:
        x = inputs(1, Hk, Hv, Dk, Dv, seed=Dk + Dv, B=B)
        for name, a in zip(("q", "k", "v", "g", "beta", "s"), x):
            f32(a).tofile(tmp_path / name)
        r = subprocess.run(["./emulation", str(B), str(Hk), str(Hv), str(Dk), str(Dv)], cwd=tmp_path, timeout=120)
        assert r.returncode == 0
        want, want_S = ref.gated_delta_recurrent(*x)
        out = np.fromfile(tmp_path / "out", np.float32).reshape(want.shape)
        s_out = np.fromfile(tmp_path / "s_out", np.float32).reshape(want_S.shape)
        assert rel(out, f32(want)) < 1e-5 and rel(s_out, want_S) < 1e-5, (B, Hk, Hv, Dk, Dv)


# The prefill's scan over chunks, emulated the same way: 256 threads a group, groups one after another.
SCAN_EMULATION = EMU_HEAD + r"""
template <int DK, int DV, int C>
void kernel(const float* U, const float* W, const float* qd, const float* kd, const float* mix, const float* glast,
            const float* s_in, const int* params, float* out, float* s_out, uint32_t mg_gid_x, uint32_t mg_lane,
            uint32_t mg_warp_id) {
BODY
}
int main(int argc, char** argv) {
  const int BH = atoi(argv[1]), n = atoi(argv[2]);
  auto U = load("U"), W = load("W"), qd = load("qd"), kd = load("kd"), mix = load("mix"), gl = load("glast"),
       s = load("s");
  std::vector<float> out((size_t)BH * n * CH * DVV, NAN), s_out(s.size(), NAN);
  const int params[1] = {n};
  for (uint32_t gid = 0; gid < (uint32_t)(BH * (DVV / 32)); ++gid) {
    std::barrier<> bar(256);
    group_barrier = &bar;
    std::vector<std::thread> threads;
    for (uint32_t t = 0; t < 256; ++t)
      threads.emplace_back([&, t] {
        thread_id = t;
        kernel<DKK, DVV, CH>(U.data(), W.data(), qd.data(), kd.data(), mix.data(), gl.data(), s.data(), params,
                             out.data(), s_out.data(), gid, t & 31u, t >> 5);
      });
    for (auto& th : threads) th.join();
  }
  save("out", out);
  save("s_out", s_out);
  return 0;
}
"""


def scan_inputs(B, H, n, C, Dk, Dv, seed):
    """Random float32 terms of the scan in their shapes, scaled so that the state stays bounded over many
    chunks as the chunked form's does (decays below 1; W and kd of norm about 0.5 / sqrt(C) a row: with
    plain normal rows the state grows by ~3x a chunk and overflows within 128 chunks)."""
    rng = np.random.default_rng(seed)
    U, qd = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((B, H, n, C, Dv), (B, H, n, C, Dk)))
    W, kd = (rng.standard_normal((B, H, n, C, Dk)).astype(np.float32) * (0.5 / np.sqrt(C * Dk)) for _ in range(2))
    mix = np.tril(rng.standard_normal((B, H, n, C, C)).astype(np.float32) * 0.3)
    G_last = -rng.uniform(0.0, 2.0, (B, H, n)).astype(np.float32)
    S = rng.standard_normal((B, H, Dk, Dv)).astype(np.float32) * 0.3
    return [mx.array(a) for a in (U, W, qd, kd, mix, G_last, S)]


@pytest.mark.skipif(GXX is None, reason="no C++ compiler")
@pytest.mark.parametrize("B,H,n,C,Dk,Dv", [(1, 2, 3, 64, 64, 64), (2, 1, 2, 16, 48, 96)])
def test_scan_body_emulated_on_the_cpu(tmp_path, B, H, n, C, Dk, Dv):
    # the prefill scan's body (gated_delta_scan.body) on the CPU against reference.gated_delta_chunk_scan
    text = (SCAN_EMULATION.replace("COMMON", S._read("preludes/common.h"))
            .replace("BODY", S._read("bodies/gated_delta_scan.body")))
    defines = f"#define DKK {Dk}\n#define DVV {Dv}\n#define CH {C}\n"
    (tmp_path / "scan.cpp").write_text(defines + text)
    r = subprocess.run([GXX, "-std=c++20", "-O1", "-pthread", "scan.cpp", "-o", "scan"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[:3000]
    x = scan_inputs(B, H, n, C, Dk, Dv, seed=n + Dk)
    for name, a in zip(("U", "W", "qd", "kd", "mix", "glast", "s"), x):
        f32(a).tofile(tmp_path / name)
    r = subprocess.run(["./scan", str(B * H), str(n)], cwd=tmp_path, timeout=120)
    assert r.returncode == 0
    want, want_S = ref.gated_delta_chunk_scan(*x)
    out = np.fromfile(tmp_path / "out", np.float32).reshape(want.shape)
    s_out = np.fromfile(tmp_path / "s_out", np.float32).reshape(want_S.shape)
    assert rel(out, f32(want)) < 1e-5 and rel(s_out, want_S) < 1e-5


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("B,H,n,C,Dk,Dv", [(1, 16, 128, 64, 128, 128), (2, 3, 5, 64, 64, 64), (1, 2, 3, 16, 48, 96)])
def test_scan_kernel_matches_the_reference(B, H, n, C, Dk, Dv):
    gpu._STATUS.pop(("gated_delta_scan", (Dk, Dv, C)), None)
    x = scan_inputs(B, H, n, C, Dk, Dv, seed=n + Dk)
    out, S_out = gpu.gated_delta_scan(*x)
    assert gpu.status()[("gated_delta_scan", (Dk, Dv, C))] is True  # the kernel ran
    want, want_S = ref.gated_delta_chunk_scan(*x)
    assert rel(out, want) < 1e-4 and rel(S_out, want_S) < 1e-4


@pytest.mark.gpu
def test_prefill_through_the_scan_kernel_follows_the_recurrence():
    # a 200-token prompt (four chunks, the last one padded) through the public API on the GPU
    x = inputs(200, 2, 4, 128, 128, seed=3)
    out, S_out = K.gated_delta(*x)
    assert gpu.status()[("gated_delta_scan", (128, 128, ref.GATED_DELTA_CHUNK))] is True
    want, want_S = ref.gated_delta_recurrent(*x)
    assert rel(out, want) < 1e-4 and rel(S_out, want_S) < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("B,Hk,Hv,Dk,Dv,dtype", [
    (1, 16, 32, 128, 128, mx.bfloat16),  # Qwen3-Next / Qwen3.5
    (2, 2, 4, 64, 64, mx.float32),  # the tiny hybrid shapes
    (1, 4, 4, 128, 128, mx.float16),
    (3, 1, 2, 256, 64, mx.float32),
    (1, 2, 2, 48, 96, mx.bfloat16),
])
def test_decode_kernel_matches_the_recurrence(B, Hk, Hv, Dk, Dv, dtype):
    gpu._STATUS.pop(("gated_delta_step", (dtype, Dk, Dv)), None)
    x = inputs(1, Hk, Hv, Dk, Dv, seed=Dk + Hv, B=B, dtype=dtype)
    out, S = gpu.gated_delta(*x)
    assert gpu.status()[("gated_delta_step", (dtype, Dk, Dv))] is True  # the kernel ran
    want, want_S = ref.gated_delta_recurrent(*x)
    assert out.dtype == dtype and S.dtype == mx.float32
    assert rel(f32(out), f32(want)) < (1e-4 if dtype == mx.float32 else 1e-2)
    assert rel(S, want_S) < 1e-4


@pytest.mark.gpu
def test_decode_kernel_steps_follow_the_float64_rule():
    # 40 decode steps through the public API, the state carried on the device, against float64
    x = inputs(40, 2, 4, 128, 128, seed=40, B=2)
    q, k, v, g, beta, s = x
    outs = []
    for t in range(40):
        o, s = K.gated_delta(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1], s)
        outs.append(o)
    want, want_S = numpy_rule(*x)
    assert rel(mx.concatenate(outs, axis=1), want) < 1e-4 and rel(s, want_S) < 1e-4
    assert gpu.status()[("gated_delta_step", (mx.float32, 128, 128))] is True


@pytest.mark.gpu
@pytest.mark.parametrize("B,Hk,Hv,Dk,Dv,taps,dtype", [
    (1, 16, 16, 128, 128, 3, mx.bfloat16),  # Qwen3.5-0.8B
    (1, 16, 32, 128, 128, 3, mx.bfloat16),  # Qwen3.5-4B, Qwen3.5-35B-A3B
    (2, 2, 4, 64, 64, 3, mx.float32),  # the tiny hybrid shapes
    (1, 4, 4, 128, 128, 1, mx.float16),
    (3, 1, 2, 256, 64, 2, mx.float32),
])
def test_conv_step_kernel_matches_the_reference(B, Hk, Hv, Dk, Dv, taps, dtype):
    key = ("gated_delta_conv_step", (dtype, Dk, Dv, taps))
    gpu._STATUS.pop(key, None)
    x = conv_step_inputs(B, Hk, Hv, Dk, Dv, seed=Dk + Hv + taps, dtype=dtype, taps=taps)
    out, conv, S = gpu.gated_delta_conv_step(*x)
    assert gpu.status()[key] is True  # the kernel ran
    want, want_conv, want_S = ref.gated_delta_conv_step(*x)
    assert out.dtype == conv.dtype == dtype and S.dtype == mx.float32
    assert np.array_equal(f32(conv), f32(want_conv))
    assert rel(f32(out), f32(want)) < (1e-4 if dtype == mx.float32 else 2e-2)
    assert rel(S, want_S) < (1e-4 if dtype == mx.float32 else 2e-2)
