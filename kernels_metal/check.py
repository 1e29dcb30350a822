"""GPU check of every kernel twin against its reference, with timings.

    python -m kernels_metal.check [--quick] [--out DIR]

Fresh random inputs (never zeros) at small, odd and real model shapes. For each case: the max
relative error (max |ours - ref| / max |ref|, the reference in float32 composite MLX ops), our time,
the time of the MLX built-in the kernel replaces, the bytes each must move at least, and the
reached fraction of the measured copy bandwidth. A compact table is printed last; full JSON lines
go to DIR/check.jsonl when --out (or $OUT) is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

import mlx.core as mx
import numpy as np

import kernels_metal as K
from kernels_metal import cpu as cpu_impl
from kernels_metal import gpu
from kernels_metal import reference as ref

ROWS = []
RNG = np.random.default_rng()
LOG = None


def log(msg):
    print(msg, flush=True)
    if LOG:
        LOG.write(msg + "\n")
        LOG.flush()


def bench(fn, reps=20, trials=7):
    """Median seconds per call: `reps` calls queued, then one evaluation, `trials` times."""
    out = fn()
    mx.eval(out)
    out = fn()
    mx.eval(out)
    ts = []
    for _ in range(trials):
        t0 = time.perf_counter()
        outs = [fn() for _ in range(reps)]
        mx.eval(outs)
        ts.append((time.perf_counter() - t0) / reps)
    return float(np.median(ts))


def relerr(a, b):
    a = np.array(a.astype(mx.float32), dtype=np.float64)
    b = np.array(b.astype(mx.float32), dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    if not np.all(np.isfinite(a)):
        return float("inf")
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


COPY_BW = None


def copy_bandwidth():
    a = mx.random.normal((256 * 1024 * 1024,)).astype(mx.bfloat16)  # 512 MiB
    mx.eval(a)
    t = bench(lambda: a + 1, reps=5, trials=5)
    return 2 * a.nbytes / t


def record(kernel, shape, err, tol, t_ours, t_mlx, nbytes, mlx_name, extra=None):
    bw = nbytes / t_ours if t_ours else float("nan")
    row = dict(kernel=kernel, shape=shape, err=err, tol=tol, ok=bool(err <= tol), us=t_ours * 1e6,
               mlx_us=(t_mlx * 1e6 if t_mlx else None), mlx=mlx_name, GBps=bw / 1e9,
               frac=(bw / COPY_BW if COPY_BW else None))
    if extra:
        row.update(extra)
    ROWS.append(row)
    log(json.dumps(row))


def rnd(shape, dtype=mx.bfloat16, scale=1.0):
    return (mx.random.normal(shape) * scale).astype(dtype)


def case(fn):
    def wrapped(*a, **k):
        try:
            fn(*a, **k)
        except Exception as e:  # noqa: BLE001
            log(f"ERROR {fn.__name__} {a} {k}: {type(e).__name__}: {e}")
            log(traceback.format_exc())
            ROWS.append(dict(kernel=fn.__name__, shape=str(a), err=float("inf"), tol=0, ok=False, us=0,
                             mlx_us=None, mlx="", GBps=0, frac=0))
    return wrapped


@case
def c_rms(rows, D, dtype=mx.bfloat16, add=False):
    x = rnd((rows, D), dtype)
    w = (1 + 0.1 * mx.random.normal((D,))).astype(dtype)
    if add:
        r = rnd((rows, D), dtype)
        y, h = gpu.add_rms_norm(x, r, w, 1e-6)
        yr, hr = ref.add_rms_norm(x, r, w, 1e-6)
        err = max(relerr(y, yr), relerr(h, hr))
        t = bench(lambda: gpu.add_rms_norm(x, r, w, 1e-6))
        tm = bench(lambda: (mx.fast.rms_norm(x + r, w, 1e-6), x + r))
        nb = 4 * x.nbytes + w.nbytes
    else:
        y = gpu.rms_norm(x, w, 1e-6)
        err = relerr(y, ref.rms_norm(x, w, 1e-6))
        t = bench(lambda: gpu.rms_norm(x, w, 1e-6))
        tm = bench(lambda: mx.fast.rms_norm(x, w, 1e-6))
        nb = 2 * x.nbytes + w.nbytes
    record("add_rms_norm" if add else "rms_norm", f"{rows}x{D} {dtype}".replace("mlx.core.", ""), err,
           1e-2 if dtype != mx.float32 else 1e-5, t, tm, nb, "fast.rms_norm")


def _inv(D, base=1e6):
    return 1.0 / base ** (np.arange(0, D, 2, dtype=np.float64) / D)


@case
def c_rope(B, H, L, D, offset, dtype=mx.bfloat16):
    tab = K.rope_table(_inv(D), 40960)
    x = rnd((B, H, L, D), dtype)
    y = gpu.rope(x, tab, offset)
    err = relerr(y, ref.rope(x, tab, offset))
    t = bench(lambda: gpu.rope(x, tab, offset))
    tm = bench(lambda: mx.fast.rope(x, D, traditional=False, base=1e6, scale=1.0, offset=offset))
    record("rope", f"B{B} H{H} L{L} D{D} off{offset}", err, 1e-2, t, tm, 2 * x.nbytes, "fast.rope")


@case
def c_paged_attn(lengths, Hkv, G, D, bs=32, nsplit=None):
    # each row over its own blocks, shuffled through the pool; timed against what MLX alone would do: gather
    # every row's positions into (B, Hkv, S, D), then SDPA with a length mask (kernels_metal.cpu's form)
    B, S = len(lengths), max(lengths)
    need = [-(-n // bs) for n in lengths]
    order = np.random.default_rng(0).permutation(sum(need))
    table = np.zeros((B, max(need)), np.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = order[at : at + n]
        at += n
    table = mx.array(table)
    k, v = rnd((sum(need) * bs, Hkv, D)), rnd((sum(need) * bs, Hkv, D))
    q = rnd((B, Hkv * G, 1, D))
    n = mx.array(lengths, mx.int32)
    scale = 1.0 / math.sqrt(D)
    o = gpu.paged_decode_attention(q, k, v, table, n, S, bs, scale, nsplit=nsplit)
    err = relerr(o, ref.paged_decode_attention(q, k, v, table, n, S, bs, scale))
    t = bench(lambda: gpu.paged_decode_attention(q, k, v, table, n, S, bs, scale, nsplit=nsplit))
    tm = bench(lambda: cpu_impl.paged_decode_attention(q, k, v, table, n, S, bs, scale))
    ns = nsplit or gpu.attention_splits(B * Hkv, S)
    record("paged_decode_attention", f"B{B} Hkv{Hkv} G{G} D{D} L{min(lengths)}-{S} bs{bs} split{ns}", err, 1e-2, t,
           tm, 2 * Hkv * sum(lengths) * D * 2 + 2 * q.nbytes, "gather+sdpa")


@case
def c_qk_store(B, Hq, Hkv, D, norms=True, fused=False):
    # a batch's step between its projections and attention: against what the layers do with MLX's ops
    # (two norms, two RoPEs, two scatters into the pools); fused: q, k, v read from one projection
    table = K.rope_table(_inv(D), 40960)
    q, k, v = rnd((B, 1, Hq * D)), rnd((B, 1, Hkv * D)), rnd((B, 1, Hkv * D))
    qkv = mx.concatenate([q, k, v], axis=-1)
    mx.eval(qkv)
    qw, kw = (rnd((D,)) + 1, rnd((D,)) + 1) if norms else (None, None)
    pos = mx.array(np.random.default_rng(B).integers(0, 4000, B).astype(np.int32))
    slots = mx.array(np.random.default_rng(B + 1).permutation(4 * B)[:B].astype(np.int32))
    kp, vp = rnd((4 * B, Hkv, D)), rnd((4 * B, Hkv, D))
    want = ref.qk_rope_store(q, k, v, qw, kw, 1e-6, table, pos, slots, kp, vp)
    mx.eval(want)
    args = (qkv, None, None) if fused else (q, k, v)
    got = gpu.qk_rope_store(*args, qw, kw, 1e-6, table, pos, slots, kp, vp)
    err = max(relerr(a, b) for a, b in zip(got, want))
    t = bench(lambda: gpu.qk_rope_store(*args, qw, kw, 1e-6, table, pos, slots, kp, vp)[0])

    def layers():
        qh, kh = q.reshape(B, 1, Hq, D), k.reshape(B, 1, Hkv, D)
        if norms:
            qh, kh = mx.fast.rms_norm(qh, qw, 1e-6), mx.fast.rms_norm(kh, kw, 1e-6)
        qh, kh = qh.transpose(0, 2, 1, 3), kh.transpose(0, 2, 1, 3)
        qh = cpu_impl.rope(qh, table, pos)
        kh = cpu_impl.rope(kh, table, pos)
        kp2, vp2 = mx.array(kp), mx.array(vp)
        kp2[slots] = kh[:, :, 0, :]
        vp2[slots] = v.reshape(B, Hkv, D)
        return qh, kp2, vp2

    tm = bench(layers)
    record("qk_rope_store", f"B{B} Hq{Hq} Hkv{Hkv} D{D}" + ("" if norms else " no-norm") + (" fused" if fused else ""),
           err, 1e-2, t, tm,
           2 * (q.nbytes + k.nbytes + v.nbytes), "norm+rope+scatter")


@case
def c_mrope(B, H, L, D, sec, inter):
    tab = K.rope_table(_inv(D), 40960)
    x = rnd((B, H, L, D))
    pid = mx.random.randint(0, 40000, (3, B, L))
    y = gpu.mrope(x, tab, pid, sec, inter)
    err = relerr(y, ref.mrope(x, tab, pid, sec, inter))
    t = bench(lambda: gpu.mrope(x, tab, pid, sec, inter))
    tm = bench(lambda: mx.fast.rope(x, D, traditional=False, base=1e6, scale=1.0, offset=7))
    record("mrope" + ("_inter" if inter else ""), f"B{B} H{H} L{L} D{D} {list(sec)}", err, 1e-2, t, tm,
           2 * x.nbytes, "fast.rope(1 pos)")


@case
def c_attn(B, Hkv, G, D, length, nsplit=None, cap_extra=13):
    Hq = Hkv * G
    S = length + cap_extra
    q = rnd((B, Hq, 1, D))
    k = rnd((B, Hkv, S, D))
    v = rnd((B, Hkv, S, D))
    scale = 1.0 / math.sqrt(D)
    o = gpu.decode_attention(q, k, v, length, scale, nsplit=nsplit)
    err = relerr(o, ref.decode_attention(q, k, v, length, scale))
    t = bench(lambda: gpu.decode_attention(q, k, v, length, scale, nsplit=nsplit))
    ks, vs = k[:, :, :length], v[:, :, :length]
    tm = bench(lambda: mx.fast.scaled_dot_product_attention(q, ks, vs, scale=scale))
    ns = nsplit or gpu.attention_splits(B * Hkv, length)
    record("decode_attention", f"B{B} Hkv{Hkv} G{G} D{D} L{length} split{ns}", err, 1e-2, t, tm,
           2 * B * Hkv * length * D * 2 + 2 * q.nbytes, "fast.sdpa")


@case
def c_gemv(M, Kd, N, dtype=mx.bfloat16, bias=False, force=True):
    x = rnd((M, Kd), dtype)
    w = rnd((N, Kd), dtype, 0.05)
    b = rnd((N,), dtype) if bias else None
    f = (lambda: gpu.gemv(x, w, b)) if force else (lambda: K.linear(x, w, b))
    y = f()
    err = relerr(y, ref.linear(x, w, b))
    t = bench(f)
    tm = bench(lambda: (x @ w.T + b) if bias else x @ w.T)
    record("gemv" + ("_bias" if bias else ""), f"M{M} K{Kd} N{N} {dtype}".replace("mlx.core.", ""), err, 1e-2, t,
           tm, w.nbytes + x.nbytes + M * N * 2, "matmul", dict(M=M, K=Kd, N=N))


@case
def c_qgemv(M, Kd, N, bits, gs=64, bias=False):
    x = rnd((M, Kd))
    wf = rnd((N, Kd), mx.bfloat16, 0.05)
    w, s, bq = mx.quantize(wf, group_size=gs, bits=bits)
    b = rnd((N,)) if bias else None
    f = lambda: gpu.gemv_quantized(x, w, s, bq, gs, bits, b)  # noqa: E731
    y = f()
    err = relerr(y, ref.quantized_linear(x, w, s, bq, gs, bits, b))
    t = bench(f)
    tm = bench(lambda: mx.quantized_matmul(x, w, s, bq, transpose=True, group_size=gs, bits=bits))
    record(f"gemv_q{bits}" + ("_bias" if bias else ""), f"M{M} K{Kd} N{N} g{gs}", err, 1e-2, t, tm,
           w.nbytes + s.nbytes + bq.nbytes + x.nbytes + M * N * 2, "quantized_matmul", dict(M=M, K=Kd, N=N))


@case
def c_sample(B, V, temp, top_k, top_p, min_p, penalty=1.0, seeds=8):
    agree = 0
    total = 0
    lperr = 0.0
    scratch = gpu.make_sample_scratch(B, V)  # one for every call: its sync words carry over launches
    recent = mx.array(RNG.integers(0, V, (B, 20)), dtype=mx.int32)
    for sd in range(seeds):
        logits = rnd((B, V), mx.bfloat16, 3.0)
        st = K.make_sample_state(1234 + sd) + mx.array([0, sd * 17, 0, 0], dtype=mx.uint32)
        tok, lp, ns = gpu.sample(logits, temp, top_k, top_p, min_p, st, recent, penalty, scratch)
        rt, rl, rns = ref.sample(logits, temp, top_k, top_p, min_p, st, recent, penalty)
        agree += int(mx.sum(tok == rt).item())
        total += B
        lperr = max(lperr, relerr(lp, rl))
        # the states agree but for the third word, each side's own token of row 0 (draws may differ at ties)
        ns_, rns_ = np.array(ns), np.array(rns)
        assert ns_[2] == np.array(tok)[0] and rns_[2] == np.array(rt)[0], (ns, tok, rns, rt)
        assert np.array_equal(np.delete(ns_, 2), np.delete(rns_, 2)), (ns, rns)
    logits = rnd((B, V), mx.bfloat16, 3.0)
    st = K.make_sample_state(5)
    chain = [st]

    def draw():  # each call takes the state of the one before: calls sharing a scratch must run in order
        tok, lp, chain[0] = gpu.sample(logits, temp, top_k, top_p, min_p, chain[0], recent, penalty, scratch)
        return tok, lp, chain[0]

    t = bench(draw)
    tm = bench(lambda: ref.sample(logits, temp, top_k, top_p, min_p, st, recent, penalty))
    err = 1.0 - agree / total
    record("sample", f"B{B} V{V} T{temp} k{top_k} p{top_p} m{min_p} pen{penalty} groups{gpu.sample_groups(B, V)}",
           err, 0.02, t, tm, logits.nbytes, "reference ops", dict(token_mismatch=err, lp_err=lperr))


def _chi2(counts, base, temp, top_k, top_p, min_p):
    n = counts.sum()
    s = ref.filtered_logits(base[None], temp, top_k, top_p, min_p)[0]
    p = np.array(mx.softmax(s)).astype(np.float64)
    keep = p > 1e-9
    outside = counts[~keep].sum()
    e = p[keep] * n
    chi2 = float(((counts[keep] - e) ** 2 / e).sum())
    dof = max(1, int(keep.sum()) - 1)
    return chi2, dof, outside, (chi2 - dof) / math.sqrt(2 * dof)  # z: the normal approximation


@case
def c_sample_chi2(temp, top_k, top_p, min_p, V=24, n=16384):
    """Draw n tokens (n identical rows, one draw each: one group a row) and chi-square against the
    exact truncated, renormalized distribution."""
    base = mx.random.normal((V,)) * 1.5
    logits = mx.broadcast_to(base[None], (n, V)).astype(mx.float32)
    st = K.make_sample_state(99)
    tok, _, _ = gpu.sample(logits, temp, top_k, top_p, min_p, st)
    counts = np.bincount(np.array(tok), minlength=V).astype(np.float64)
    chi2, dof, outside, z = _chi2(counts, base, temp, top_k, top_p, min_p)
    record("sample_chi2", f"V{V} T{temp} k{top_k} p{top_p} m{min_p} n{n}", abs(z) if outside == 0 else 1e9, 4.0,
           0, 0, 0, "", dict(chi2=chi2, dof=dof, outside=outside))


@case
def c_sample_chi2_groups(temp, top_k, top_p, min_p, V=8192, live=24, n=4096):
    """n chained draws from one row split over several groups: `live` likely tokens spread over the
    vocabulary (every group holds some), the rest 30 nats down; chi-square as c_sample_chi2."""
    base = np.full(V, -30.0, np.float32)
    base[np.linspace(0, V - 1, live).astype(int)] = np.array(mx.random.normal((live,)) * 1.5)
    base = mx.array(base)
    logits = base[None]
    scratch = gpu.make_sample_scratch(1, V)
    st = K.make_sample_state(7)
    toks = []
    for _ in range(n):
        tok, _, st = gpu.sample(logits, temp, top_k, top_p, min_p, st, None, 1.0, scratch)
        toks.append(tok)
    counts = np.bincount(np.array(mx.concatenate(toks)), minlength=V).astype(np.float64)
    chi2, dof, outside, z = _chi2(counts, base, temp, top_k, top_p, min_p)
    record("sample_chi2", f"V{V} groups{gpu.sample_groups(1, V)} T{temp} k{top_k} p{top_p} m{min_p} n{n}",
           abs(z) if outside == 0 else 1e9, 4.0, 0, 0, 0, "", dict(chi2=chi2, dof=dof, outside=outside))


def _experts(E, out, inp, bits, gs=64, dtype=mx.bfloat16):
    w = rnd((E, out, inp), dtype, 0.05)
    if not bits:
        return ref.Experts(w)
    q, sc, bi = mx.quantize(w, group_size=gs, bits=bits)
    return ref.Experts(q, sc, bi, gs, bits)


def _expert_bytes(ex, n_experts_read):
    per = sum(a.nbytes for a in (ex.weight, ex.scales, ex.biases) if a is not None) / ex.weight.shape[0]
    return per * n_experts_read


@case
def c_moe_route(T, E, k):
    logits = rnd((T, E), mx.bfloat16, 3.0)
    p, i = gpu.moe_route(logits, k, True)
    rp, ri = ref.moe_route(logits, k, True)
    mism = float(np.mean(np.array(i) != np.array(ri)))
    err = max(relerr(p, rp), mism)
    from . import cpu

    t = bench(lambda: gpu.moe_route(logits, k, True))
    tm = bench(lambda: cpu.moe_route(logits, k, True))
    record("moe_route", f"T{T} E{E} k{k}", err, 1e-2, t, tm, logits.nbytes, "softmax+argsort")


@case
def c_moe_gemm_tiles(T, H, I, E, k):
    """The grouped GEMM kernels' column tiles (gate/up, down) at T tokens."""
    saved = gpu.MOE_GEMM_BN_GATE_UP, gpu.MOE_GEMM_BN_DOWN
    g, u, d = _experts(E, I, H, 0, 64), _experts(E, I, H, 0, 64), _experts(E, H, I, 0, 64)
    x = rnd((T, H), mx.bfloat16)
    scores, inds = ref.moe_route(rnd((T, E), mx.bfloat16, 3.0), k, True)
    mx.eval(scores, inds)
    n = 16
    want = ref.moe_experts(x[:n], inds[:n], scores[:n], g, u, d)
    try:
        for bgu, bd in [(64, 64), (128, 64), (64, 128), (128, 128)]:
            gpu.MOE_GEMM_BN_GATE_UP, gpu.MOE_GEMM_BN_DOWN = bgu, bd
            f = lambda: gpu.moe_gemm(x, inds, scores, g, u, d)  # noqa: E731
            err = relerr(f()[:n], want)
            t = bench(f, reps=5 if T > 256 else 20, trials=5)
            record(f"moe_gemm_{bgu}_{bd}", f"T{T} H{H} I{I} E{E} k{k}", err, 2e-2, t, None,
                   sum(_expert_bytes(e, E) for e in (g, u, d)), "-", dict(T=T, tflops=2 * 3 * T * k * H * I / t / 1e12))
    finally:
        gpu.MOE_GEMM_BN_GATE_UP, gpu.MOE_GEMM_BN_DOWN = saved


