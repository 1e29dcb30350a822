"""The MoE kernels (router, expert products, grouping by expert): reference against numpy
transcriptions of transformers, the CPU and grouped formulations against the reference, and (GPU) the
custom kernels against the reference, all on fresh random inputs."""

import mlx.core as mx
import numpy as np
import pytest

import kernels_metal as K
from kernels_metal import cpu, gpu
from kernels_metal import reference as ref

RNG = np.random.default_rng()


def f64(a):
    return np.array(a.astype(mx.float32), dtype=np.float64)


def rel(a, b):
    a, b = (f64(v) if isinstance(v, mx.array) else np.asarray(v, np.float64) for v in (a, b))
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def rnd(shape, dtype=mx.float32, s=1.0):
    return mx.array(RNG.standard_normal(shape) * s).astype(dtype)


def experts(E, out, inp, dtype, bits=0, group_size=64, s=0.1):
    w = rnd((E, out, inp), dtype, s)
    if not bits:
        return ref.Experts(w)
    q, sc, bi = mx.quantize(w, group_size=group_size, bits=bits)
    return ref.Experts(q, sc, bi, group_size, bits)


def f32_experts(e):
    """The same experts with float32 values (quantized: the codes kept, scales and biases upcast)."""
    if e.bits:
        return ref.Experts(e.weight, e.scales.astype(mx.float32), e.biases.astype(mx.float32), e.group_size, e.bits)
    return ref.Experts(e.weight.astype(mx.float32))


