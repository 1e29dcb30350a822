"""The GPU variants (Metal or CUDA, from one body each) behind kernels_metal's functions.

Each (variant, template arguments) is built once and cached. The first call of each is evaluated
eagerly inside a try: a variant that cannot be built or run on this backend falls back to its
reference for good, reported on stderr only under kernels_metal.set_verbose(True).
"""

from __future__ import annotations

import functools
import hashlib
import math
import sys

from typing import Optional

import mlx.core as mx

from . import reference as ref
from . import source as S

# Matmul dispatch rule (docs/kernels.md, measured by `python -m kernels_metal.check`): products
# with at most GEMV_MAX_ROWS rows of x use the GEMV kernels, larger ones mx.matmul /
# mx.quantized_matmul.
GEMV_MAX_ROWS = 4
# Measured on an H200 with MLX 0.32.4
# (benchmarks/results/kernels_h200_2026-11-21/kernels_h200_run2_dispatch.txt): the dense
# bf16 GEMV never beat mx.matmul (MLX's own GEMV path costs ~7 us against ~13 us for any
# mx.fast.cuda_kernel call), so dense products stay on mx.matmul; the quantized GEMV beats
# mx.quantized_matmul at 3-4 rows on matrices of >= 16M weights (51 vs 64 us at 2560x9728 q4,
# 214 vs 374 us at the 1024x151936 q4 head) and at 1 row only on >= 64M weights (82 vs 103 us).
QGEMV_MIN_WEIGHTS_ROWS34 = 16 * 1024 * 1024
QGEMV_MIN_WEIGHTS_ROW1 = 64 * 1024 * 1024
DENSE_GEMV = False  # set True to route dense decode products to the GEMV kernel anyway
# rows of W a lane-group of the dense GEMV takes (4 was no faster against mx.matmul's heads, docs/kernels.md)
DENSE_GEMV_ROWS = 1


# rows of W a lane-group of the quantized GEMV takes (gemv.body's R; docs/kernels.md, H200 2026-11-27)
QGEMV_ROWS = 4


def use_gemv(quantized: bool, rows: int, K: int, N: int) -> bool:
    """The matmul dispatch rule (docs/kernels.md): True where the GEMV kernel is used. Measured on
    CUDA only; Metal applies the same rule until it is measured there."""
    if rows < 1 or rows > GEMV_MAX_ROWS:
        return False
    if not quantized:
        return DENSE_GEMV
    weights = K * N
    if rows >= 3:
        return weights >= QGEMV_MIN_WEIGHTS_ROWS34
    if rows == 1:
        return weights >= QGEMV_MIN_WEIGHTS_ROW1
    return False

# Custom kernel or MLX built-in, per call on a GPU backend (docs/kernels.md). Every
# mx.fast.cuda_kernel call costs ~12.8 us of host time on the H200 against ~5-8 us for a built-in,
# so at decode shapes a custom kernel wins only where it saves more device time than that:
# rms_norm 15-40 us vs mx.fast.rms_norm 5-10, rope 31-46 vs mx.fast.rope 8-16 (always lose);
# decode attention 39-83 vs SDPA 6-28 up to 4k context, a tie at 32k with G=2 (99.8 vs 101.9)
# and a win at 32k with G=4 (144 vs 161); the sampler 61-145 vs 313-680 for its MLX form
# (always wins); M-RoPE has no built-in.
# benchmarks/results/kernels_h200_2026-11-21/kernels_h200_run1.txt holds the figures.
ATTN_CUSTOM_MIN_LENGTH = 16384
ALWAYS_CUSTOM = frozenset({"sample", "mrope", "paged_decode_attention", "qk_rope_store", "linear", "quantized_linear", "moe_route", "moe_experts", "moe_pack",
                           "gated_delta", "gated_delta_conv_step", "kv_store", "add_rms_norm"})
# (add_rms_norm is one launch where MLX's ops are two, an add and a norm: a batch's step, bound by launches,
# is its user; linear, quantized_linear, moe_experts and gated_delta choose a kernel or a built-in inside; the gated
# delta rule has no built-in: its decode step is the kernel, a prompt the chunked form, whose scan over
# chunks is the gated_delta_scan kernel)


def custom_wins(kernel: str, length: int = 0) -> bool:
    """True where the custom variant of `kernel` is used rather than MLX's built-in."""
    if kernel in ALWAYS_CUSTOM:
        return True
    if kernel == "decode_attention":
        return length >= ATTN_CUSTOM_MIN_LENGTH
    return False


# decode attention: split the context when (batch x KV heads) groups would leave the GPU idle
ATTN_TARGET_GROUPS = 256
ATTN_MIN_CHUNK = 256
ATTN_WARPS = 4

_KERNELS = {}
_STATUS = {}  # key -> True (ran) / False (fell back)


def _backend():
    from . import backend

    return backend()


def _say(msg):
    from . import verbose

    if verbose():
        print(f"[kernels_metal] {msg}", file=sys.stderr)


def kernel_name(name: str, header: str, body: str) -> str:
    """The name MLX compiles a variant under: its own name and a hash of its generated source. MLX's
    CUDA backend caches compiled kernels on disk by name and template arguments only
    (`$TMPDIR/mlx/<version>/ptx`), so a kernel whose source changed under the same name (a metalgen
    upgrade, an A/B of two sources on one machine) would run the stale binary."""
    digest = hashlib.sha1((header + "\0" + body).encode()).hexdigest()[:12]
    return f"mg_{name}_{digest}"


def spec_kernel(name: str):
    """The mx.fast kernel object of a variant from SPECS or CUDA_ONLY_SPECS on this backend (cached)."""
    be = _backend()
    key = (name, be)
    k = _KERNELS.get(key)
    if k is None:
        spec = S.SPECS.get(name) or S.CUDA_ONLY_SPECS[name]
        if be not in ("cuda", "metal") or (be == "metal" and name in S.CUDA_ONLY_SPECS):
            raise RuntimeError(f"{name} does not run on backend {be}")
        make = mx.fast.cuda_kernel if be == "cuda" else mx.fast.metal_kernel
        header, body = S.header(spec, be), S.body(spec, be)
        k = make(name=kernel_name(name, header, body), input_names=list(spec.inputs),
                 output_names=list(spec.outputs), source=body, header=header)
        _KERNELS[key] = k
    return k


def kernel(name: str):
    """The mx.fast kernel object of one variant of SPECS on this backend (cached)."""
    if name not in S.SPECS:
        raise KeyError(name)
    return spec_kernel(name)


def _guarded(key, fallback, launch):
    """`launch()`, a variant's outputs, under `key` = (variant, template key): on the key's first use
    evaluated eagerly, and if that fails `fallback()` (the reference) from then on, for good."""
    st = _STATUS.get(key)
    if st is False:
        return fallback()
    try:
        outs = launch()
        if st is None:
            mx.eval(outs)
            _STATUS[key] = True
        return outs
    except Exception as e:  # noqa: BLE001 - any build/run failure means: use the reference
        _STATUS[key] = False
        first = (str(e).splitlines() or [""])[0][:200]
        _say(f"{key[0]} {key[1]} unavailable on {_backend()} ({type(e).__name__}: {first}); using the reference")
        return fallback()


def _run(name, tkey, fallback, **kw):
    """Runs one launch of a variant under _guarded; the outputs as a list (the reference's too)."""

    def fb():
        r = fallback()
        return [r] if isinstance(r, mx.array) else r

    return _guarded((name, tkey), fb, lambda: kernel(name)(**kw))


def status():
    """{(variant, template key): True if it ran, False if it fell back}."""
    return dict(_STATUS)