@case
def c_moe_experts(T, H, I, E, k, bits, gs=64, block=None, ref_check=True):
    """The routed experts at T tokens: ours (GEMV kernels for few tokens, else grouped blocks) against
    the reference (small T) or mlx-lm's sorted gather_mm (large T), timed against the latter."""
    from . import cpu

    g, u, d = _experts(E, I, H, bits, gs), _experts(E, I, H, bits, gs), _experts(E, H, I, bits, gs)
    x = rnd((T, H), mx.bfloat16)
    scores, inds = ref.moe_route(rnd((T, E), mx.bfloat16, 3.0), k, True)
    mx.eval(scores, inds)
    if block:  # the built-in gather_mm / gather_qmm over blocks of `block` rows
        f = lambda: gpu.moe_grouped(x, inds, scores, g, u, d, block=block)  # noqa: E731
        name = f"moe_blocks{block}"
    else:
        f = lambda: gpu.moe_experts(x, inds, scores, g, u, d)  # noqa: E731
        name = "moe_" + gpu.experts_path(x, g, u, d)
    y = f()
    # the reference on the first 16 tokens (all of them when few): its float32 gathered weights take
    # T x k expert matrices
    n = T if ref_check else 16
    err = relerr(y[:n], ref.moe_experts(x[:n], inds[:n], scores[:n], g, u, d))
    t = bench(f, reps=5 if T > 256 else 20, trials=5)
    tm = bench(lambda: cpu.moe_experts(x, inds, scores, g, u, d), reps=5 if T > 256 else 20, trials=5)
    touched = len(set(np.array(inds).reshape(-1).tolist())) if T > gpu.MOE_GEMV_MAX_TOKENS else T * k
    nb = sum(_expert_bytes(e, touched) for e in (g, u, d))
    record(name + (f"_q{bits}" if bits else ""), f"T{T} H{H} I{I} E{E} k{k}" + (f" g{gs}" if bits else ""), err,
           2e-2, t, tm, nb, "mlx-lm sorted gather_mm",
           dict(T=T, tflops=2 * 3 * T * k * H * I / t / 1e12))


