"""kernels_metal.reference against float64 numpy transcriptions (fresh random inputs, odd shapes)."""

import math

import mlx.core as mx
import numpy as np
import pytest

from kernels_metal import reference as ref

RNG = np.random.default_rng()


def f64(a):
    return np.array(a.astype(mx.float32), dtype=np.float64)


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("shape", [(1, 7), (3, 5, 33), (2, 896)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_rms_norm(shape, dtype):
    x = mx.array(RNG.standard_normal(shape)).astype(dtype)
    w = mx.array(1 + 0.1 * RNG.standard_normal(shape[-1])).astype(dtype)
    y = ref.rms_norm(x, w, 1e-5)
    assert y.dtype == dtype
    xn, wn = f64(x), f64(w)
    want = xn / np.sqrt(np.mean(xn * xn, axis=-1, keepdims=True) + 1e-5) * wn
    assert rel(f64(y), want) < (1e-5 if dtype == mx.float32 else 1e-2)
    r = mx.array(RNG.standard_normal(shape)).astype(dtype)
    y2, h = ref.add_rms_norm(x, r, w, 1e-5)
    assert rel(f64(h), xn + f64(r)) < (1e-6 if dtype == mx.float32 else 1e-2)
    assert np.array_equal(np.array(y2.astype(mx.float32)), np.array(ref.rms_norm(h, w, 1e-5).astype(mx.float32)))


def _inv(D, base=10000.0):
    return 1.0 / base ** (np.arange(0, D, 2, dtype=np.float64) / D)


def test_rope_table_cached_and_exact():
    inv = _inv(64)
    t = ref.rope_table(inv, 100, 1.25)
    assert t is ref.rope_table(inv.copy(), 100, 1.25)
    assert t is not ref.rope_table(inv, 100, 1.0)
    assert t.cos.shape == (100, 32) and t.cos.dtype == mx.float32 and t.dims == 64 and t.max_positions == 100
    ang = np.arange(100)[:, None] * inv[None]
    assert np.allclose(np.array(t.cos), np.cos(ang) * 1.25, atol=1e-6)
    assert np.allclose(np.array(t.sin), np.sin(ang) * 1.25, atol=1e-6)


def _hf_rope(x, cos, sin):
    # transcription of transformers' apply_rotary_pos_emb with cos/sin = cat(freqs, freqs)
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


@pytest.mark.parametrize("B,H,L,D,offset", [(1, 3, 1, 64, 17), (2, 5, 9, 128, 0), (1, 2, 13, 32, 300)])
def test_rope(B, H, L, D, offset):
    t = ref.rope_table(_inv(D), 512)
    x = mx.array(RNG.standard_normal((B, H, L, D))).astype(mx.float32)
    y = ref.rope(x, t, offset)
    ang = (offset + np.arange(L))[:, None] * _inv(D)[None]
    emb = np.concatenate([ang, ang], axis=-1)
    want = _hf_rope(f64(x), np.cos(emb), np.sin(emb))
    assert rel(f64(y), want) < 1e-5
    with pytest.raises(ValueError):
        ref.rope(x, t, 512)


def _hf_mrope(x, inv, pid, section, interleaved):
    """Numpy transcription of transformers' Qwen2-VL apply_multimodal_rotary_pos_emb and of the
    Qwen3-VL apply_interleaved_mrope (freqs (3, B, L, D/2) from three position rows)."""
    freqs = pid[..., None].astype(np.float64) * inv[None, None, None, :]  # (3, B, L, half)
    if interleaved:
        f = freqs[0].copy()
        for dim, offset in enumerate((1, 2), start=1):
            length = section[dim] * 3
            f[..., offset:length:3] = freqs[dim, ..., offset:length:3]
        emb = np.concatenate([f, f], axis=-1)
        cos, sin = np.cos(emb), np.sin(emb)
    else:
        emb = np.concatenate([freqs, freqs], axis=-1)  # (3, B, L, D)
        cos, sin = np.cos(emb), np.sin(emb)
        sec2 = list(section) * 2
        bounds = np.cumsum(sec2)[:-1]
        cos = np.concatenate([m[i % 3] for i, m in enumerate(np.split(cos, bounds, axis=-1))], axis=-1)
        sin = np.concatenate([m[i % 3] for i, m in enumerate(np.split(sin, bounds, axis=-1))], axis=-1)
    return _hf_rope(x, cos[:, None], sin[:, None])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("D,section", [(128, (24, 20, 20)), (64, (16, 8, 8)), (128, (16, 24, 24))])
def test_mrope(interleaved, D, section):
    B, H, L = 2, 3, 7
    t = ref.rope_table(_inv(D), 1000)
    x = mx.array(RNG.standard_normal((B, H, L, D))).astype(mx.float32)
    pid = RNG.integers(0, 1000, (3, B, L))
    y = ref.mrope(x, t, mx.array(pid), section, interleaved)
    want = _hf_mrope(f64(x), _inv(D), pid, section, interleaved)
    assert rel(f64(y), want) < 1e-5


def test_mrope_axis_maps():
    a = ref.mrope_axis_map((24, 20, 20), False)
    assert list(a[:24]) == [0] * 24 and list(a[24:44]) == [1] * 20 and list(a[44:]) == [2] * 20
    b = ref.mrope_axis_map((24, 20, 20), True)
    assert list(b[:6]) == [0, 1, 2, 0, 1, 2] and b[58] == 1 and b[59] == 2 and list(b[60:]) == [0] * 4
    assert (b == 1).sum() == 20 and (b == 2).sum() == 20


@pytest.mark.parametrize("G", [1, 2, 4, 8])
def test_decode_attention(G):
    B, Hkv, D, S, length = 2, 3, 32, 41, 29
    q = mx.array(RNG.standard_normal((B, Hkv * G, 1, D))).astype(mx.float32)
    k = mx.array(RNG.standard_normal((B, Hkv, S, D))).astype(mx.float32)
    v = mx.array(RNG.standard_normal((B, Hkv, S, D))).astype(mx.float32)
    o = ref.decode_attention(q, k, v, length, 0.2)
    kn = np.repeat(f64(k)[:, :, :length], G, axis=1)  # HF repeat_kv
    vn = np.repeat(f64(v)[:, :, :length], G, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", f64(q), kn) * 0.2
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert rel(f64(o), np.einsum("bhqk,bhkd->bhqd", p, vn)) < 1e-5


def random_pages(lengths, bs, Hkv, D, spare=3):
    """A shuffled pool (slots, Hkv, D) with spare blocks no row holds, and each row's blocks: (k, v, table (B, MB))."""
    need = [-(-n // bs) for n in lengths]
    nblocks = sum(need) + spare
    order = RNG.permutation(nblocks)
    table, at = np.zeros((len(lengths), max(need)), np.int32), 0
    for b, n in enumerate(need):
        table[b, :n] = order[at : at + n]
        at += n
    k = mx.array(RNG.standard_normal((nblocks * bs, Hkv, D))).astype(mx.float32)
    v = mx.array(RNG.standard_normal((nblocks * bs, Hkv, D))).astype(mx.float32)
    return k, v, mx.array(table)


@pytest.mark.parametrize("G", [1, 3, 4])
def test_paged_decode_attention(G):
    # rows of different lengths, each over its own shuffled blocks; against float64 attention over each
    # row's positions gathered by hand
    lengths, bs, Hkv, D = [29, 1, 16, 40], 16, 2, 32
    k, v, table = random_pages(lengths, bs, Hkv, D)
    q = mx.array(RNG.standard_normal((len(lengths), Hkv * G, 1, D))).astype(mx.float32)
    o = ref.paged_decode_attention(q, k, v, table, mx.array(lengths, mx.int32), max(lengths), bs, 0.3)
    kn, vn, tn = f64(k), f64(v), np.array(table)
    for b, n in enumerate(lengths):
        slots = [tn[b, p // bs] * bs + p % bs for p in range(n)]
        kb = np.repeat(kn[slots].transpose(1, 0, 2), G, axis=0)  # (Hq, n, D), HF repeat_kv
        vb = np.repeat(vn[slots].transpose(1, 0, 2), G, axis=0)
        s = np.einsum("hd,hkd->hk", f64(q)[b, :, 0], kb) * 0.3
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        assert rel(f64(o)[b, :, 0], np.einsum("hk,hkd->hd", p, vb)) < 1e-5, b


@pytest.mark.parametrize("norms", [True, False])
def test_qk_rope_store(norms):
    # against float64: each head normed (where weights are given), turned at its row's position; the pools
    # written at each row's slot and nowhere else, the inputs left as they were
    B, Hq, Hkv, D, eps = 3, 4, 2, 64, 1e-6
    inv = 1.0 / 1e4 ** (np.arange(0, D, 2) / D)
    table = ref.rope_table(inv, 64, attention_scale=1.5)
    q = mx.array(RNG.standard_normal((B, 1, Hq * D))).astype(mx.float32)
    k = mx.array(RNG.standard_normal((B, 1, Hkv * D))).astype(mx.float32)
    v = mx.array(RNG.standard_normal((B, 1, Hkv * D))).astype(mx.float32)
    qw = mx.array(1 + 0.1 * RNG.standard_normal(D)).astype(mx.float32) if norms else None
    kw = mx.array(1 + 0.1 * RNG.standard_normal(D)).astype(mx.float32) if norms else None
    pos, slots = mx.array([5, 0, 63], mx.int32), mx.array([7, 2, 4], mx.int32)
    kp, vp = mx.zeros((9, Hkv, D)), mx.zeros((9, Hkv, D))
    qo, kp2, vp2 = ref.qk_rope_store(q, k, v, qw, kw, eps, table, pos, slots, kp, vp)
    assert not np.array(kp).any() and not np.array(vp).any()

    def want(x, w, H):
        x = f64(x).reshape(B, H, D)
        if w is not None:
            x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * f64(w)
        ang = np.array([5, 0, 63])[:, None, None] * inv[None, None, :]  # (B, 1, D/2)
        c, s = np.cos(ang) * 1.5, np.sin(ang) * 1.5
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)

    assert qo.shape == (B, Hq, 1, D)
    assert rel(f64(qo)[:, :, 0], want(q, qw, Hq)) < 1e-5
    assert rel(f64(kp2)[[7, 2, 4]], want(k, kw, Hkv)) < 1e-5
    assert np.array_equal(np.array(vp2)[[7, 2, 4]], np.array(v).reshape(B, Hkv, D))
    untouched = [i for i in range(9) if i not in (7, 2, 4)]
    assert not np.array(kp2)[untouched].any() and not np.array(vp2)[untouched].any()
    # one fused projection: the queries, keys and values side by side, the same result
    fused = ref.qk_rope_store(mx.concatenate([q, k, v], axis=-1), None, None, qw, kw, eps, table, pos, slots, kp, vp)
    for a, b in zip(fused, (qo, kp2, vp2)):
        assert np.array_equal(np.array(a), np.array(b))


@pytest.mark.parametrize("bits,gs", [(4, 32), (4, 64), (8, 64), (8, 128)])
def test_linear_and_quantized(bits, gs):
    x = mx.array(RNG.standard_normal((3, 256))).astype(mx.float32)
    w = mx.array(RNG.standard_normal((37, 256)) * 0.1).astype(mx.float32)
    b = mx.array(RNG.standard_normal(37)).astype(mx.float32)
    # a float32 matmul: 1e-5 on the CPU; MLX's CUDA GEMM rounds its inputs to TF32 (3.3e-4 here, H200)
    tol = 1e-5 if __import__("kernels_metal").backend() == "cpu" else 2e-3
    assert rel(f64(ref.linear(x, w, b)), f64(x) @ f64(w).T + f64(b)) < tol
    wq, s, bq = mx.quantize(w, group_size=gs, bits=bits)
    wd = f64(mx.dequantize(wq, s, bq, group_size=gs, bits=bits))
    # the layout: uint32 words, low bits first, w = scale * q + bias per group along K
    qn = np.array(wq)
    per = 32 // bits
    q = ((qn[:, :, None] >> (bits * np.arange(per))[None, None]) & ((1 << bits) - 1)).reshape(37, 256)
    manual = q * np.repeat(f64(s), gs, axis=1) + np.repeat(f64(bq), gs, axis=1)
    assert np.allclose(manual, wd, atol=1e-5)
    assert rel(f64(ref.quantized_linear(x, wq, s, bq, gs, bits)), f64(x) @ wd.T) < tol


# ------------------------------------------------------------------------------------------ sampler


def test_state_and_uniforms():
    st = ref.make_sample_state(123)
    # [seed, counter] and two words of padding (16 bytes: out of MLX's CUDA pool of small arrays)
    assert st.dtype == mx.uint32 and st.tolist() == [123, 0, 0, 0]
    u = ref.hash_uniform(st, 3, 5000)
    un = np.array(u)
    assert un.min() > 0 and un.max() < 1 and abs(un.mean() - 0.5) < 0.02
    assert np.array_equal(un, np.array(ref.hash_uniform(st, 3, 5000)))
    assert not np.array_equal(un, np.array(ref.hash_uniform(ref.advance_state(st), 3, 5000)))
    assert not np.array_equal(un[0], un[1])
    logits = mx.array(RNG.standard_normal((2, 50))).astype(mx.bfloat16)
    tok, lp, ns = ref.sample(logits, 0.0, 0, 1.0, 0.0, st)
    # the third word is row 0's token, read through token_word as a view (the fast path's next input)
    assert ns.tolist() == [123, 1, tok[0].item(), 0] and tok.dtype == mx.int32 and lp.dtype == mx.float32
    assert ref.token_word(ns).dtype == mx.int32 and ref.token_word(ns).tolist() == [tok[0].item()]
    assert ref.sample(logits, 0.0, 0, 1.0, 0.0, mx.array([123, 0, 0, 7], mx.uint32))[2].tolist()[3] == 7
    assert ref.sample(logits, 0.0, 0, 1.0, 0.0, mx.array([123, 0], mx.uint32))[2].tolist() == [123, 1]
    # a state of 2 words (as made before the padding) still advances its counter, and the padding rides along
    assert ref.advance_state(mx.array([5, 9], mx.uint32)).tolist() == [5, 10]
    assert ref.advance_state(mx.array([5, 9, 7, 3], mx.uint32)).tolist() == [5, 10, 7, 3]
    ln = f64(logits)
    assert np.array_equal(np.array(tok), ln.argmax(-1))
    lse = np.log(np.exp(ln - ln.max(-1, keepdims=True)).sum(-1)) + ln.max(-1)
    assert np.allclose(np.array(lp), ln[np.arange(2), np.array(tok)] - lse, atol=1e-5)


def _hf_filter(s, top_k, top_p, min_p):
    """Transcription of HF's TopK, TopP (sort ascending, remove cumsum <= 1 - top_p, keep the
    last) and MinP warpers on one row of temperature-scaled logits (no ties)."""
    s = s.copy()
    if top_k:
        kth = np.sort(s)[-top_k]
        s[s < kth] = -np.inf
    if top_p < 1:
        order = np.argsort(s)
        p = np.exp(s[order] - s.max())
        p /= p.sum()
        remove = np.cumsum(p) <= 1 - top_p
        remove[-1] = False
        s[order[remove]] = -np.inf
    if min_p > 0:
        p = np.exp(s - s.max())
        p /= p.sum()
        s[p < min_p * p.max()] = -np.inf
    return s


@pytest.mark.parametrize("k,p,m", [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.1), (12, 0.9, 0.05),
                                   (0, 0.3, 0.0), (3, 0.5, 0.2)])
def test_filters_match_hf(k, p, m):
    for _ in range(5):
        row = RNG.standard_normal(64) * 2
        got = np.array(ref.filtered_logits(mx.array(row[None]).astype(mx.float32), 0.7, k, p, m))[0]
        want = _hf_filter((row.astype(np.float32) / np.float32(0.7)).astype(np.float64), k, p, m)
        assert np.array_equal(np.isfinite(got), np.isfinite(want)), (k, p, m)


def chi2_sampler(sample_fn, temp, k, p, m, V=20, n=20000, seed=0):
    """Draw n tokens with the given sampler (n identical rows in one call) and return the
    normal-approximation z of the chi-square statistic against the exact truncated,
    renormalized distribution, and the number of draws outside the support."""
    base = mx.array(np.random.default_rng(seed).standard_normal(V) * 1.5).astype(mx.float32)
    logits = mx.broadcast_to(base[None], (n, V))
    tok, _, _ = sample_fn(logits, temp, k, p, m, ref.make_sample_state(seed + 7))
    counts = np.bincount(np.array(tok), minlength=V).astype(np.float64)
    probs = np.array(mx.softmax(ref.filtered_logits(base[None], temp, k, p, m)[0])).astype(np.float64)
    keep = probs > 0
    e = probs[keep] * n
    chi2 = ((counts[keep] - e) ** 2 / e).sum()
    dof = max(1, keep.sum() - 1)
    return (chi2 - dof) / math.sqrt(2 * dof), counts[~keep].sum()


@pytest.mark.parametrize("temp,k,p,m", [(1.0, 0, 1.0, 0.0), (0.6, 0, 1.0, 0.0), (1.0, 6, 1.0, 0.0),
                                        (1.0, 0, 0.7, 0.0), (1.0, 0, 1.0, 0.15), (0.9, 8, 0.85, 0.05)])
def test_sampler_chi_square(temp, k, p, m):
    z, outside = chi2_sampler(ref.sample, temp, k, p, m)
    assert outside == 0
    assert abs(z) < 4.5, z