def np_router(logits, k, norm):
    """transformers' Qwen2Moe/Qwen3Moe TopKRouter after the linear: softmax in float32, topk, renorm."""
    z = f64(logits)
    p = np.exp(z - z.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    inds = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    top = np.take_along_axis(p, inds, -1)
    if norm:
        top = top / top.sum(-1, keepdims=True)
    return top, inds


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("T,E,k", [(1, 8, 2), (7, 128, 8), (3, 60, 4), (2, 512, 10)])
def test_route_reference_and_cpu(T, E, k, norm):
    logits = rnd((T, E), s=3.0)
    want_p, want_i = np_router(logits, k, norm)
    for fn in (ref.moe_route, cpu.moe_route):
        p, i = fn(logits, k, norm)
        assert p.dtype == logits.dtype and i.dtype == mx.int32 and p.shape == (T, k)
        assert np.array_equal(np.array(i), want_i)
        assert np.max(np.abs(f64(p) - want_p)) < 1e-6


def test_route_ties_go_to_the_smaller_expert():
    logits = mx.array([[0.5, 2.0, 2.0, 1.0, 2.0]], mx.float32)
    p, i = ref.moe_route(logits, 3, False)
    assert np.array(i).tolist() == [[1, 2, 4]]
    p, i = ref.moe_route(logits.astype(mx.bfloat16), 2, True)
    assert p.dtype == mx.bfloat16 and np.allclose(f64(p), 0.5)


def np_experts(x, inds, scores, g, u, d):
    """transformers' Qwen3MoeExperts in float64: per token, the chosen experts' SwiGLU weighted."""
    wg, wu, wd = (f64(ref.expert_weights(e, mx.arange(e.weight.shape[0]))) for e in (g, u, d))
    xn, ii, ss = f64(x), np.array(inds), f64(scores)
    out = np.zeros(xn.shape)
    for t in range(xn.shape[0]):
        for j in range(ii.shape[1]):
            e = ii[t, j]
            gg, uu = wg[e] @ xn[t], wu[e] @ xn[t]
            out[t] += ss[t, j] * (wd[e] @ (gg / (1 + np.exp(-gg)) * uu))
    return out


@pytest.mark.parametrize("bits", [0, 4, 8])
def test_experts_reference_is_transformers(bits):
    E, H, I, T, k = 6, 64, 32, 5, 3
    g, u, d = experts(E, I, H, mx.float32, bits, 32), experts(E, I, H, mx.float32, bits, 32), \
        experts(E, H, I, mx.float32, bits, 32)
    x = rnd((T, H))
    scores, inds = ref.moe_route(rnd((T, E), s=3.0), k, True)
    got = ref.moe_experts(x, inds, scores, g, u, d)
    assert rel(got, np_experts(x, inds, scores, g, u, d)) < 1e-5


CASES = [(dt, bits, T) for dt in (mx.float32, mx.bfloat16) for bits in (0, 4, 8) for T in (1, 3, 40)]


@pytest.mark.parametrize("dtype,bits,T", CASES)
def test_cpu_experts_equal_reference(dtype, bits, T):
    E, H, I, k = 8, 128, 64, 4
    g, u, d = experts(E, I, H, dtype, bits), experts(E, I, H, dtype, bits), experts(E, H, I, dtype, bits)
    x = rnd((T, H), dtype)
    scores, inds = ref.moe_route(rnd((T, E), dtype, 3.0), k, False)
    # the CPU backend's formulation, on the CPU device wherever the test runs (on MLX's CUDA backend,
    # 0.32.4, the sorted gather_mm it relies on gave wrong rows at 160 assignments; the GPU
    # backend never dispatches here)
    with mx.stream(mx.cpu):
        want = ref.moe_experts(x, inds, scores, g, u, d)
        got = cpu.moe_experts(x, inds, scores, g, u, d)
        mx.eval(want, got)
    assert got.dtype == dtype and got.shape == (T, H)
    # float32: the same sums in another order. 16-bit: the reference is ~0.45% from float64 arithmetic,
    # the CPU formulation ~0.9% (its products in float32, each rounded once to 16 bits, and the
    # activation in 16 bits)
    if dtype != mx.float32 and bits:
        # by the norm of the difference, since the largest element's error is heavy-tailed: over 2000
        # random draws at T=1 (2026-11-27) it averaged 0.010, 99% within 0.016, the largest 0.021. (With
        # the products in 16 bits it was 0.022 on average and up to 0.059: a bound of 0.04 failed in CI.)
        a, b = f64(got), f64(want)
        assert float(np.linalg.norm(a - b) / np.linalg.norm(b)) < 3e-2
    else:
        assert rel(got, want) < (1e-5 if dtype == mx.float32 else 2e-2)


def check_pack(inds, E, B, src, dst, bexp):
    inds, src, dst, bexp = (np.array(a) for a in (inds, src, dst, bexp))
    A = inds.size
    nblk = -(-A // B) + E
    assert src.shape == (nblk * B,) and dst.shape == (A,) and bexp.shape == (nblk,)
    assert np.array_equal(src[dst], np.arange(A))  # each assignment has its own row
    assert (src == -1).sum() == nblk * B - A  # every other row is padding
    rows_expert = bexp[np.arange(nblk * B) // B]
    assert np.array_equal(rows_expert[dst], inds)  # a row's block is its assignment's expert
    assert np.all((bexp >= 0) & (bexp < E))
    counts = np.bincount(inds, minlength=E)
    used = int(np.sum(-(-counts // B)))
    assert np.all(src[used * B:] == -1)


@pytest.mark.parametrize("A,E,B", [(1, 4, 16), (37, 8, 4), (300, 60, 16), (2048, 128, 64)])
def test_pack_reference(A, E, B):
    inds = mx.array(RNG.integers(0, E, A), mx.int32)
    check_pack(inds, E, B, *ref.moe_pack(inds, E, B))


@pytest.mark.parametrize("bits", [0, 4])
@pytest.mark.parametrize("T,B", [(5, 4), (33, 16)])
def test_grouped_blocks_equal_reference(T, B, bits):
    # the GPU's grouped formulation, run here on MLX's CPU ops (its gather_mm takes float32)
    E, H, I, k = 8, 64, 32, 3
    dt = mx.float32 if not bits else mx.bfloat16
    g, u, d = experts(E, I, H, dt, bits, 32), experts(E, I, H, dt, bits, 32), experts(E, H, I, dt, bits, 32)
    x = rnd((T, H), dt)
    scores, inds = ref.moe_route(rnd((T, E), dt, 3.0), k, True)
    got = gpu.moe_grouped(x, inds, scores, g, u, d, block=B)
    # 16-bit quantized: MLX's CPU gather_qmm is itself 3-4% from float32 (test_cpu_experts_equal_reference)
    assert rel(got, ref.moe_experts(x, inds, scores, g, u, d)) < (1e-5 if dt == mx.float32 else 6e-2)


def test_public_functions_dispatch():
    T, E, H, I, k = 2, 8, 64, 32, 2
    logits = rnd((T, E), s=3.0)
    scores, inds = K.moe_route(logits, k, True)
    ws, wi = ref.moe_route(logits, k, True)
    assert np.array_equal(np.array(inds), np.array(wi)) and rel(scores, ws) < 1e-6
    g, u, d = experts(E, I, H, mx.float32), experts(E, I, H, mx.float32), experts(E, H, I, mx.float32)
    x = rnd((T, H))
    assert rel(K.moe_experts(x, inds, scores, g, u, d), ref.moe_experts(x, inds, scores, g, u, d)) < 1e-5


# --- the custom GPU kernels -------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("E,k", [(8, 2), (128, 8), (512, 10)])
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_gpu_route(E, k, dtype):
    logits = rnd((33, E), dtype, 3.0)
    for norm in (True, False):
        p, i = gpu.moe_route(logits, k, norm)
        wp, wi = ref.moe_route(logits, k, norm)
        assert np.array_equal(np.array(i), np.array(wi))
        assert rel(p, wp) < (1e-6 if dtype == mx.float32 else 1e-2)
    assert gpu.status().get(("moe_route", (dtype,))) is True


@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs", [(0, 0), (4, 64), (4, 32), (8, 128)])
@pytest.mark.parametrize("T", [1, 3])
def test_gpu_expert_gemv(bits, gs, T):
    E, H, I, k = 16, 512, 256, 4
    dt = mx.bfloat16
    g, u, d = experts(E, I, H, dt, bits, gs), experts(E, I, H, dt, bits, gs), experts(E, H, I, dt, bits, gs)
    x = rnd((T, H), dt)
    scores, inds = ref.moe_route(rnd((T, E), dt, 3.0), k, True)
    got = gpu.moe_gemv(x, inds, scores, g, u, d)
    # bf16 rounds in both: on these shapes the bf16 reference is itself 0.9-1.5% (median, max of 150 draws,
    # CPU, 2026-11-26) from the same sums in float32, so a fixed 1e-2 between the two failed now and then
    # (0.0105 on the H200). The kernel is held to float32 instead: no further than twice the bf16 reference.
    want = ref.moe_experts(x, inds, scores, g, u, d)
    exact = ref.moe_experts(x.astype(mx.float32), inds, scores.astype(mx.float32), f32_experts(g), f32_experts(u),
                            f32_experts(d))
    assert rel(got, exact) < 2 * rel(want, exact) + 2e-3
    sfx = f"_q{bits}" if bits else ""
    assert all(v for (name, _), v in gpu.status().items() if name in ("moe_gate_up" + sfx, "moe_down" + sfx))


@pytest.mark.gpu
@pytest.mark.parametrize("A,E,B", [(1, 4, 16), (300, 60, 16), (16384, 128, 64), (5000, 512, 32)])
def test_gpu_pack(A, E, B):
    inds = mx.array(RNG.integers(0, E, A), mx.int32)
    check_pack(inds, E, B, *gpu.moe_pack(inds, E, B))
    assert gpu.status().get(("moe_pack", (B,))) is True


@pytest.mark.gpu
@pytest.mark.parametrize("bits", [0, 4])
def test_gpu_grouped(bits):
    E, H, I, k, T = 32, 256, 128, 4, 300
    dt = mx.bfloat16
    g, u, d = experts(E, I, H, dt, bits), experts(E, I, H, dt, bits), experts(E, H, I, dt, bits)
    x = rnd((T, H), dt)
    scores, inds = ref.moe_route(rnd((T, E), dt, 3.0), k, False)
    assert rel(gpu.moe_grouped(x, inds, scores, g, u, d), ref.moe_experts(x, inds, scores, g, u, d)) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("T,E,k,H,I,bgu,bd", [(300, 32, 4, 256, 128, 128, 128), (300, 32, 4, 256, 128, 64, 64),
                                              (40, 128, 8, 512, 192, 64, 128), (1030, 60, 4, 128, 64, 64, 64)])
def test_gpu_grouped_gemm(monkeypatch, dtype, T, E, k, H, I, bgu, bd):
    # experts with many rows (several blocks), few (padding) and none (E 128 for 40 tokens)
    monkeypatch.setattr(gpu, "MOE_GEMM_BN_GATE_UP", bgu)
    monkeypatch.setattr(gpu, "MOE_GEMM_BN_DOWN", bd)
    g, u, d = experts(E, I, H, dtype), experts(E, I, H, dtype), experts(E, H, I, dtype)
    x = rnd((T, H), dtype)
    scores, inds = ref.moe_route(rnd((T, E), dtype, 3.0), k, True)
    assert gpu._gemm_ok(x, g, u, d)
    got = gpu.moe_gemm(x, inds, scores, g, u, d)
    assert rel(got, ref.moe_experts(x, inds, scores, g, u, d)) < 2e-2
    st = gpu.status()
    assert st.get(("moe_gemm_gate_up", (dtype, 64, bgu))) is True
    assert st.get(("moe_gemm_down", (dtype, 64, bd))) is True
    assert st.get(("moe_unpack", (dtype,))) is True


@pytest.mark.gpu
def test_gpu_unpack():
    T, k, H, rows = 37, 3, 72, 200
    y = rnd((rows, H), mx.bfloat16)
    dst = mx.array(RNG.permutation(rows)[:T * k], mx.int32)
    scores = rnd((T, k), mx.bfloat16).abs()
    want = (scores.astype(mx.float32)[..., None] * y[dst].reshape(T, k, H).astype(mx.float32)).sum(1)
    assert rel(gpu.moe_unpack(y, dst, scores, mx.bfloat16), want) < 1e-2
    assert gpu.status().get(("moe_unpack", (mx.bfloat16,))) is True


@pytest.mark.gpu
@pytest.mark.parametrize("bits,gs", [(4, 64), (8, 32), (4, 128)])
@pytest.mark.parametrize("bgu,bd", [(128, 128), (64, 64)])
def test_gpu_grouped_gemm_quantized(monkeypatch, bits, gs, bgu, bd):
    monkeypatch.setattr(gpu, "MOE_GEMM_BN_GATE_UP", bgu)
    monkeypatch.setattr(gpu, "MOE_GEMM_BN_DOWN", bd)
    T, E, k, H, I = 300, 32, 4, 256, 128
    dt = mx.bfloat16
    g, u, d = experts(E, I, H, dt, bits, gs), experts(E, I, H, dt, bits, gs), experts(E, H, I, dt, bits, gs)
    x = rnd((T, H), dt)
    scores, inds = ref.moe_route(rnd((T, E), dt, 3.0), k, True)
    assert gpu._gemm_ok(x, g, u, d)
    got = gpu.moe_gemm(x, inds, scores, g, u, d)
    assert rel(got, ref.moe_experts(x, inds, scores, g, u, d)) < 2e-2
    st = gpu.status()
    assert st.get((f"moe_gemm_gate_up_q{bits}", (dt, 64, bgu, bits, gs, dt))) is True
    assert st.get((f"moe_gemm_down_q{bits}", (dt, 64, bd, bits, gs, dt))) is True