@case
def c_moe_pack(A, E, B):
    inds = mx.array(np.random.default_rng(A).integers(0, E, A), mx.int32)
    src, dst, bexp = gpu.moe_pack(inds, E, B)
    src, dst, bexp = np.array(src), np.array(dst), np.array(bexp)
    ok = (np.array_equal(src[dst], np.arange(A)) and (src == -1).sum() == src.size - A
          and np.array_equal(bexp[np.arange(src.size) // B][dst], np.array(inds)))
    t = bench(lambda: gpu.moe_pack(inds, E, B))
    tm = bench(lambda: ref.moe_pack(inds, E, B))
    record("moe_pack", f"A{A} E{E} B{B}", 0.0 if ok else 1.0, 0.5, t, tm, inds.nbytes, "reference ops")


@case
def c_gated_delta(B, Hk, Hv, D, dtype=mx.bfloat16):
    """One decode token of the gated delta rule: the fused kernel (gated_delta_step) against the
    recurrence in MLX ops, which it replaces; the bytes are the float32 state's, read and written once
    (q, k, v and the output add under 1% at real shapes)."""
    q, k, v = rnd((B, 1, Hk, D), dtype), rnd((B, 1, Hk, D), dtype), rnd((B, 1, Hv, D), dtype)
    g = -mx.abs(mx.random.normal((B, 1, Hv))) * 0.3
    beta = mx.sigmoid(mx.random.normal((B, 1, Hv)))
    s = mx.random.normal((B, Hv, D, D)) * 0.1
    o, s1 = gpu.gated_delta(q, k, v, g, beta, s)
    ro, rs = ref.gated_delta_recurrent(q, k, v, g, beta, s)
    err = max(relerr(o, ro), relerr(s1, rs))
    t = bench(lambda: gpu.gated_delta(q, k, v, g, beta, s))
    tm = bench(lambda: ref.gated_delta_recurrent(q, k, v, g, beta, s))
    record("gated_delta", f"B{B} Hk{Hk} Hv{Hv} D{D} {dtype}".replace("mlx.core.", ""), err,
           1e-4 if dtype == mx.float32 else 1e-2, t, tm, 2 * s.nbytes, "reference ops")


@case
def c_gated_delta_prefill(B, Hk, Hv, D, L):
    """A prompt of L tokens: the chunked form (MLX matmuls, chunks of 64) against the token-by-token
    recurrence, both timed; the bytes are q, k, v and the output once."""
    q, k, v = rnd((B, L, Hk, D)), rnd((B, L, Hk, D)), rnd((B, L, Hv, D))
    g = -mx.abs(mx.random.normal((B, L, Hv))) * 0.3
    beta = mx.sigmoid(mx.random.normal((B, L, Hv)))
    o, s1 = gpu.gated_delta(q, k, v, g, beta)
    ro, rs = ref.gated_delta_recurrent(q, k, v, g, beta)
    err = max(relerr(o, ro), relerr(s1, rs))
    t = bench(lambda: gpu.gated_delta(q, k, v, g, beta), reps=3, trials=3)
    tm = bench(lambda: ref.gated_delta_recurrent(q, k, v, g, beta), reps=1, trials=3)
    record("gated_delta_prefill", f"B{B} Hk{Hk} Hv{Hv} D{D} L{L}", err, 1e-2, t, tm,
           q.nbytes + k.nbytes + 2 * v.nbytes, "recurrence", dict(tok_per_s=B * L / t))


def main(argv=None):
    global LOG, COPY_BW
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        LOG = open(os.path.join(args.out, "check.jsonl"), "w")
    K.set_verbose(True)
    log(f"backend={K.backend()} mlx={mx.__version__} device={mx.default_device()}")
    mx.random.seed(0)
    COPY_BW = copy_bandwidth()
    log(f"copy bandwidth (read+write) {COPY_BW / 1e9:.0f} GB/s")
    only = set(args.only.split(",")) if args.only else None
    q = args.quick

    def want(k):
        return only is None or k in only

    if want("norm"):
        for rows in ([1, 7] if q else [1, 7, 64, 2048]):
            for D in [896, 1024, 2560]:
                c_rms(rows, D)
                c_rms(rows, D, add=True)
        c_rms(3, 100, mx.float16)
        c_rms(5, 1000, mx.float32)
    if want("rope"):
        for (H, D) in [(14, 64), (16, 128), (32, 128)]:
            for L in ([1, 9] if q else [1, 9, 512]):
                c_rope(1, H, L, D, 32000 if L < 100 else 5)
        c_rope(3, 2, 5, 64, 77, mx.float16)
        for inter in (False, True):
            c_mrope(1, 16, 9, 128, (24, 20, 20), inter)
            c_mrope(2, 4, 300, 128, (16, 24, 24), inter)
            c_mrope(1, 14, 1, 64, (8, 12, 12), inter)
    if want("attn"):
        for (Hkv, G, D) in [(2, 7, 64), (8, 2, 128), (8, 4, 128), (2, 1, 128), (4, 8, 64)]:
            for L in ([1, 37, 4096] if q else [1, 37, 1000, 4096, 32768]):
                c_attn(1, Hkv, G, D, L)
        c_attn(4, 8, 2, 128, 2049)
        c_attn(3, 2, 4, 64, 777, nsplit=1)
        c_attn(3, 2, 4, 64, 777, nsplit=5)
        c_attn(1, 8, 2, 128, 32768, nsplit=1)
    if want("paged"):
        # a batch's decode step: qwen3-0.6b's heads (8 KV, G 2, D 128), rows of mixed lengths
        for B, lo, hi in ([(8, 100, 400), (32, 200, 600)] if q else [(8, 100, 400), (32, 200, 600), (32, 100, 4096),
                                                                      (64, 200, 600)]):
            lengths = np.random.default_rng(B).integers(lo, hi + 1, B).tolist()
            for bs in (16, 32, 64):
                c_paged_attn(lengths, 8, 2, 128, bs)
        c_paged_attn([5, 3000, 17], 2, 7, 64, 32, nsplit=1)
        c_paged_attn([5, 3000, 17], 2, 7, 64, 32, nsplit=6)
        for B in (8, 32, 64):
            c_qk_store(B, 16, 8, 128)
        c_qk_store(32, 16, 8, 128, fused=True)
        c_qk_store(32, 14, 2, 64, norms=False)
        c_qk_store(32, 14, 2, 64, norms=False, fused=True)
    if want("gemv"):
        shapes = [(896, 896), (896, 4864), (4864, 896), (1024, 3072), (2560, 9728), (9728, 2560), (1024, 151936)]
        if q:
            shapes = shapes[:3] + shapes[-1:]
        for (Kd, N) in shapes:
            for M in [1, 2, 4]:
                c_gemv(M, Kd, N)
        c_gemv(3, 136, 77, mx.float16, bias=True)
        c_gemv(1, 896, 4864, bias=True)
        for (Kd, N) in shapes:
            for bits in (4, 8):
                for M in [1, 4]:
                    c_qgemv(M, Kd, N, bits)
        c_qgemv(2, 1024, 300, 4, gs=32, bias=True)
        c_qgemv(1, 1024, 300, 8, gs=128, bias=True)
    if want("overhead"):
        # host cost of one call: the raw kernel object with prepared inputs vs the public path
        x = rnd((1, 896))
        w = rnd((896, 896), scale=0.05)
        prm = mx.array([896, 896], dtype=mx.int32)
        kern = gpu.kernel("gemv")
        raw = lambda: kern(inputs=[x, w, prm], template=[("T", x.dtype), ("M", 1), ("NW", 4)],  # noqa: E731
                           grid=(224 * 128, 1, 1), threadgroup=(128, 1, 1), output_shapes=[(1, 896)],
                           output_dtypes=[x.dtype])[0]
        t_raw = bench(raw)
        t_pub = bench(lambda: gpu.gemv(x, w))
        t_add = bench(lambda: x + 1)
        t_mm = bench(lambda: x @ w.T)
        log(f"overhead: raw cuda_kernel call {t_raw*1e6:.1f} us, gemv() {t_pub*1e6:.1f} us, "
            f"x+1 {t_add*1e6:.1f} us, matmul {t_mm*1e6:.1f} us")
    if want("dispatch"):
        # the dispatch rule: GEMV vs matmul for growing row counts
        for (Kd, N) in ([(1024, 3072), (2560, 9728)] if q else [(896, 4864), (1024, 3072), (2560, 9728), (9728, 2560)]):
            for M in [1, 2, 3, 4, 6, 8, 12, 16]:
                c_gemv(M, Kd, N)
            for M in [1, 2, 4, 8, 16]:
                c_qgemv(M, Kd, N, 4)
    if want("sample"):
        for V in ([3072, 151936] if q else [2048, 3072, 151936]):
            for (T, k, p, m) in [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 50, 1.0, 0.0), (0.8, 0, 0.9, 0.0),
                                 (1.0, 0, 1.0, 0.05), (0.7, 20, 0.8, 0.05)]:
                for B in (1, 4):
                    c_sample(B, V, T, k, p, m)
            c_sample(1, V, 0.7, 0, 0.9, 0.0, 1.1)  # the decode loop's sampled setting, penalty folded in
            c_sample(1, V, 0.0, 0, 1.0, 0.0, 1.1)
        for (T, k, p, m) in [(1.0, 0, 1.0, 0.0), (0.8, 6, 1.0, 0.0), (1.0, 0, 0.7, 0.0), (1.0, 0, 1.0, 0.2),
                             (0.9, 10, 0.8, 0.1)]:
            c_sample_chi2(T, k, p, m)
            c_sample_chi2_groups(T, k, p, m)
    if want("moe"):
        # Qwen3-30B-A3B's sparse layer (H 2048, expert I 768, 128 experts, top 8), Qwen3-Next's router
        for (T, E, k) in [(1, 128, 8), (2048, 128, 8), (1, 512, 10), (33, 60, 4)]:
            c_moe_route(T, E, k)
        for bits, gs in [(0, 64), (4, 64), (8, 64), (4, 32)]:
            for T in ([1, 4] if q else [1, 2, 4]):
                c_moe_experts(T, 2048, 768, 128, 8, bits, gs)
        c_moe_experts(1, 2048, 1408, 60, 4, 0)  # Qwen1.5-MoE
        for A, E, B in [(8, 128, 64), (16384, 128, 64), (16384, 128, 16), (20480, 512, 32)]:
            c_moe_pack(A, E, B)
    if want("moe_prefill"):
        for T in (512, 2048):
            c_moe_gemm_tiles(T, 2048, 768, 128, 8)
        # prefill-shaped: ours (bf16: the grouped GEMM kernels) and the built-in over blocks
        for bits in (0, 4):
            for T in ([16, 512, 2048] if q else [8, 16, 128, 512, 2048, 4096]):
                for block in ([None, 64] if q else [None, 16, 64]):
                    c_moe_experts(T, 2048, 768, 128, 8, bits, block=block, ref_check=T <= 16)
    if want("gated_delta"):
        # Qwen3-Next-80B / Qwen3.5-35B (16 key heads, 32 value heads of 128), Qwen3.5-397B (64 value
        # heads), the tiny hybrid shapes (2 and 4 of 64), equal key and value heads
        for (Hk, Hv, D) in [(16, 32, 128), (16, 64, 128), (2, 4, 64), (8, 8, 128)]:
            for B in ([1] if q else [1, 4]):
                c_gated_delta(B, Hk, Hv, D)
        c_gated_delta(2, 16, 32, 128, mx.float32)
        c_gated_delta(3, 1, 2, 256, mx.float16)
        for L in ([64, 512] if q else [64, 512, 2048]):
            c_gated_delta_prefill(1, 16, 32, 128, L)
    fell = {k: v for k, v in gpu.status().items() if v is False}
    log(f"variants that fell back to the reference: {fell if fell else 'none'}")
    # compact table last
    log("")
    log(f"{'kernel':<16} {'shape':<34} {'maxrel':>9} {'ok':>3} {'ours us':>8} {'mlx us':>8} {'GB/s':>7} {'frac':>5}")
    for r in ROWS:
        mlxus = f"{r['mlx_us']:.1f}" if r.get("mlx_us") else "-"
        frac = f"{r['frac']:.2f}" if r.get("frac") else "-"
        log(f"{r['kernel']:<16} {r['shape'][:34]:<34} {r['err']:>9.2e} {'Y' if r['ok'] else 'N':>3} "
            f"{r['us']:>8.1f} {mlxus:>8} {r['GBps']:>7.0f} {frac:>5}")
    bad = [r for r in ROWS if not r["ok"]]
    log(f"{len(ROWS) - len(bad)}/{len(ROWS)} cases within tolerance")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