_GPU_DTYPES = (mx.bfloat16, mx.float16, mx.float32)


@functools.lru_cache(maxsize=8192)
def _i32(*v):
    # small parameter arrays are cached: the shapes of a model's layers repeat every step. Not padded past 8 bytes
    # (docs/decode.md, "Small arrays in unified memory": the plain path measured no faster padded, H200 2026-11-27)
    return mx.array(list(v), dtype=mx.int32)


@functools.lru_cache(maxsize=1024)
def _f32(*v):
    return mx.array(list(v), dtype=mx.float32)


def _tg(n):
    return max(32, min(1024, (n + 31) // 32 * 32))


# ---------------------------------------------------------------------------------------------


def rms_norm(x, weight, eps):
    D = x.shape[-1]
    if x.dtype not in _GPU_DTYPES or weight.dtype not in _GPU_DTYPES or x.size == 0:
        return ref.rms_norm(x, weight, eps)
    rows = x.size // D
    tmpl = [("T", x.dtype), ("W", weight.dtype), ("D", D)]
    return _run("rms_norm", (x.dtype, weight.dtype, D), lambda: ref.rms_norm(x, weight, eps),
                inputs=[x, weight, _f32(eps)], template=tmpl, grid=(rows * _tg(D // 4), 1, 1),
                threadgroup=(_tg(D // 4), 1, 1), output_shapes=[x.shape], output_dtypes=[x.dtype])[0]


def add_rms_norm(x, residual, weight, eps):
    D = x.shape[-1]
    if x.dtype not in _GPU_DTYPES or weight.dtype not in _GPU_DTYPES or x.size == 0:
        return ref.add_rms_norm(x, residual, weight, eps)
    if residual.dtype != x.dtype or residual.shape != x.shape:
        residual = mx.broadcast_to(residual, x.shape).astype(x.dtype)
    rows = x.size // D
    tmpl = [("T", x.dtype), ("W", weight.dtype), ("D", D)]
    y, h = _run("add_rms_norm", (x.dtype, weight.dtype, D), lambda: ref.add_rms_norm(x, residual, weight, eps),
                inputs=[x, residual, weight, _f32(eps)], template=tmpl, grid=(rows * _tg(D // 4), 1, 1),
                threadgroup=(_tg(D // 4), 1, 1), output_shapes=[x.shape, x.shape],
                output_dtypes=[x.dtype, x.dtype])
    return y, h


def rope(x, table, offset):
    B, H, L, D = x.shape
    if offset + L > table.max_positions:
        raise ValueError(f"rope: positions up to {offset + L} exceed the table ({table.max_positions})")
    if x.dtype not in _GPU_DTYPES or D != table.dims:
        return ref.rope(x, table, offset)
    half = D // 2
    total = B * H * L * half
    tmpl = [("T", x.dtype), ("HALF", half)]
    return _run("rope", (x.dtype, half), lambda: ref.rope(x, table, offset),
                inputs=[x, table.cos, table.sin, _i32(L, H, total, offset)], template=tmpl,
                grid=(total, 1, 1), threadgroup=(256, 1, 1), output_shapes=[x.shape],
                output_dtypes=[x.dtype])[0]


def mrope(x, table, position_ids, mrope_section, interleaved):
    B, H, L, D = x.shape
    half = D // 2
    sec = tuple(int(s) for s in mrope_section)
    if x.dtype not in _GPU_DTYPES or D != table.dims or len(sec) != 3 or sum(sec) != half:
        return ref.mrope(x, table, position_ids, sec, interleaved)
    total = B * H * L * half
    tmpl = [("T", x.dtype), ("HALF", half), ("S0", sec[0]), ("S1", sec[1]), ("S2", sec[2]),
            ("INTERLEAVED", bool(interleaved))]
    pid = position_ids.astype(mx.int32)
    return _run("mrope", (x.dtype, half, sec, bool(interleaved)),
                lambda: ref.mrope(x, table, position_ids, sec, interleaved),
                inputs=[x, table.cos, table.sin, _i32(L, H, total, 0), pid], template=tmpl,
                grid=(total, 1, 1), threadgroup=(256, 1, 1), output_shapes=[x.shape],
                output_dtypes=[x.dtype])[0]


def attention_splits(n_groups: int, length: int) -> int:
    """How many chunks decode attention splits the context into (1 = no split)."""
    want = -(-ATTN_TARGET_GROUPS // max(1, n_groups))
    return max(1, min(want, -(-length // ATTN_MIN_CHUNK)))


def kv_store(kc, vc, k, v, layer, start, dep=None):
    """The kv_store kernel: k, v (1, Hkv, n, D) written into layer `layer` of kc, vc (L, Hkv, C, D) at
    positions start .. start + n - 1, in place. Returns (kc, vc, sync, keys, values): the same cache arrays
    (written), the write's ordering output for the next launch on the cache, and the layer's keys and
    values up to the new end, (1, Hkv, start + n, D), as fresh arrays (MLX sees no edge from an in-place
    write to a later read of the cache: readers take these)."""
    _, Hkv, n, D = k.shape
    if kc.dtype not in _GPU_DTYPES or k.dtype != kc.dtype or v.dtype != kc.dtype or n == 0:
        return ref.kv_store(kc, vc, k, v, layer, start, dep)
    dep = mx.zeros((1,), mx.uint32) if dep is None else dep
    end = start + n
    total = Hkv * end * D
    sync, ko, vo = kernel("kv_store")(
        inputs=[kc, vc, k, v, _i32(layer, start, n, kc.shape[2], Hkv, D), dep], template=[("T", kc.dtype)],
        grid=(-(-total // 256) * 256, 1, 1), threadgroup=(256, 1, 1),
        output_shapes=[(1,), (1, Hkv, end, D), (1, Hkv, end, D)], output_dtypes=[mx.uint32, kc.dtype, kc.dtype])
    return kc, vc, sync, ko, vo


def _attention_fits(q, k, v, length) -> bool:
    """Whether the decode attention body takes these: one query a row, head dim a multiple of 32 up to 256,
    at most 16 query heads a KV head (k, v: the KV heads on axis 1), one GPU dtype, something to attend."""
    Hq, D, Hkv = q.shape[1], q.shape[3], k.shape[1]
    return (q.dtype in _GPU_DTYPES and k.dtype == q.dtype and v.dtype == q.dtype and D % 32 == 0 and D <= 256
            and Hq % Hkv == 0 and Hq // Hkv <= 16 and length >= 1 and q.shape[2] == 1)


def _chunks(n_groups: int, length: int, nsplit=None):
    """(splits, positions a split) for `length` positions: attention_splits unless given, then as many as the
    chunks need."""
    if nsplit is None:
        nsplit = attention_splits(n_groups, length)
    chunk = -(-length // nsplit)
    return -(-length // chunk), chunk


def decode_attention(q, k, v, length, scale, nsplit=None):
    B, Hq, _, D = q.shape
    Hkv, S_cap = k.shape[1], k.shape[2]
    G = Hq // Hkv

    def fb():
        return ref.decode_attention(q, k, v, length, scale)

    if not _attention_fits(q, k, v, length):
        return fb()
    n = B * Hkv
    nsplit, chunk = _chunks(n, length, nsplit)
    tg = 32 * ATTN_WARPS
    tmpl = [("T", q.dtype), ("D", D), ("G", G), ("NW", ATTN_WARPS)]
    params = _i32(length, S_cap, chunk, nsplit)
    sc = _f32(scale)
    if nsplit == 1:
        return _run("decode_attention", (q.dtype, D, G), fb, inputs=[q, k, v, params, sc], template=tmpl,
                    grid=(n * tg, 1, 1), threadgroup=(tg, 1, 1), output_shapes=[q.shape],
                    output_dtypes=[q.dtype])[0]
    return _split_attention("decode_attention_split", (q.dtype, D, G), fb, q, [q, k, v, params, sc], tmpl, n, nsplit)


def _split_attention(name, tkey, fb, q, inputs, tmpl, n, nsplit):
    """A decode attention variant split over the context (`name`, nsplit chunks for each of the n (row, KV
    head) groups), then attention_combine; on its first use evaluated eagerly, falling back to `fb()` for good
    if that fails (as _run)."""
    B, Hq, _, D = q.shape
    G = Hq // (n // B)

    def launch():
        po, pml = kernel(name)(
            inputs=inputs, template=tmpl, grid=(n * 32 * ATTN_WARPS, nsplit, 1), threadgroup=(32 * ATTN_WARPS, 1, 1),
            output_shapes=[(n, nsplit, G, D), (n, nsplit, G, 2)], output_dtypes=[mx.float32, mx.float32])
        return kernel("attention_combine")(
            inputs=[po, pml, _i32(nsplit)], template=[("T", q.dtype), ("D", D), ("G", G)],
            grid=(B * Hq * _tg(D), 1, 1), threadgroup=(_tg(D), 1, 1), output_shapes=[q.shape],
            output_dtypes=[q.dtype])[0]

    return _guarded((name, tkey), fb, launch)


def paged_decode_attention(q, k, v, table, lengths, max_length, block_size, scale, nsplit=None):
    """decode_attention's body over a paged pool (MG_PAGED): each row its own length and block table."""
    B, Hq, _, D = q.shape
    Hkv = k.shape[1]
    G = Hq // Hkv

    def fb():
        return ref.paged_decode_attention(q, k, v, table, lengths, max_length, block_size, scale)

    if not _attention_fits(q, k, v, max_length) or table.dtype != mx.int32 or lengths.dtype != mx.int32:
        return fb()
    n = B * Hkv
    nsplit, chunk = _chunks(n, max_length, nsplit)
    tg = 32 * ATTN_WARPS
    tmpl = [("T", q.dtype), ("D", D), ("G", G), ("NW", ATTN_WARPS), ("BS", block_size)]
    params = _i32(0, 0, chunk, nsplit, table.shape[1], Hkv)
    inputs = [q, k, v, table, lengths, params, _f32(scale)]
    if nsplit == 1:
        return _run("paged_decode_attention", (q.dtype, D, G, block_size), fb, inputs=inputs, template=tmpl,
                    grid=(n * tg, 1, 1), threadgroup=(tg, 1, 1), output_shapes=[q.shape],
                    output_dtypes=[q.dtype])[0]
    return _split_attention("paged_decode_attention_split", (q.dtype, D, G, block_size), fb, q, inputs, tmpl, n,
                            nsplit)


def qk_rope_store(q, k, v, q_weight, k_weight, eps, table, positions, slots, k_pool, v_pool):
    """The qk_rope_store kernel: one launch for every row's query and key heads (normed, turned) and its k, v
    written into the pools in place; the pools come back through mx.depends on the write, so that every
    later reader is ordered after it."""
    Hkv, D = k_pool.shape[1], k_pool.shape[2]
    B = positions.shape[0]
    fused = k is None  # q is the (B, (Hq + 2 Hkv) D) projection of all three
    Hq = q.size // (B * D) - (2 * Hkv if fused else 0)

    def fb():
        return ref.qk_rope_store(q, k, v, q_weight, k_weight, eps, table, positions, slots, k_pool, v_pool)

    dt = k_pool.dtype
    if (dt not in _GPU_DTYPES or q.dtype != dt or (not fused and (k.dtype != dt or v.dtype != dt))
            or v_pool.dtype != dt or D % 64 or D != table.dims or positions.dtype != mx.int32
            or slots.dtype != mx.int32):
        return fb()
    qkn = q_weight is not None
    qw = q_weight if qkn else mx.zeros((D,), dt)
    kw = k_weight if qkn else qw
    warps = B * (Hq + 2 * Hkv)
    QD, KD = Hq * D, Hkv * D
    if fused:  # row strides and each part's offset in the one projection
        k = v = q
        strides = _i32(B, Hq, Hkv, QD + 2 * KD, QD + 2 * KD, QD + 2 * KD, 0, QD, QD + KD)
    else:
        strides = _i32(B, Hq, Hkv, QD, KD, KD, 0, 0, 0)
    inputs = [q, k, v, qw, kw, table.cos, table.sin, positions, slots, k_pool, v_pool, strides, _f32(eps)]

    def launch():
        qo, sync = kernel("qk_rope_store")(
            inputs=inputs, template=[("T", dt), ("HALF", D // 2), ("QKN", qkn)], grid=(-(-warps // 4) * 128, 1, 1),
            threadgroup=(128, 1, 1), output_shapes=[(B, Hq, 1, D), (1,)], output_dtypes=[dt, mx.uint32])
        kp, vp = mx.depends([k_pool, v_pool], [sync])
        return qo, kp, vp

    return _guarded(("qk_rope_store", (dt, D, qkn)), fb, launch)


def _rows(x):
    return x.size // x.shape[-1] if x.ndim else 1


def linear(x, weight, bias=None):
    K = x.shape[-1]
    N = weight.shape[0]
    M = _rows(x)
    if (not use_gemv(False, M, K, N) or x.dtype not in (mx.bfloat16, mx.float16) or weight.dtype != x.dtype or K % 8
            or (bias is not None and bias.dtype != x.dtype)):
        y = x @ weight.T
        return y + bias if bias is not None else y
    return gemv(x, weight, bias)


def gemv(x, weight, bias=None, rows=None):
    """x @ W.T (+ bias) for a dense W through the GEMV kernel, `rows` (default DENSE_GEMV_ROWS) rows of W a
    lane-group."""
    K = x.shape[-1]
    N = weight.shape[0]
    M = _rows(x)
    NW = 4
    R = rows or DENSE_GEMV_ROWS
    name = "gemv_bias" if bias is not None else "gemv"
    inputs = [x, weight] + ([bias] if bias is not None else []) + [_i32(K, N)]
    return _run(name, (x.dtype, M, R), lambda: ref.linear(x, weight, bias), inputs=inputs,
                template=[("T", x.dtype), ("M", M), ("NW", NW), ("R", R)], grid=(-(-N // (NW * R)) * 32 * NW, 1, 1),
                threadgroup=(32 * NW, 1, 1), output_shapes=[x.shape[:-1] + (N,)], output_dtypes=[x.dtype])[0]


def quantized_linear(x, w, scales, biases, group_size, bits, bias=None):
    K = x.shape[-1]
    N = w.shape[0]
    M = _rows(x)
    vpl = 32 if bits == 4 else 16
    if (not use_gemv(True, M, K, N) or bits not in (4, 8) or x.dtype not in (mx.bfloat16, mx.float16) or K % vpl
            or group_size % vpl or w.dtype != mx.uint32 or (bias is not None and bias.dtype != x.dtype)):
        # (..., K) -> (M, K): as (B, 1, K) (a batched decode step) MLX's CUDA backend runs B products of
        # one row, each reading every weight (docs/kernels.md, Matmul dispatch); as (B, K), one of B rows
        y = mx.quantized_matmul(x.reshape(M, K), w, scales, biases, transpose=True, group_size=group_size,
                                bits=bits).reshape(x.shape[:-1] + (N,))
        return y + bias if bias is not None else y
    return gemv_quantized(x, w, scales, biases, group_size, bits, bias)


def gemv_quantized(x, w, scales, biases, group_size, bits, bias=None, rows=None):
    """x @ W.T for MLX-quantized W through the GEMV kernel, `rows` (default QGEMV_ROWS) rows of W a lane-group."""
    K = x.shape[-1]
    N = w.shape[0]
    M = _rows(x)
    NW = 4
    R = rows or QGEMV_ROWS
    name = f"gemv_q{bits}" + ("_bias" if bias is not None else "")
    inputs = [x, w, scales, biases] + ([bias] if bias is not None else []) + [_i32(K, N)]
    return _run(name, (x.dtype, scales.dtype, M, group_size, R),
                lambda: ref.quantized_linear(x, w, scales, biases, group_size, bits, bias), inputs=inputs,
                template=[("T", x.dtype), ("M", M), ("NW", NW), ("R", R), ("S", scales.dtype), ("GS", group_size)],
                grid=(-(-N // (NW * R)) * 32 * NW, 1, 1), threadgroup=(32 * NW, 1, 1),
                output_shapes=[x.shape[:-1] + (N,)], output_dtypes=[x.dtype])[0]


@functools.lru_cache(maxsize=1)
def multiprocessors() -> Optional[int]:
    """The GPU's multiprocessor count, if MLX says it (asked once: the query costs tens of us)."""
    try:
        info = mx.device_info()
    except Exception:  # noqa: BLE001
        return None
    for key in ("num_sms", "multi_processor_count", "multiprocessor_count", "sm_count"):
        if key in info:
            return int(info[key])
    name = str(info.get("device_name", ""))
    if "H100" in name or "H200" in name or "H20" in name:
        return 132
    return None


# The sampler (bodies/sample.body): groups of 256 threads, a row split over up to 256 of them, each with
# at least SAMPLE_MIN_SLICE entries of the vocabulary. More than one group a row needs them co-resident
# (grid barriers: CUDA only), so a launch keeps rows * groups within SAMPLE_GROUPS_PER_SM a multiprocessor.
# H200, V = 151936, one row (benchmarks/sample_probe.py, 2026-11-25): 1 a multiprocessor and slices of
# >= 1024 (132 groups) 53.7 us a greedy call, 81.4 top-p with the penalty; 2 and 512 (256 groups) 37.9
# and 67.8; 4 and 512 (256 groups too) 37.0 and 57.9, within the calls' noise of 2 and 512.
SAMPLE_THREADS = 256
SAMPLE_MAX_GROUPS = 256
SAMPLE_MIN_SLICE = 512
SAMPLE_GROUPS_PER_SM = 2
SAMPLE_SCRATCH_WORDS = 4112 + 4 * SAMPLE_MAX_GROUPS + 4096  # sync words, histograms, the groups' table; the bins' keys last


def sample_groups(B: int, V: int) -> int:
    """Groups per row of a B x V sampler launch on this backend."""
    if _backend() != "cuda":
        return 1
    sms = multiprocessors() or 16
    return max(1, min(SAMPLE_MAX_GROUPS, (sms * SAMPLE_GROUPS_PER_SM) // B, -(-V // SAMPLE_MIN_SLICE)))


def make_sample_scratch(B: int, V: int):
    """The device memory a B x V sampler launch writes in place: (work (B, V) float32, scr (B, words)
    uint32), zeroed and evaluated. A sampler keeps one per shape: its sync words carry over launches. One
    made for more rows serves launches of fewer (they use its first rows)."""
    work = mx.zeros((B, V), mx.float32)
    scr = mx.zeros((B, SAMPLE_SCRATCH_WORDS), mx.uint32)
    mx.eval(work, scr)
    return work, scr


def _row_settings(temperature, top_k, top_p, min_p, penalty, window) -> tuple:
    # one row of the kernel's rparams: [temperature, top_p, log(min_p), use_min_p, penalty, top_k, window]
    use_minp = min_p > 0.0
    # a top-k past any vocabulary keeps every token, as 0 does; capped so that a client's 10**400 stays a float
    return (float(temperature), max(float(top_p), 1e-30), math.log(min_p) if use_minp else 0.0,
            1.0 if use_minp else 0.0, float(penalty), float(min(top_k, 1 << 30)), float(window))


@functools.lru_cache(maxsize=1024)
def _rparams(rows: tuple) -> mx.array:
    # cached: a decode loop's settings repeat every token
    return mx.array(rows, dtype=mx.float32)  # (B, 7)


def _recent_rows(recent, B: int, penalized: bool):
    if recent is None or not penalized or not recent.size:
        return _i32(-1), 0
    recent = recent.reshape(B, -1)  # (T,) for one row, or (B, T)
    return (recent if recent.dtype == mx.int32 else recent.astype(mx.int32)), recent.shape[1]


def _sample_launch(logits, rows: tuple, state, recent, H: int, per_row: bool, scratch, fb, ring: bool = False):
    B, V = logits.shape
    if logits.dtype not in _GPU_DTYPES:
        return fb()
    if scratch is None or scratch[0].shape[0] < B or scratch[0].shape[1] != V:
        scratch = make_sample_scratch(B, V)  # (a larger one serves too: a launch uses its first B rows)
    nb = sample_groups(B, V)
    # the state's words a row (per_row 0: those past [seed, counter] are carried through, reference.SAMPLE_STATE_WORDS)
    # ring: the penalty reads the state's ring of recent tokens (reference.with_recent), not `recent`
    ip = _i32(V, nb, H, SAMPLE_SCRATCH_WORDS, int(per_row), int(state.shape[-1]), int(ring))
    state = state if state.dtype == mx.uint32 else state.astype(mx.uint32)
    tok, lp, ns = _run("sample", (logits.dtype,), fb,
                       inputs=[logits, _rparams(rows), ip, state, recent, scratch[0], scratch[1]],
                       template=[("T", logits.dtype)], grid=(nb * SAMPLE_THREADS, B, 1),
                       threadgroup=(SAMPLE_THREADS, 1, 1), output_shapes=[(B,), (B,), state.shape],
                       output_dtypes=[mx.int32, mx.float32, mx.uint32])
    return tok, lp, ns


def sample(logits, temperature, top_k, top_p, min_p, state, recent=None, penalty=1.0, scratch=None):
    if logits.ndim == 1:
        logits = logits[None]
    B = logits.shape[0]
    fb = lambda: ref.sample(logits, temperature, top_k, top_p, min_p, state, recent, penalty)  # noqa: E731
    W = ref.ring_penalizes(state, recent, B)
    if W:
        rows = (_row_settings(temperature, top_k, top_p, min_p, penalty, W),)
        return _sample_launch(logits, rows, state, _i32(-1), W, False, scratch, fb, ring=True)
    rec, H = _recent_rows(recent, B, penalty != 1.0)
    rows = (_row_settings(temperature, top_k, top_p, min_p, penalty, H),) * B
    return _sample_launch(logits, rows, state, rec, H, False, scratch, fb)


def sample_rows(logits, settings, states, recent=None, scratch=None):
    B = logits.shape[0]
    rec, H = _recent_rows(recent, B, any(s[4] != 1.0 and s[5] > 0 for s in settings))
    rows = tuple(_row_settings(*s) for s in settings)
    return _sample_launch(logits, rows, states, rec, H, True, scratch,
                          lambda: ref.sample_rows(logits, settings, states, recent))


# ---------------------------------------------------------------------------------------------
# Mixture of experts (docs/kernels.md)

# Routings of at most this many tokens run the gathered expert GEMV kernels (moe_gate_up, moe_down),
# which read only the chosen experts' rows once per (token, expert); longer ones a grouped GEMM over
# the assignments grouped by expert into blocks of one expert's rows (moe_pack).
MOE_GEMV_MAX_TOKENS = 4
# the built-in formulation's block (moe_grouped: one mx.gather_mm / gather_qmm per projection)
MOE_BLOCK = 64
# 16-bit experts take the grouped GEMM kernels (moe_gemm: blocks of MOE_GEMM_BLOCK rows, MOE_GEMM_BN_*
# columns of each weight a group), quantized ones too (dequantized as staged).
MOE_GEMM_BLOCK = 64
MOE_GEMM_BN_GATE_UP = 128
MOE_GEMM_BN_DOWN = 128
# "gemm" (above), "blocks" (the built-in gather_mm for every dtype) or "sorted": mlx-lm's formulation
# (one row per assignment, sorted by expert, the built-in's grouped path), kept for the comparisons
MOE_GROUPED = "gemm"
MOE_WARPS = 4


def moe_route(logits, top_k, norm_topk_prob):
    T, E = logits.shape

    def fb():
        return ref.moe_route(logits, top_k, norm_topk_prob)

    if logits.dtype not in _GPU_DTYPES or E > 1024 or top_k > 16 or T == 0:
        return fb()
    nt = _tg(min(E, 256))
    return tuple(_run("moe_route", (logits.dtype,), fb, inputs=[logits, _i32(E, top_k, int(bool(norm_topk_prob)))],
                      template=[("T", logits.dtype)], grid=(T * nt, 1, 1), threadgroup=(nt, 1, 1),
                      output_shapes=[(T, top_k), (T, top_k)], output_dtypes=[logits.dtype, mx.int32]))


def _experts_inputs(ex):
    return [ex.weight] if not ex.bits else [ex.weight, ex.scales, ex.biases]


def _gemv_ok(x, gate, up, down):
    """Whether the gathered expert GEMV kernels take these shapes and dtypes."""
    if x.dtype not in (mx.bfloat16, mx.float16):
        return False
    exs = (gate, up, down)
    if len({(e.bits, e.group_size) for e in exs}) != 1:
        return False
    bits = gate.bits
    vpc = {0: 8, 4: 32, 8: 16}.get(bits)
    if vpc is None or gate.in_dims % vpc or down.in_dims % vpc:
        return False
    if bits:
        return all(e.group_size % vpc == 0 and e.scales.dtype == e.biases.dtype for e in exs)
    return all(e.weight.dtype == x.dtype for e in exs)


def moe_gemv(x, inds, scores, gate, up, down):
    """The routed experts by the gathered GEMV kernels (checked shapes: `_gemv_ok`)."""
    T, H = x.shape
    k = inds.shape[1]
    I = gate.out_dims
    bits = gate.bits
    sfx = f"_q{bits}" if bits else ""
    tmpl = [("T", x.dtype), ("NW", MOE_WARPS)]
    if bits:
        tmpl += [("S", gate.scales.dtype), ("GS", gate.group_size)]
    tkey = (x.dtype, bits, gate.group_size, gate.scales.dtype if bits else None)
    params = _i32(H, I, k, T)
    tg = 32 * MOE_WARPS
    act = _run("moe_gate_up" + sfx, tkey, lambda: ref.moe_act(x, inds, gate, up),
               inputs=[x, inds] + _experts_inputs(gate) + _experts_inputs(up) + [params], template=tmpl,
               grid=(-(-T * k * I // MOE_WARPS) * tg, 1, 1), threadgroup=(tg, 1, 1), output_shapes=[(T, k, I)],
               output_dtypes=[x.dtype])[0]
    return _run("moe_down" + sfx, tkey, lambda: ref.moe_combine(act, inds, scores, down),
                inputs=[act, inds, scores.astype(x.dtype)] + _experts_inputs(down) + [params], template=tmpl,
                grid=(-(-T * H // MOE_WARPS) * tg, 1, 1), threadgroup=(tg, 1, 1), output_shapes=[(T, H)],
                output_dtypes=[x.dtype])[0]


def moe_pack(inds, num_experts, block):
    A = inds.shape[0]
    nblk = -(-A // block) + num_experts

    def fb():
        return ref.moe_pack(inds, num_experts, block)

    if num_experts > 1024 or A == 0:
        return fb()
    return tuple(_run("moe_pack", (block,), fb, inputs=[inds.astype(mx.int32), _i32(A, num_experts, nblk)],
                      template=[("B", block)], grid=(1024, 1, 1), threadgroup=(1024, 1, 1),
                      output_shapes=[(nblk * block,), (A,), (nblk,)], output_dtypes=[mx.int32] * 3))


def _grouped_product(xb, ex, bexp):
    """xb (nblk, B, in) @ expert_{bexp[b]}.T for every block b -> (nblk, B, out)."""
    if ex.bits:
        return mx.gather_qmm(xb, ex.weight, ex.scales, ex.biases, rhs_indices=bexp, transpose=True,
                             group_size=ex.group_size, bits=ex.bits)
    return mx.gather_mm(xb, ex.weight.swapaxes(-1, -2), rhs_indices=bexp)


def moe_unpack(y, dst, scores, dtype):
    """Block-ordered expert outputs y (rows, H) -> each assignment's row (dst), weighted by its score
    and summed over the k slots in float32, rounded once -> (T, H) (moe_unpack: no (T, k, H) array)."""
    T, k = scores.shape
    H = y.shape[-1]

    def fb():
        yt = y[dst].reshape(T, k, H)
        return (scores.astype(mx.float32)[..., None] * yt.astype(mx.float32)).sum(axis=1).astype(dtype)

    if y.dtype not in (mx.bfloat16, mx.float16) or H % 8 or T == 0:
        return fb()
    return _run("moe_unpack", (y.dtype,), fb, inputs=[y, dst, scores.astype(y.dtype), _i32(H, k, T)],
                template=[("T", y.dtype)], grid=(-(-T * (H // 8) // 256) * 256, 1, 1), threadgroup=(256, 1, 1),
                output_shapes=[(T, H)], output_dtypes=[y.dtype])[0].astype(dtype)


def moe_grouped(x, inds, scores, gate, up, down, block=None):
    """The routed experts as grouped GEMMs over blocks of one expert's assignments (moe_pack) by the
    built-in mx.gather_mm / gather_qmm: gate and up, SwiGLU, down, then the weighted sum."""
    T, H = x.shape
    k = inds.shape[1]
    E = gate.weight.shape[0]
    B = block or MOE_BLOCK
    src, dst, bexp = moe_pack(inds.reshape(-1), E, B)
    nblk = bexp.shape[0]
    a = _blocks_act(x, src, bexp, k, B, gate, up)
    return moe_unpack(_grouped_product(a, down, bexp).reshape(nblk * B, H), dst, scores, x.dtype)


def _blocks_act(x, src, bexp, k, B, gate, up):
    """SwiGLU of gate and up over moe_pack's blocks by the built-in: (nblk, B, I)."""
    from .cpu import nn_silu

    # (nblk * B,) rows -> their tokens (padding rows take token 0; their products are never read)
    xb = x[mx.maximum(src, 0) // k].reshape(bexp.shape[0], B, x.shape[-1])
    return nn_silu(_grouped_product(xb, gate, bexp)) * _grouped_product(xb, up, bexp)


def _gemm_ok(x, gate, up, down):
    """Whether the grouped GEMM kernels (moe_gemm) take these shapes and dtypes: activations in 16
    bits, weights of the same dtype or MLX-quantized alike (4 / 8 bits, groups of 32 to 128 that
    split both sizes), both sizes a multiple of the column tiles and of the K slice (32)."""
    exs = (gate, up, down)
    if x.dtype not in (mx.bfloat16, mx.float16) or len({(e.bits, e.group_size) for e in exs}) != 1:
        return False
    H, I = gate.in_dims, gate.out_dims
    if gate.bits:
        if gate.bits not in (4, 8) or gate.group_size not in (32, 64, 128) or H % gate.group_size or \
                I % gate.group_size or any(e.scales.dtype != e.biases.dtype for e in exs):
            return False
    elif any(e.weight.dtype != x.dtype for e in exs):
        return False
    # gate/up: N = I, K = H; down: N = H, K = I
    return I % MOE_GEMM_BN_GATE_UP == 0 and H % MOE_GEMM_BN_DOWN == 0 and H % 32 == 0 and I % 32 == 0


def moe_gemm(x, inds, scores, gate, up, down):
    """The routed experts by the grouped GEMM kernels on the matrix units (checked shapes: `_gemm_ok`):
    assignments grouped into blocks of MOE_GEMM_BLOCK rows of one expert (moe_pack), gate/up with
    SwiGLU in one kernel reading the token rows in place, down in another, then moe_unpack's weighted
    sum. Quantized experts are dequantized as they are staged."""
    T, H = x.shape
    k = inds.shape[1]
    E = gate.weight.shape[0]
    I = gate.out_dims
    B, BGU, BD = MOE_GEMM_BLOCK, MOE_GEMM_BN_GATE_UP, MOE_GEMM_BN_DOWN
    src, dst, bexp = moe_pack(inds.reshape(-1), E, B)
    nblk = bexp.shape[0]
    bits = gate.bits
    sfx = f"_q{bits}" if bits else ""
    qt = [("S", gate.scales.dtype), ("GS", gate.group_size)] if bits else []
    qkey = (bits, gate.group_size, gate.scales.dtype) if bits else ()

    nth = 32 * (B // 32) * (BGU // 32)
    act = _run("moe_gemm_gate_up" + sfx, (x.dtype, B, BGU) + qkey,
               lambda: _blocks_act(x, src, bexp, k, B, gate, up).reshape(nblk * B, I),
               inputs=[x, src, bexp] + _experts_inputs(gate) + _experts_inputs(up) + [_i32(H, I, k, nblk)],
               template=[("T", x.dtype), ("B", B), ("BN", BGU)] + qt, grid=(nblk * nth, I // BGU, 1),
               threadgroup=(nth, 1, 1), output_shapes=[(nblk * B, I)], output_dtypes=[x.dtype])[0]
    nth = 32 * (B // 32) * (BD // 32)
    y = _run("moe_gemm_down" + sfx, (x.dtype, B, BD) + qkey,
             lambda: _grouped_product(act.reshape(nblk, B, I), down, bexp).reshape(nblk * B, H),
             inputs=[act, src, bexp] + _experts_inputs(down) + [_i32(I, H, k, nblk)],
             template=[("T", x.dtype), ("B", B), ("BN", BD)] + qt, grid=(nblk * nth, H // BD, 1),
             threadgroup=(nth, 1, 1), output_shapes=[(nblk * B, H)], output_dtypes=[x.dtype])[0]
    return moe_unpack(y, dst, scores, x.dtype)


def experts_path(x, gate, up, down) -> str:
    """Which formulation moe_experts takes for x (T, H): "gemv", "sorted", "gemm" or "blocks"."""
    if x.shape[0] <= MOE_GEMV_MAX_TOKENS and _gemv_ok(x, gate, up, down):
        return "gemv"
    if MOE_GROUPED == "sorted":
        return "sorted"
    if MOE_GROUPED == "gemm" and _gemm_ok(x, gate, up, down):
        return "gemm"
    return "blocks"


def moe_experts(x, inds, scores, gate, up, down):
    path = experts_path(x, gate, up, down)
    if path == "gemv":
        return moe_gemv(x, inds, scores, gate, up, down)
    if path == "sorted":
        from . import cpu

        return cpu.moe_experts(x, inds, scores, gate, up, down)
    if path == "gemm":
        return moe_gemm(x, inds, scores, gate, up, down)
    return moe_grouped(x, inds, scores, gate, up, down)


# ---------------------------------------------------------------------------------------------
# Gated DeltaNet (docs/kernels.md)

# head dims the decode kernel takes: a group holds R = DK / NW state rows a thread in registers
GATED_DELTA_MAX_DIM = 256


def gated_delta_warps(Dk: int) -> int:
    """Lane-groups a group of gated_delta_step: 16 state rows a thread up to DK = 128 (8 groups of 32
    lanes at 128), 32 at DK = 256 (55 and 78 registers a thread, no spills, sm_90)."""
    return max(1, min(8, Dk // 16))


def gated_delta(q, k, v, g, beta, state=None):
    B, L, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    if L != 1:
        # a prompt: the chunked form, its chunks' terms as batched MLX matmuls, the scan over chunks one kernel
        return ref.gated_delta_chunked(q, k, v, g, beta, state, scan=gated_delta_scan)
    if state is None:
        state = mx.zeros((B, Hv, Dk, Dv), mx.float32)

    def fb():
        return ref.gated_delta_recurrent(q, k, v, g, beta, state)

    if (v.dtype not in _GPU_DTYPES or q.dtype != v.dtype or k.dtype != v.dtype or Dk > GATED_DELTA_MAX_DIM
            or Dv > GATED_DELTA_MAX_DIM or Dv % 32 or Hv % Hk or state.dtype != mx.float32
            or tuple(state.shape) != (B, Hv, Dk, Dv) or B == 0):
        return fb()
    nw = gated_delta_warps(Dk)
    groups = B * Hv * (Dv // 32)
    out, new_state = _run("gated_delta_step", (v.dtype, Dk, Dv), fb,
                          inputs=[q, k, v, g.astype(mx.float32), beta.astype(mx.float32), state, _i32(Hk, Hv)],
                          template=[("T", v.dtype), ("DK", Dk), ("DV", Dv), ("NW", nw)],
                          grid=(groups * 32 * nw, 1, 1), threadgroup=(32 * nw, 1, 1),
                          output_shapes=[(B, 1, Hv, Dv), (B, Hv, Dk, Dv)], output_dtypes=[v.dtype, mx.float32])
    return out, new_state


# key heads the scan kernel takes: its group keeps DK x 32 floats of the state in shared memory
GATED_DELTA_SCAN_MAX_DK = 128


def gated_delta_scan(U, W, qd, kd, mix, G_last, S):
    """reference.gated_delta_chunk_scan on the GPU: one launch for the whole scan over chunks, one group
    per (sequence, value head, 32 state columns)."""
    B, H, n, C, Dv = U.shape
    Dk = W.shape[-1]

    def fb():
        return ref.gated_delta_chunk_scan(U, W, qd, kd, mix, G_last, S)

    if Dk > GATED_DELTA_SCAN_MAX_DK or Dv % 32 or n == 0 or B * H == 0:
        return fb()
    f = [t.astype(mx.float32) for t in (U, W, qd, kd, mix, G_last, S)]
    out, s_out = _run("gated_delta_scan", (Dk, Dv, C), fb, inputs=f + [_i32(n)],
                      template=[("DK", Dk), ("DV", Dv), ("C", C)], grid=(B * H * (Dv // 32) * 256, 1, 1),
                      threadgroup=(256, 1, 1), output_shapes=[(B, H, n * C, Dv), (B, H, Dk, Dv)],
                      output_dtypes=[mx.float32, mx.float32])
    return out, s_out


def gated_delta_conv_step(mixed, conv_state, conv_weight, a, b, A_log, dt_bias, state):
    B, L, C = mixed.shape
    Hv, Dk, Dv = state.shape[1:]
    Hk = (C - Hv * Dv) // (2 * Dk)
    taps = conv_state.shape[1]

    def fb():  # in the kernel's output order: out, state, conv state
        out, conv, new_state = ref.gated_delta_conv_step(mixed, conv_state, conv_weight, a, b, A_log, dt_bias, state)
        return out, new_state, conv

    T = mixed.dtype
    if (L != 1 or T not in _GPU_DTYPES or Hk < 1 or 2 * Hk * Dk + Hv * Dv != C or Hv % Hk or Dk > GATED_DELTA_MAX_DIM
            or Dv > GATED_DELTA_MAX_DIM or Dv % 32 or state.dtype != mx.float32 or B == 0 or taps < 1
            or tuple(conv_state.shape) != (B, taps, C) or tuple(conv_weight.shape) != (C, taps + 1, 1)):
        out, new_state, conv = fb()
        return out, conv, new_state
    nw = gated_delta_warps(Dk)
    # (the small per-head vectors in T: a cast is a dispatch of its own, paid only where they differ)
    same = [t if t.dtype == T else t.astype(T) for t in (conv_state, conv_weight, a, b, A_log, dt_bias)]
    cstate, cw, a_in, b_in, alog, dtb = same
    out, new_state, new_conv = _run(
        "gated_delta_conv_step", (T, Dk, Dv, taps), fb,
        inputs=[mixed, cstate, cw.reshape(C, taps + 1), a_in, b_in, alog, dtb, state, _i32(Hk, Hv)],
        template=[("T", T), ("DK", Dk), ("DV", Dv), ("NW", nw), ("KC", taps + 1)],
        grid=(B * Hv * (Dv // 32) * 32 * nw, 1, 1), threadgroup=(32 * nw, 1, 1),
        output_shapes=[(B, 1, Hv, Dv), (B, Hv, Dk, Dv), (B, taps, C)], output_dtypes=[T, mx.float32, T])
    return out, new_conv, new_state


# ---------------------------------------------------------------------------------------------
# Magpie TTS decoder step (docs/kernels.md, "Magpie decoder kernel")

MAGPIE_DEC_THREADS = 256
# CUDA: the whole step in one launch (grid barriers between its phases); False: one launch per phase,
# the form of backends without a grid barrier
MAGPIE_DEC_MEGAKERNEL = True
# groups a multiprocessor for the megakernel: all must be co-resident (its barrier waits for every one)
MAGPIE_DEC_BLOCKS_PER_SM = 2
MAGPIE_DEC_PHASES = 8  # a layer's phases (bodies/magpie_decoder.body)


def magpie_decoder_blocks() -> int:
    """The grid of the Magpie decoder kernel, in groups: MAGPIE_DEC_BLOCKS_PER_SM a multiprocessor on
    CUDA (the megakernel's groups must all be resident), 256 where one launch per phase runs."""
    if _backend() == "cuda":
        sms = multiprocessors()
        return MAGPIE_DEC_BLOCKS_PER_SM * sms if sms else 32
    return 256


def _magpie_layout(weights, rows: int, text_len: int):
    """(groups, most context splits, scratch floats) of a step (the body's scratch layout)."""
    d, H, XD, F = weights.d_model, weights.n_heads, weights.xa_dim, weights.ffn
    nb = magpie_decoder_blocks()
    maxns = max(1, nb // (rows * H))
    cntn = -(-rows * H // 32) * 32
    size = 32 + cntn + rows * (5 * d + 2 * XD + F) + text_len + rows * H * maxns * (d // H + 2)
    return nb, maxns, size


def make_magpie_decoder_scratch(weights, rows: int, text_len: int):
    """The Magpie decoder kernel's working memory (float32, zeroed once: it holds the grid barrier's word,
    which every launch leaves as it must find it). Calls sharing one must be ordered (each step's input
    made from the previous step's output, as the frame loop's are)."""
    s = mx.zeros((_magpie_layout(weights, rows, text_len)[2],), mx.float32)
    mx.eval(s)
    return s


def magpie_decoder_unsupported(x, kc, mem_k, weights) -> Optional[str]:
    """Why the kernel cannot take these shapes and dtypes (None: it can)."""
    w = weights
    T = w.dtype
    NL, R, H, C, dh = kc.shape
    d, XD, F = w.d_model, w.xa_dim, w.ffn
    if T not in _GPU_DTYPES:
        return f"dtype {T}"
    arrays = (w.pos_table, w.wqkv, w.wo, w.wxq, w.wxo, w.wf1, w.wf2, w.norms, w.fnorm, kc, mem_k)
    if any(a.dtype != T for a in arrays):
        return "the weights, caches and memory must share one dtype"
    if R not in (1, 2) or H != w.n_heads or d % H or dh % 32 or dh > 256 or XD % 32 or 256 % XD or F < d:
        return f"shapes (rows {R}, heads {H}, head dim {dh}, cross width {XD}, ffn {F})"
    if d % 8 or F % 8 or NL != w.layers:
        return "sizes must be multiples of 8 and the caches must have every layer"
    if mem_k.shape[2] + XD > max(R * F, 4096):
        return f"{mem_k.shape[2]} text positions are more than the kernel's shared memory holds"
    if _backend() == "metal" and (d + 0) * 4 * R > 32768:
        return "rows too wide for threadgroup memory"
    return None


def magpie_decoder_launch(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights, prior_layers=None,
                          est_layers=None, scratch=None, megakernel=None):
    """The kernel itself (no fallback: errors propagate, for checks); see magpie_decoder_step."""
    w = weights
    T = w.dtype
    NL, R, H, C, dh = kc.shape
    d, XD, F = w.d_model, w.xa_dim, w.ffn
    Lt = mem_k.shape[2]
    nb, maxns, size = _magpie_layout(w, R, Lt)
    if scratch is None:
        scratch = mx.zeros((size,), mx.float32)
    elif scratch.size < size:
        raise ValueError(f"magpie decoder scratch of {scratch.size} floats, {size} needed")
    posa = (pos if isinstance(pos, mx.array) else mx.array(int(pos))).astype(mx.int32).reshape(1)
    mmask = (mx.ones((R, Lt), mx.float32) if mem_mask is None
             else mem_mask if mem_mask.dtype == mx.float32 else mem_mask.astype(mx.float32))
    pflags = ref.magpie_layer_flags(prior_layers, NL) if prior is not None else (False,) * NL
    eflags = ref.magpie_layer_flags(est_layers, NL)
    use_prior = int(any(pflags))
    prior_in = (prior if prior.dtype == mx.float32 else prior.astype(mx.float32)) if use_prior else _f32(0.0)
    lmask = _i32(*[int(p) | 2 * int(e) for p, e in zip(pflags, eflags)])
    fparams = _f32(ref.MAGPIE_LN_EPS, dh ** -0.5, XD ** -0.5, ref.MAGPIE_TINY)
    steps = MAGPIE_DEC_PHASES * NL + 1
    tmpl = [("T", T), ("R", R), ("DM", d), ("NH", H), ("XD", XD), ("FF", F)]
    xin = x.reshape(R, d)
    inputs = [xin if xin.dtype == T else xin.astype(T), posa, w.pos_table, w.wqkv, w.wo, w.wxq, w.wxo, w.wf1,
              w.wf2, w.norms, w.fnorm, kc, vc, mem_k, mem_v, mmask, prior_in, lmask, scratch]
    shapes = dict(grid=(nb * MAGPIE_DEC_THREADS, 1, 1), threadgroup=(MAGPIE_DEC_THREADS, 1, 1),
                  output_shapes=[(R, d), (Lt,), (1,)], output_dtypes=[T, mx.float32, mx.uint32])
    dep = _magpie_no_dep()
    mega = (MAGPIE_DEC_MEGAKERNEL if megakernel is None else megakernel) and _backend() == "cuda"
    if mega:
        params = _i32(NL, Lt, C, w.pos_table.shape[0], nb, maxns, use_prior, sum(eflags), 0, steps)
        h, scores, _ = spec_kernel("magpie_decoder_megakernel")(
            inputs=inputs + [params, fparams, dep], template=tmpl, init_value=None, **shapes)
        return h, scores
    k = spec_kernel("magpie_decoder")
    for s in range(steps):
        params = _i32(NL, Lt, C, w.pos_table.shape[0], nb, maxns, use_prior, sum(eflags), s, s + 1)
        h, scores, dep = k(inputs=inputs + [params, fparams, dep], template=tmpl, init_value=None, **shapes)
    return h, scores


@functools.lru_cache(maxsize=1)
def _magpie_no_dep():
    return mx.zeros((1,), mx.uint32)


def magpie_decoder_step(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights, prior_layers=None, est_layers=None,
                        scratch=None):
    def fb():
        return ref.magpie_decoder_step(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights, prior_layers,
                                       est_layers)

    why = magpie_decoder_unsupported(x, kc, mem_k, weights)
    if why is not None:
        _say(f"magpie_decoder: {why}; using the reference")
        return fb()
    R = kc.shape[1]
    key = ("magpie_decoder", (weights.dtype, R, weights.d_model, weights.n_heads, weights.xa_dim, weights.ffn))
    return _guarded(key, fb, lambda: magpie_decoder_launch(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights,
                                                           prior_layers, est_layers, scratch))


# ---------------------------------------------------------------------------------------------
# Magpie's local-transformer draw chain (bodies/magpie_lt.body, docs/kernels.md)

MAGPIE_LT_THREADS = 256
# CUDA: the whole chain is one launch whose groups meet at grid barriers, so they must be co-resident
# (the tail prelude bounds the kernel to 2 groups of 256 a multiprocessor)
MAGPIE_LT_GROUPS_PER_SM = 2
MAGPIE_LT_GROUPS: Optional[int] = None  # benchmarks set it to sweep the grid; None: from the multiprocessors
MAGPIE_LT_METAL_GROUPS = 64  # one launch per step there: no co-residency needed
MAGPIE_LT_STRICT = False  # raise a build / run failure instead of falling back to the reference (checks)
MAGPIE_LT_SYNC_WORDS = 256


def magpie_lt_scratch_floats(D: int, F: int, V: int, NL: int, n: int) -> int:
    """Float32 words of the kernel's scratch: X, Q, A (2 D each), Fb (2 F), the logits (V, padded to 4),
    the K and V caches (NL, 2, n, D) each."""
    return 6 * D + 2 * F + -(-V // 4) * 4 + 2 * NL * 2 * n * D


def make_magpie_lt_scratch(w):
    """(scratch float32, sync words uint32) for `w` (reference.MagpieLTWeights), zeroed and evaluated."""
    n, V, D = w.out_w.shape
    sc = mx.zeros((magpie_lt_scratch_floats(D, w.ff1.shape[1], V, w.qkv.shape[0], n),), mx.float32)
    sw = mx.zeros((MAGPIE_LT_SYNC_WORDS,), mx.uint32)
    mx.eval(sc, sw)
    return sc, sw


def magpie_lt_groups() -> int:
    """Groups of 256 threads of the draw-chain launch on this backend."""
    if MAGPIE_LT_GROUPS:
        return int(MAGPIE_LT_GROUPS)
    if _backend() != "cuda":
        return MAGPIE_LT_METAL_GROUPS
    return (multiprocessors() or 16) * MAGPIE_LT_GROUPS_PER_SM


@functools.lru_cache(maxsize=8)
def _dummy(dtype):
    # the in-projection's place where the LT has none (never read: the kernel's HASIN is 0)
    return mx.zeros((8,), dtype)


def _magpie_lt_fits(w, d: int) -> bool:
    T = w.qkv.dtype
    NL, _, D = w.qkv.shape
    vals = 16 // T.size  # values a 16-byte chunk; a lane group reads 32 chunks a round
    rows_ok = all(K % (32 * vals) == 0 for K in (D, d, w.ff1.shape[1]))
    same = all(a.dtype == T for a in (w.pos, w.ln, w.wo, w.ff1, w.ff2, w.out_w, w.out_b, w.emb)
               + ((w.in_w, w.in_b) if w.in_w is not None else ()))
    return (T in _GPU_DTYPES and same and rows_ok and D % int(w.heads) == 0 and D // int(w.heads) <= 256
            and (w.in_w is not None or d == D) and w.out_w.shape[1] <= 8192)


def magpie_lt_draws(h, w, bad, cfg_scale, temperature, top_k, state, scratch=None):
    def fb():
        return ref.magpie_lt_draws(h, w, bad, cfg_scale, temperature, top_k, state)

    R, d = h.shape
    if R not in (1, 2) or not _magpie_lt_fits(w, d):
        if MAGPIE_LT_STRICT:
            raise ValueError("magpie_lt_draws: these weights do not fit the kernel")
        return fb()
    T = w.qkv.dtype
    n, V, D = w.out_w.shape
    NL, F = w.qkv.shape[0], w.ff1.shape[1]
    has_in = w.in_w is not None
    if scratch is None:
        scratch = make_magpie_lt_scratch(w)
    be = _backend()
    name = "magpie_lt_megakernel" if be == "cuda" else "magpie_lt"
    tkey = (name, T, D, d, F, V, int(w.heads), NL, n)
    st = _STATUS.get(tkey)
    if st is False:
        return fb()
    ng = magpie_lt_groups()
    steps = (int(has_in) + 5 * NL + 1) * n + 1
    spans = [(0, steps)] if be == "cuda" else [(s, s + 1) for s in range(steps)]
    tmpl = [("T", T), ("DT", D), ("DIN", d), ("FT", F), ("VT", V), ("HT", int(w.heads)), ("NLT", NL), ("NN", n)]
    fixed = [h.astype(mx.float32), w.in_w if has_in else _dummy(T), w.in_b if has_in else _dummy(T), w.pos, w.ln,
             w.qkv, w.wo, w.ff1, w.ff2, w.out_w, w.out_b, w.emb, bad.astype(mx.float32),
             _f32(float(cfg_scale), float(temperature))]
    cur = state if state.dtype == mx.uint32 else state.astype(mx.uint32)
    try:
        k = spec_kernel(name)
        codes = None
        for s0, s1 in spans:
            # each launch takes the previous one's state: the data edge that orders them on the scratch
            codes, cur = k(inputs=fixed + [_i32(R, int(has_in), s0, s1, int(top_k), ng, int(cur.size)), cur,
                                           scratch[0], scratch[1]],
                             template=tmpl, grid=(ng * MAGPIE_LT_THREADS, 1, 1), threadgroup=(MAGPIE_LT_THREADS, 1, 1),
                             output_shapes=[(n,), cur.shape], output_dtypes=[mx.int32, mx.uint32])
        if st is None:
            mx.eval(codes, cur)
            _STATUS[tkey] = True
        return codes, cur
    except Exception as e:  # noqa: BLE001 - a build or run failure: the reference from now on
        if MAGPIE_LT_STRICT:
            raise
        _STATUS[tkey] = False
        _say(f"{name} {tkey} unavailable on {be} ({type(e).__name__}: {str(e)[:2000]}); using the reference")
        return fb()
