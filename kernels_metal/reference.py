"""Pure-MLX references of every kernel in kernels_metal.

These functions are the test oracle: they are written with plain composite MLX operations
(no mx.fast.*), compute in float32 and cast the result to the input dtype. They are also what a
GPU variant falls back to when it cannot be built. The CPU backend uses the faster formulations in
``kernels_metal.cpu`` (mx.fast.* where one exists), checked against these in the tests.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import mlx.core as mx
import numpy as np

__all__ = [
    "RopeTable",
    "rope_table",
    "rms_norm",
    "add_rms_norm",
    "rope",
    "mrope",
    "mrope_axis_map",
    "decode_attention",
    "paged_slots",
    "paged_gather",
    "paged_decode_attention",
    "qk_rope_store",
    "linear",
    "quantized_linear",
    "sample",
    "make_sample_state",
    "hash_uniform",
    "U32",
    "Experts",
    "expert_weights",
    "moe_route",
    "moe_experts",
    "moe_act",
    "moe_combine",
    "moe_pack",
    "gated_delta_recurrent",
    "gated_delta_conv_step",
    "gated_delta_chunked",
    "gated_delta_chunk_scan",
    "unit_lower_inverse",
]


# ----------------------------------------------------------------------------------------------
# RMSNorm


def rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """y = x / sqrt(mean(x^2) + eps) * weight, in float32, returned in x.dtype."""
    xf = x.astype(mx.float32)
    ms = mx.mean(xf * xf, axis=-1, keepdims=True)
    y = xf * mx.rsqrt(ms + eps) * weight.astype(mx.float32)
    return y.astype(x.dtype)


def add_rms_norm(x: mx.array, residual: mx.array, weight: mx.array, eps: float):
    """h = x + residual (rounded to x.dtype), y = rms_norm(h). Returns (y, h)."""
    h = (x.astype(mx.float32) + residual.astype(mx.float32)).astype(x.dtype)
    return rms_norm(h, weight, eps), h


# ----------------------------------------------------------------------------------------------
# RoPE tables


@dataclass(frozen=True, eq=False)
class RopeTable:
    """cos/sin(pos * inv_freq) * attention_scale, float32, shape (max_positions, dims // 2)."""

    cos: mx.array
    sin: mx.array
    max_positions: int
    dims: int
    inv_freq: np.ndarray
    attention_scale: float


@functools.lru_cache(maxsize=32)
def _rope_table_cached(inv_bytes: bytes, half: int, max_positions: int, scale: float) -> RopeTable:
    inv = np.frombuffer(inv_bytes, dtype=np.float64).copy()
    pos = np.arange(max_positions, dtype=np.float64)[:, None]
    ang = pos * inv[None, :]
    cos = mx.array((np.cos(ang) * scale).astype(np.float32))
    sin = mx.array((np.sin(ang) * scale).astype(np.float32))
    return RopeTable(cos, sin, int(max_positions), 2 * half, inv, float(scale))


def rope_table(inv_freq, max_positions: int, attention_scale: float = 1.0) -> RopeTable:
    """The shared cos/sin table. Cached on (inv_freq bytes, max_positions, attention_scale), so
    every layer of a model (and every model with the same RoPE) shares one table."""
    inv = np.ascontiguousarray(np.asarray(inv_freq, dtype=np.float64).reshape(-1))
    return _rope_table_cached(inv.tobytes(), inv.shape[0], int(max_positions), float(attention_scale))


# ----------------------------------------------------------------------------------------------
# RoPE


def _rotate(xf: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    """rotate_half layout: y = x*cos + rotate_half(x)*sin, cos/sin of shape (..., D/2)."""
    half = xf.shape[-1] // 2
    x1 = xf[..., :half]
    x2 = xf[..., half:]
    return mx.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope(x: mx.array, table: RopeTable, offset: int) -> mx.array:
    """x: (B, H, L, D), positions offset .. offset+L-1, computed in float32, cast to x.dtype."""
    L, D = x.shape[-2], x.shape[-1]
    if D != table.dims:
        raise ValueError(f"rope: head dim {D} != table dims {table.dims}")
    if offset + L > table.max_positions:
        raise ValueError(f"rope: positions up to {offset + L} exceed the table ({table.max_positions})")
    cos = table.cos[offset : offset + L]
    sin = table.sin[offset : offset + L]
    return _rotate(x.astype(mx.float32), cos, sin).astype(x.dtype)


def mrope_axis_map(mrope_section, interleaved: bool) -> np.ndarray:
    """For each frequency index j in [0, D/2): which position axis (0=t, 1=h, 2=w) drives it.

    interleaved=False (Qwen2-VL / Qwen2.5-VL): contiguous chunks, the first s0 frequencies take t,
    the next s1 take h, the last s2 take w.
    interleaved=True (Qwen3-VL / Qwen3-Omni / Qwen3-TTS): start from t everywhere, then frequency j
    takes h where j % 3 == 1 and j < 3*s1, and w where j % 3 == 2 and j < 3*s2.
    """
    sec = [int(s) for s in mrope_section]
    half = sum(sec)
    axis = np.zeros(half, dtype=np.int32)
    if not interleaved:
        axis[sec[0] : sec[0] + sec[1]] = 1
        axis[sec[0] + sec[1] :] = 2
    else:
        for a, off in ((1, 1), (2, 2)):
            axis[off : 3 * sec[a] : 3] = a
    return axis


def mrope(x, table: RopeTable, position_ids, mrope_section, interleaved: bool) -> mx.array:
    """x: (B, H, L, D); position_ids: (3, B, L) int. Each frequency j uses the position of the axis
    mrope_axis_map gives it."""
    B, H, L, D = x.shape
    half = D // 2
    if sum(int(s) for s in mrope_section) != half:
        raise ValueError(f"mrope: mrope_section {list(mrope_section)} must sum to D/2 = {half}")
    axis = mx.array(mrope_axis_map(mrope_section, interleaved))  # (half,)
    pid = position_ids.astype(mx.int32)  # (3, B, L)
    # positions per (b, l, j): pick axis[j] out of the 3 position rows
    pos = mx.take_along_axis(
        mx.transpose(pid, (1, 2, 0)), mx.broadcast_to(axis[None, None, :], (B, L, half)), axis=-1
    )  # (B, L, half)
    j = mx.broadcast_to(mx.arange(half)[None, None, :], (B, L, half))
    flat = pos * half + j
    cos = mx.take(table.cos.reshape(-1), flat)[:, None]  # (B, 1, L, half)
    sin = mx.take(table.sin.reshape(-1), flat)[:, None]
    return _rotate(x.astype(mx.float32), cos, sin).astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Decode attention


def kv_store(kc, vc, k, v, layer: int, start: int, dep=None):
    """k, v (1, Hkv, n, D) into layer `layer` of the stacked cache kc, vc (L, Hkv, C, D) at positions
    start .. start + n - 1. Returns (kc, vc, sync, keys, values): the updated caches (new arrays here; the
    GPU kernel writes in place), an ordering output (1,) uint32, and the layer's keys and values up to the
    new end (1, Hkv, start + n, D)."""
    n = k.shape[2]
    if start + n > kc.shape[2]:
        raise ValueError(f"kv_store: positions up to {start + n} past the cache capacity {kc.shape[2]}")
    kc[layer, :, start:start + n, :] = k[0].astype(kc.dtype)
    vc[layer, :, start:start + n, :] = v[0].astype(vc.dtype)
    end = start + n
    return kc, vc, mx.ones((1,), mx.uint32), kc[layer:layer + 1, :, :end], vc[layer:layer + 1, :, :end]


def decode_attention(q, k, v, length: int, scale: float) -> mx.array:
    """q: (B, Hq, 1, D); k, v: (B, Hkv, S_cap, D), first `length` positions valid.
    Query head h reads KV head h // (Hq // Hkv) (the repeat_kv convention), without repeating K/V."""
    _check_decode_heads("decode_attention", q, k.shape[1])
    return _grouped_attention(q, k[:, :, :length], v[:, :, :length], scale)


def _check_decode_heads(name: str, q, Hkv: int) -> None:
    if q.shape[2] != 1:
        raise ValueError(f"{name} takes one query token per sequence")
    if q.shape[1] % Hkv:
        raise ValueError(f"{name}: Hq={q.shape[1]} is not a multiple of Hkv={Hkv}")


def _grouped_attention(q, k, v, scale: float, valid=None) -> mx.array:
    """One query token a row over keys and values (B, Hkv, S, D) in float32, query head h on KV head
    h // (Hq // Hkv); valid (B, S) bool hides positions. -> (B, Hq, 1, D) in q.dtype"""
    B, Hq, _, D = q.shape
    Hkv = k.shape[1]
    qg = q.reshape(B, Hkv, Hq // Hkv, D).astype(mx.float32)
    s = (qg @ mx.swapaxes(k.astype(mx.float32), -1, -2)) * scale  # (B, Hkv, G, S)
    if valid is not None:
        s = mx.where(valid[:, None, None, :], s, -mx.inf)
    s = s - mx.max(s, axis=-1, keepdims=True)
    p = mx.exp(s)
    p = p / mx.sum(p, axis=-1, keepdims=True)
    return (p @ v.astype(mx.float32)).reshape(B, Hq, 1, D).astype(q.dtype)  # (B, Hkv, G, D) -> (B, Hq, 1, D)


def paged_slots(table, positions, block_size: int) -> mx.array:
    """The pool slot of each position of each row: table (B, MB) block ids, positions (B, L) int32 ->
    (B, L) int32, table[b, p // block_size] * block_size + p % block_size."""
    blocks = mx.take_along_axis(table, positions // block_size, axis=1)
    return blocks * block_size + positions % block_size


def paged_decode_attention(q, k, v, table, lengths, max_length: int, block_size: int, scale: float) -> mx.array:
    """decode_attention over a paged pool: q (B, Hq, 1, D); k, v (slots, Hkv, D), blocks of `block_size`
    slots; row b's position p is slot table[b, p // block_size] * block_size + p % block_size, and its
    first lengths[b] positions are valid (max_length >= every length; table (B, MB) int32 covers them).
    Query head h reads KV head h // (Hq // Hkv), as decode_attention."""
    _check_decode_heads("paged_decode_attention", q, k.shape[1])
    kk, vv, valid = paged_gather(k, v, table, lengths, max_length, block_size)
    return _grouped_attention(q, kk, vv, scale, valid)


def paged_gather(k, v, table, lengths, max_length: int, block_size: int):
    """Every row's first max_length positions out of the pools k, v (slots, Hkv, D) by its block table:
    (keys, values (B, Hkv, max_length, D), valid (B, max_length) bool: the positions below each row's length)."""
    B = table.shape[0]
    pos = mx.broadcast_to(mx.arange(max_length, dtype=mx.int32)[None], (B, max_length))
    # positions past a row's blocks would index past its table: any slot does, `valid` drops them
    pos = mx.minimum(pos, (table.shape[1] * block_size - 1))
    slots = paged_slots(table, pos, block_size)  # (B, S)
    # (B, S, Hkv, D) -> (B, Hkv, S, D)
    kk, vv = mx.swapaxes(k[slots], 1, 2), mx.swapaxes(v[slots], 1, 2)
    return kk, vv, mx.arange(max_length)[None, :] < lengths[:, None]


def qk_rope_store(q, k, v, q_weight, k_weight, eps: float, table, positions, slots, k_pool, v_pool):
    """A batch's decode step between its projections and paged attention: q (B, Hq * D), k, v (B, Hkv * D)
    (any leading shape of B rows); each head of q and k RMS-normed by q_weight / k_weight (D,) where given
    (rounded to the input dtype, as a norm's output), then turned by RoPE at its row's position
    positions[b] (rotate_half, from `table`). Returns (q (B, Hq, 1, D), k_pool, v_pool) with row b's key and
    value heads written at slot slots[b] of the pools (slots, Hkv, D): new arrays, the inputs left alone.
    k and v None: q is the fused projection (B, (Hq + 2 Hkv) * D), its queries, keys and values in that order."""
    Hkv, D = k_pool.shape[1], k_pool.shape[2]
    B = positions.shape[0]
    if k is None:
        # (B, ..., (Hq + 2 Hkv) D) -> (B, Hq + 2 Hkv, D): queries, then keys, then values
        heads = q.reshape(B, -1, D)
        q, k, v = heads[:, : -2 * Hkv], heads[:, -2 * Hkv : -Hkv], heads[:, -Hkv:]
    qh = q.reshape(B, -1, D)
    kh = k.reshape(B, Hkv, D)
    vh = v.reshape(B, Hkv, D)
    if q_weight is not None:
        qh, kh = rms_norm(qh, q_weight, eps), rms_norm(kh, k_weight, eps)
    cos = table.cos[positions][:, None, :]  # (B, 1, D/2): each row's position, every head
    sin = table.sin[positions][:, None, :]

    def turn(x):
        return _rotate(x.astype(mx.float32), cos, sin).astype(x.dtype)

    kp, vp = mx.array(k_pool), mx.array(v_pool)
    kp[slots] = turn(kh).astype(kp.dtype)
    vp[slots] = vh.astype(vp.dtype)
    return turn(qh)[:, :, None, :], kp, vp


# ----------------------------------------------------------------------------------------------
# Linear


def linear(x, weight, bias=None) -> mx.array:
    """y = x @ weight.T (+ bias); accumulation in float32, output in x.dtype."""
    y = x.astype(mx.float32) @ weight.astype(mx.float32).T
    if bias is not None:
        y = y + bias.astype(mx.float32)
    return y.astype(x.dtype)


def quantized_linear(x, w, scales, biases, group_size: int, bits: int, bias=None) -> mx.array:
    """MLX-quantized weight (mx.quantize layout, the transpose=True product): y = x @ W.T."""
    W = mx.dequantize(w, scales, biases, group_size=group_size, bits=bits)
    return linear(x, W, bias)


# ----------------------------------------------------------------------------------------------
# Sampling: the counter-based generator shared bit for bit with the kernels

U32 = mx.uint32
_GOLDEN = 0x9E3779B9
_ROW = 0x85EBCA6B
_MASK = 0xFFFFFFFF


def _u(c: int) -> mx.array:
    return mx.array(c & _MASK, dtype=U32)


def _mix32(x: mx.array) -> mx.array:
    """A 32-bit integer finalizer (xorshift-multiply, 'lowbias32' constants); a bijection."""
    x = x ^ (x >> _u(16))
    x = x * _u(0x7FEB352D)
    x = x ^ (x >> _u(15))
    x = x * _u(0x846CA68B)
    x = x ^ (x >> _u(16))
    return x


def _row_keys(state: mx.array, B: int, streams: Optional[mx.array] = None) -> mx.array:
    """key[b] = mix(mix(mix(seed + GOLDEN) ^ counter) ^ (stream_b * ROW + GOLDEN)), stream_b = b unless
    `streams` (B,) says otherwise."""
    seed = state[0]
    counter = state[1]
    base = _mix32(_mix32(seed + _u(_GOLDEN)) ^ counter)
    b = mx.arange(B).astype(U32) if streams is None else streams.astype(U32)
    return _mix32(base ^ (b * _u(_ROW) + _u(_GOLDEN)))


def hash_uniform(state: mx.array, B: int, V: int, streams: Optional[mx.array] = None) -> mx.array:
    """u[b, v] in (0, 1), float32: bits = mix(key[b] ^ mix(v)), u = ((bits >> 9) + 0.5) / 2^23
    (exact in float32, never 0 or 1)."""
    keys = _row_keys(state, B, streams)[:, None]
    v = mx.arange(V).astype(U32)[None, :]
    bits = _mix32(keys ^ _mix32(v))
    return ((bits >> _u(9)).astype(mx.float32) + 0.5) * (1.0 / 8388608.0)


# The sampler's state words: [seed, counter] and two of padding. MLX's CUDA allocator keeps arrays of 8 bytes or
# less in a pool of unified memory that the per-step token readback also touches, and every group of the sampling
# kernel reads the state: 16 bytes took 0.3-3.1% off a pipelined token on the H200 (docs/decode.md, "Small arrays in
# unified memory"). The third word is the token row 0 drew: device memory that a GPU decode step reads as its next
# input instead of the (1,) token array in that pool (`token_word`). Words past it are carried through unchanged; a
# state of 2 words is still taken. A state given a window of W recent tokens (`with_recent`) has W more words, a ring
# of the last W ids given or drawn (0xffffffff where empty), the fourth word the ring's next slot: the
# repetition penalty reads the ring, and each draw writes its token into it, so that a decode loop keeps no history
# of its own (a concatenation a token, docs/decode.md "Samplers and logits processors").
SAMPLE_STATE_WORDS = 4


def make_sample_state(seed: int) -> mx.array:
    """The sampler's device state: uint32 [seed, counter=0, last token=0, ring slot=0] (`with_recent` adds a ring)."""
    return mx.array([int(seed) & _MASK, 0] + [0] * (SAMPLE_STATE_WORDS - 2), dtype=U32)


def ring_size(state: mx.array) -> int:
    """W, the recent tokens a sampler state keeps (0: none; a per-row state (B, 3) keeps none)."""
    return max(0, int(state.shape[-1]) - SAMPLE_STATE_WORDS) if state.ndim == 1 else 0


def with_recent(state: mx.array, ids, window: int) -> mx.array:
    """`state` (one row's: seed and counter kept) with a ring of `window` recent tokens holding the last of `ids`
    (oldest first; fewer leave the rest empty) and its slot at the oldest entry, so that the next draw replaces it
    once the ring is full."""
    W = int(window)
    if W <= 0 or state.ndim != 1:
        raise ValueError(f"a ring of recent tokens needs a window > 0 and one row's state, got {W}")
    ids = (ids if isinstance(ids, mx.array) else mx.array(ids, mx.int32)).reshape(-1).astype(mx.int32)
    if state.shape[0] < SAMPLE_STATE_WORDS:
        state = mx.concatenate([state, mx.zeros((SAMPLE_STATE_WORDS - state.shape[0],), U32)])
    n = min(int(ids.size), W)
    ring = [ids[ids.size - n :].astype(U32)] if n else []
    ring.append(mx.full((W - n,), _MASK, U32))
    return mx.concatenate([state[:3], mx.array([n % W], U32)] + ring)


def ring_penalizes(state: mx.array, recent, rows: int) -> int:
    """W where a call's penalty reads the state's ring of W recent tokens (no `recent` given and a ring kept), else 0.
    A ring is one row's: more rows are refused."""
    W = ring_size(state) if recent is None else 0
    if W and rows != 1:
        raise ValueError("a sampler state with recent tokens draws one row")
    return W


def recent_ids(state: mx.array) -> mx.array:
    """The ring's ids, (W,) int32 in slot order, -1 where empty (a state with a window)."""
    return mx.view(state[SAMPLE_STATE_WORDS:], mx.int32)


@functools.lru_cache(maxsize=8)
def _counter_step(words: int) -> mx.array:
    # made once a size: a fresh host array every token is a host-to-device copy every token
    return mx.array([0, 1] + [0] * (words - 2), dtype=U32)


def advance_state(state: mx.array) -> mx.array:
    """[seed, counter + 1, the rest as given], computed on the device."""
    return state + _counter_step(state.shape[-1])


def drawn_state(state: mx.array, tok: mx.array) -> mx.array:
    """The state after `sample` drew `tok` (B,): advanced, and row 0's token in its third word (a state of 3 words or
    more; `token_word`)."""
    nxt = advance_state(state)
    if state.ndim != 1 or state.shape[0] < 3:
        return nxt
    W = ring_size(state)
    if W == 0:
        return mx.concatenate([nxt[:2], tok[:1].astype(U32), nxt[3:]])
    slot = state[3:4] % _u(W)  # lazy, as the kernel's: no readback
    ring = mx.where(mx.arange(W).astype(U32) == slot, tok[:1].astype(U32), nxt[SAMPLE_STATE_WORDS:])
    return mx.concatenate([nxt[:2], tok[:1].astype(U32), (slot + _u(1)) % _u(W), ring])


def token_word(state: mx.array) -> mx.array:
    """The token row 0 last drew, (1,) int32, as a view of the sampler's state (no copy, no launch): a decode step's
    next input that lives in device memory (arrays of 8 bytes or less, like the (1,) token the CPU reads back, share a
    unified-memory pool on MLX's CUDA backend)."""
    return mx.view(state[2:3], mx.int32)


def filtered_logits(logits: mx.array, temperature: float, top_k: int, top_p: float, min_p: float):
    """The temperature-scaled float32 logits with -inf where top_k, top_p, min_p removed a token.

    top_k keeps every token whose value is >= the k-th largest (ties at the edge are kept, as HF).
    top_p keeps the tokens with the smallest probability p* such that the mass of tokens strictly
    more probable than p* is < top_p, and every token with p >= p* (so exact ties are kept
    together; otherwise identical to HF's sort-and-cumsum rule). min_p keeps p >= min_p * p_max.
    """
    s = logits.astype(mx.float32) / float(temperature)
    V = s.shape[-1]
    neg = mx.array(-math.inf, dtype=mx.float32)
    if top_k and 0 < top_k < V:
        kth = mx.sort(s, axis=-1)[:, V - top_k : V - top_k + 1]
        s = mx.where(s >= kth, s, neg)
    if top_p < 1.0:
        p = mx.softmax(s, axis=-1)
        ps = -mx.sort(-p, axis=-1)  # descending
        excl = mx.cumsum(ps, axis=-1) - ps  # mass strictly before each sorted position
        kept = (excl < top_p) | (mx.arange(V) == 0)[None, :]  # always keep the most probable
        # smallest kept probability in sorted order
        pstar = mx.min(mx.where(kept, ps, mx.array(math.inf, dtype=mx.float32)), axis=-1, keepdims=True)
        s = mx.where(p >= pstar, s, neg)
    if min_p > 0.0:
        smax = mx.max(s, axis=-1, keepdims=True)
        s = mx.where(s >= smax + math.log(min_p), s, neg)
    return s


def penalize(logits: mx.array, recent: mx.array, penalty: float) -> mx.array:
    """The float32 logits (B, V) with the repetition penalty applied once to each distinct id of
    `recent` ((T,) for one row or (B, T); ids < 0 or >= V ignored): a positive logit divided by
    `penalty`, a negative one multiplied, as Hugging Face does."""
    lf = logits.astype(mx.float32)
    B, V = lf.shape
    ids = recent.reshape(B, -1).astype(mx.int32)
    ids = mx.where((ids >= 0) & (ids < V), ids, V)  # ignored ids land in a spare column
    hit = mx.put_along_axis(mx.zeros((B, V + 1), mx.float32), ids, mx.array(1.0, mx.float32), axis=-1)
    return mx.where(hit[:, :V] > 0, mx.where(lf < 0, lf * penalty, lf / penalty), lf)


def sample(logits, temperature: float, top_k: int, top_p: float, min_p: float, state, recent=None,
           penalty: float = 1.0, streams: Optional[mx.array] = None):
    """Returns (tokens (B,) int32, logprobs (B,) float32, next_state).

    recent, penalty: the repetition penalty (`penalize`), applied first; the logprob is that of the
    penalized logits. Without `recent`, a state with a ring (with_recent) penalizes its ring's ids, and
    the drawn token goes into the ring either way. streams: each row's random stream (default: its index).

    Gumbel-max: token = argmax over surviving tokens of s_v - log(-log(u[b, v])), u from
    hash_uniform(state). temperature == 0 is greedy argmax of the raw logits; the state advances
    on every call, greedy included, so a sequence of calls is reproducible whatever its mix.
    logprobs: log_softmax(logits)[token] of the raw, unfiltered, untempered logits.
    """
    if logits.ndim == 1:
        logits = logits[None]
    B, V = logits.shape
    if ring_penalizes(state, recent, B):
        recent = recent_ids(state)
    if recent is not None and penalty != 1.0 and recent.size:
        logits = penalize(logits, recent, penalty)
    lf = logits.astype(mx.float32)
    if temperature <= 0.0:
        tok = mx.argmax(lf, axis=-1)
    else:
        s = filtered_logits(logits, temperature, top_k, top_p, min_p)
        u = hash_uniform(state, B, V, streams)
        g = -mx.log(-mx.log(u))
        tok = mx.argmax(s + g, axis=-1)
    tok = tok.astype(mx.int32)
    lse = mx.logsumexp(lf, axis=-1)
    lp = mx.take_along_axis(lf, tok[:, None], axis=-1)[:, 0] - lse
    return tok, lp.astype(mx.float32), drawn_state(state, tok)


def sample_rows(logits, settings, states, recent=None):
    """Rows that each sample with their own settings and state (a batch of requests in one call).

    settings: one (temperature, top_k, top_p, min_p, penalty, window) a row, the penalty over the last
    `window` entries of its row of `recent` (B, H); states (B, 3) uint32 [seed, counter, stream] a row.
    Row b draws exactly as `sample` draws row 0 of its logits alone with state [seed, counter] when its
    stream is 0 (a request's own sampler), or as row `stream` of a shared sampler's call.
    Returns (tokens (B,), logprobs (B,), next_states (B, 3), the counters advanced)."""
    toks, lps = [], []
    for b, (temperature, top_k, top_p, min_p, penalty, window) in enumerate(settings):
        rec = None
        if recent is not None and window > 0 and penalty != 1.0:
            H = recent.shape[-1]
            rec = recent[b, H - min(int(window), H):]
        tok, lp, _ = sample(logits[b : b + 1], temperature, top_k, top_p, min_p, states[b, :2], rec, penalty,
                            streams=states[b, 2:3])
        toks.append(tok)
        lps.append(lp)
    return mx.concatenate(toks), mx.concatenate(lps), states + mx.array([0, 1, 0], dtype=U32)


# ----------------------------------------------------------------------------------------------
# Mixture of experts


class Experts(NamedTuple):
    """One projection of a layer's experts, stacked on axis 0: weight (E, out, in) floating, or MLX
    affine-quantized (bits 4 or 8): weight (E, out, in * bits / 32) uint32 with scales and biases
    (E, out, in / group_size)."""

    weight: mx.array
    scales: Optional[mx.array] = None
    biases: Optional[mx.array] = None
    group_size: int = 0
    bits: int = 0  # 0: not quantized

    @property
    def out_dims(self) -> int:
        return self.weight.shape[1]

    @property
    def in_dims(self) -> int:
        return self.weight.shape[2] * 32 // self.bits if self.bits else self.weight.shape[2]


def expert_weights(ex: Experts, inds: mx.array) -> mx.array:
    """The experts `inds` (any shape) as float32 matrices: (*inds.shape, out, in)."""
    w = ex.weight[inds]
    if not ex.bits:
        return w.astype(mx.float32)
    return mx.dequantize(w, ex.scales[inds], ex.biases[inds], group_size=ex.group_size,
                         bits=ex.bits).astype(mx.float32)


def moe_route(logits: mx.array, top_k: int, norm_topk_prob: bool):
    """Router: softmax over the experts in float32, the top_k most probable (ties to the smaller
    expert id), in descending order, renormalised to sum 1 when norm_topk_prob. logits (T, E).
    Returns (scores (T, top_k) in logits.dtype, as transformers casts them, inds (T, top_k) int32)."""
    p = mx.softmax(logits.astype(mx.float32), axis=-1)
    E = p.shape[-1]
    # rank of each expert: how many are more probable, or as probable with a smaller id
    pe, pj = p[..., :, None], p[..., None, :]
    ids = mx.arange(E)
    ahead = (pj > pe) | ((pj == pe) & (ids[None, :] < ids[:, None]))
    rank = mx.sum(ahead.astype(mx.int32), axis=-1)  # (T, E), a permutation of 0..E-1 per row
    inds = mx.argsort(rank, axis=-1)[..., :top_k].astype(mx.int32)
    top = mx.take_along_axis(p, inds, axis=-1)
    if norm_topk_prob:
        top = top / mx.sum(top, axis=-1, keepdims=True)
    return top.astype(logits.dtype), inds


def _round(a: mx.array, dtype) -> mx.array:
    return a.astype(dtype).astype(mx.float32)


def moe_act(x: mx.array, inds: mx.array, gate: Experts, up: Experts) -> mx.array:
    """The chosen experts' SwiGLU activations: x (T, H), inds (T, k) -> (T, k, I) in x.dtype, with
    g = x.Wg and u = x.Wu rounded to x.dtype, silu(g) = g * sigmoid(g) and silu(g) * u rounded where
    the plain MLX path rounds them."""
    dt = x.dtype
    xf = x.astype(mx.float32)[:, None, None, :]  # (T, 1, 1, H)
    g = _round((xf * expert_weights(gate, inds)).sum(-1), dt)  # (T, k, I)
    u = _round((xf * expert_weights(up, inds)).sum(-1), dt)
    return _round(_round(g * _round(mx.sigmoid(g), dt), dt) * u, dt).astype(dt)


def moe_combine(act: mx.array, inds: mx.array, scores: mx.array, down: Experts) -> mx.array:
    """The chosen experts' down projections weighted by their scores and summed: act (T, k, I) ->
    (T, H); each expert's output rounded to act.dtype, the weighted sum float32, rounded once."""
    dt = act.dtype
    af = act.astype(mx.float32)[:, :, None, :]  # (T, k, 1, I)
    y = _round((af * expert_weights(down, inds)).sum(-1), dt)  # (T, k, H)
    return (scores.astype(mx.float32)[..., None] * y).sum(axis=1).astype(dt)


def moe_experts(x: mx.array, inds: mx.array, scores: mx.array, gate: Experts, up: Experts, down: Experts
                ) -> mx.array:
    """The routed SwiGLU experts, weighted and summed: x (T, H), inds and scores (T, k) -> (T, H)
    (moe_act, then moe_combine)."""
    return moe_combine(moe_act(x, inds, gate, up), inds, scores, down)


def moe_pack(inds: mx.array, num_experts: int, block: int):
    """Group the T*k (token, slot) assignments by expert into blocks of `block` rows, each block
    holding one expert's rows (the grouped GEMM's layout), with a static bound on the blocks:
    nblk = ceil(A / block) + E. inds (A,) int32, the flattened routing.

    Returns (src (nblk * block,) int32: the assignment of each row, -1 for padding;
    dst (A,) int32: the row of each assignment; bexp (nblk,) int32: the expert of each block, 0 for
    unused blocks). Here rows keep the assignments' order within an expert; the kernels may order
    them otherwise (any order gives the same products)."""
    A = inds.shape[0]
    E, B = num_experts, block
    nblk = -(-A // B) + E
    e = inds.astype(mx.int32)
    onehot = (e[:, None] == mx.arange(E)[None, :]).astype(mx.int32)  # (A, E)
    counts = onehot.sum(0)
    nb = (counts + B - 1) // B
    bstart = mx.cumsum(nb) - nb  # first block of each expert
    rank = (mx.cumsum(onehot, axis=0) - onehot)[mx.arange(A), e]  # earlier assignments, same expert
    dst = bstart[e] * B + rank
    src = mx.full((nblk * B,), -1, mx.int32)
    src[dst] = mx.arange(A, dtype=mx.int32)
    b = mx.arange(nblk)
    inside = (b[:, None] >= bstart[None, :]) & (b[:, None] < (bstart + nb)[None, :])  # (nblk, E)
    bexp = mx.sum(inside.astype(mx.int32) * mx.arange(E)[None, :], axis=1).astype(mx.int32)
    return src, dst.astype(mx.int32), bexp


# --------------------------------------------------------------------------- gated delta rule


def _gated_delta_inputs(q, k, v, g, beta):
    """q, k L2-normalised over Dk (eps 1e-6 inside the root, as the reference library), q scaled
    by Dk^-1/2, key heads repeated for the value heads they serve (value head j reads key head
    j // (Hv / Hk)); all float32 and moved to (B, H, L, D), the gates to (B, H, L)."""
    Dk, Hk, Hv = q.shape[-1], q.shape[2], v.shape[2]

    def l2(x):
        x = x.astype(mx.float32)
        return x * mx.rsqrt((x * x).sum(-1, keepdims=True) + 1e-6)

    q, k = l2(q) * (Dk**-0.5), l2(k)
    if Hv != Hk:
        q, k = mx.repeat(q, Hv // Hk, axis=2), mx.repeat(k, Hv // Hk, axis=2)
    # (B, L, H, D) -> (B, H, L, D); (B, L, H) -> (B, H, L)
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v.astype(mx.float32)))
    return q, k, v, g.astype(mx.float32).transpose(0, 2, 1), beta.astype(mx.float32).transpose(0, 2, 1)


def gated_delta_recurrent(q, k, v, g, beta, state=None):
    """The gated delta rule token by token (the oracle the chunked form and the kernels are checked
    against). q, k (B, L, Hk, Dk) raw; v (B, L, Hv, Dv); g (log decay <= 0), beta (B, L, Hv) float32;
    state (B, Hv, Dk, Dv) float32 or None. Per token, per value head, in float32:
    S = S exp(g); S += k (beta (v - k.S)); out = q.S. Returns (out (B, L, Hv, Dv) in v's dtype, S)."""
    B, L, Hv, Dv = v.shape
    out_dtype = v.dtype
    q, k, v, g, beta = _gated_delta_inputs(q, k, v, g, beta)
    S = mx.zeros((B, Hv, q.shape[-1], Dv), mx.float32) if state is None else state.astype(mx.float32)
    outs = []
    for t in range(L):
        kt = k[:, :, t, :, None]  # (B, H, Dk, 1)
        S = S * mx.exp(g[:, :, t])[..., None, None]
        delta = (v[:, :, t] - (S * kt).sum(-2)) * beta[:, :, t, None]  # (B, H, Dv)
        S = S + kt * delta[:, :, None, :]
        outs.append((S * q[:, :, t, :, None]).sum(-2))
    return mx.stack(outs, axis=2).transpose(0, 2, 1, 3).astype(out_dtype), S


def gated_delta_conv_step(mixed, conv_state, conv_weight, a, b, A_log, dt_bias, state):
    """One decode token of a Gated DeltaNet layer from its input projections: the causal depthwise
    conv over the cached taps and the new token, SiLU, the gates, the gated delta rule.
    mixed (B, 1, C) the projected [q (Hk Dk) | k (Hk Dk) | v (Hv Dv)], conv_state (B, taps, C) the
    last `taps` inputs (oldest first) in mixed's dtype, conv_weight (C, taps + 1, 1) (MLX layout),
    a, b (B, 1, Hv) the raw decay and write-strength projections, A_log, dt_bias (Hv,), state
    (B, Hv, Dk, Dv) float32. The conv sums in float32 and rounds to mixed's dtype, SiLU in that dtype;
    beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) in float32.
    Returns (out (B, 1, Hv, Dv) in mixed's dtype, the new conv state, the new state)."""
    B, _, C = mixed.shape
    Hv, Dk, Dv = state.shape[1:]
    Hk = (C - Hv * Dv) // (2 * Dk)
    window = mx.concatenate([conv_state.astype(mixed.dtype), mixed], axis=1)  # (B, taps + 1, C)
    w = conv_weight[..., 0].T.astype(mx.float32)  # (C, taps + 1, 1) -> (taps + 1, C)
    x = (window.astype(mx.float32) * w).sum(axis=1, keepdims=True).astype(mixed.dtype)
    x = x * mx.sigmoid(x)  # SiLU, (B, 1, C)
    kd = Hk * Dk
    q = x[..., :kd].reshape(B, 1, Hk, Dk)
    k = x[..., kd:2 * kd].reshape(B, 1, Hk, Dk)
    v = x[..., 2 * kd:].reshape(B, 1, Hv, Dv)
    beta = mx.sigmoid(b.astype(mx.float32))
    g = -mx.exp(A_log.astype(mx.float32)) * mx.logaddexp(a.astype(mx.float32) + dt_bias.astype(mx.float32), 0.0)
    out, new_state = gated_delta_recurrent(q, k, v, g, beta, state)
    return out, window[:, 1:, :], new_state


GATED_DELTA_CHUNK = 64
# the within-chunk inverse's diagonal blocks (unit_lower_inverse)
GATED_DELTA_BLOCK = 16


def unit_lower_inverse(A, block: int = GATED_DELTA_BLOCK):
    """(I + A)^-1 for A (..., C, C) strictly lower triangular, float32, by forward substitution in
    two levels: the diagonal blocks of `block` rows one row a step (every block of every matrix at
    once), then the block rows below them one block a step (two matmuls each). That is block + C / block
    short steps where row-by-row substitution takes C, each on (C, C) matrices rather than on the
    right-hand sides, and it runs on any device: MLX's triangular solvers take the CPU stream only.
    A C that `block` does not divide is solved row by row (one block of C rows)."""
    C = A.shape[-1]
    b = block if C % block == 0 else C
    nb = C // b
    # (..., C, C) -> the diagonal blocks (..., nb, b, b)
    D = mx.stack([A[..., i * b:(i + 1) * b, i * b:(i + 1) * b] for i in range(nb)], axis=-3)
    eye = mx.eye(b, dtype=A.dtype)
    # row i of a block's inverse: e_i - sum_{j<i} D(i, j) row_j; acc keeps those sums for every row
    acc = mx.zeros_like(D)
    rows = []
    for i in range(b):
        x = eye[i] - acc[..., i, :]
        rows.append(x)
        acc = acc + D[..., :, i, None] * x[..., None, :]
    Tdiag = mx.stack(rows, axis=-2)  # (..., nb, b, b)
    # block row i of the inverse: Tdiag_i (E_i - A(i, <i) T(<i, :)), E_i the identity's rows of block i
    eyeC = mx.eye(C, dtype=A.dtype)
    block_rows = []
    for i in range(nb):
        rhs = eyeC[i * b:(i + 1) * b]  # (b, C)
        if i:
            done = mx.concatenate(block_rows, axis=-2)  # (..., i b, C): the rows solved so far
            rhs = rhs - A[..., i * b:(i + 1) * b, :i * b] @ done
        block_rows.append(Tdiag[..., i, :, :] @ rhs)
    return mx.concatenate(block_rows, axis=-2)


def gated_delta_chunk_scan(U, W, qd, kd, mix, G_last, S):
    """The chunked form's scan over chunks (gated_delta_chunked), the one part that runs chunk after chunk:
    U (B, H, n, C, Dv), W, qd, kd (B, H, n, C, Dk), mix (B, H, n, C, C) causal, G_last (B, H, n), S (B, H,
    Dk, Dv), all float32. Per chunk: vc = U - W S, out = qd S + mix vc, S = S exp(G_last) + kd^T vc.
    Returns (out (B, H, n C, Dv), the last S)."""
    outs = []
    for c in range(U.shape[2]):
        vc = U[:, :, c] - W[:, :, c] @ S  # (B, H, C, Dv)
        outs.append(qd[:, :, c] @ S + mix[:, :, c] @ vc)
        S = S * mx.exp(G_last[:, :, c])[..., None, None] + kd[:, :, c].swapaxes(-1, -2) @ vc
    return mx.concatenate(outs, axis=2), S


def gated_delta_chunked(q, k, v, g, beta, state=None, chunk: int = GATED_DELTA_CHUNK, scan=gated_delta_chunk_scan):
    """The gated delta rule in chunks of `chunk` tokens, equal to gated_delta_recurrent up to float32
    rounding. Within a chunk the delta-rule writes are one triangular system: with decays
    d(i, j) = exp(G_i - G_j) (G the running sum of g in the chunk, j <= i, so every factor is <= 1;
    the differences above the diagonal are masked before the exp, where they would overflow),
    A(i, j) = beta_i (k_i . k_j) d(i, j) below the diagonal, and T = (I + A)^-1 (unit_lower_inverse),
    the chunk's corrected values are U - W S (U = T (beta v), W = T (beta k exp(G))), its outputs
    (q exp(G)) S plus the causal (q_i . k_j) d(i, j) mix of those values, and the state
    S exp(G_last) + sum_j k_j exp(G_last - G_j) (corrected v_j). No factor exp(-G) appears, so
    nothing overflows however strong the decay. Everything but the scan over chunks is batched over
    sequences, heads and chunks; that scan is `scan` (gated_delta_chunk_scan, or a GPU kernel's twin)."""
    B, L, Hv, Dv = v.shape
    out_dtype = v.dtype
    q, k, v, g, beta = _gated_delta_inputs(q, k, v, g, beta)
    Dk = q.shape[-1]
    S = mx.zeros((B, Hv, Dk, Dv), mx.float32) if state is None else state.astype(mx.float32)
    if L == 0:
        return mx.zeros((B, 0, Hv, Dv), out_dtype), S
    C = chunk
    pad = (-L) % C
    if pad:  # padded tokens write nothing (beta 0) and do not decay (g 0)
        q, k, v = (mx.pad(t, [(0, 0), (0, 0), (0, pad), (0, 0)]) for t in (q, k, v))
        g, beta = (mx.pad(t, [(0, 0), (0, 0), (0, pad)]) for t in (g, beta))
    n = (L + pad) // C
    # (B, H, L, D) -> (B, H, n, C, D); gates (B, H, n, C)
    q, k, v = (t.reshape(B, Hv, n, C, t.shape[-1]) for t in (q, k, v))
    g, beta = g.reshape(B, Hv, n, C), beta.reshape(B, Hv, n, C)
    G = mx.cumsum(g, axis=-1)
    causal = mx.tril(mx.ones((C, C), mx.bool_))
    strict = mx.tril(mx.ones((C, C), mx.bool_), k=-1)
    diff = G[..., :, None] - G[..., None, :]  # (B, H, n, C, C): G_i - G_j
    decay = mx.where(causal, mx.exp(mx.where(causal, diff, 0.0)), 0.0)
    kb = k * beta[..., None]
    A = mx.where(strict, (kb @ k.swapaxes(-1, -2)) * decay, 0.0)
    rhs = mx.concatenate([v * beta[..., None], kb * mx.exp(G)[..., None]], axis=-1)  # (.., C, Dv + Dk)
    X = unit_lower_inverse(A) @ rhs
    U, W = X[..., :Dv], X[..., Dv:]
    qd = q * mx.exp(G)[..., None]
    mix = (q @ k.swapaxes(-1, -2)) * decay  # (B, H, n, C, C), causal
    G_last = G[..., -1]  # (B, H, n)
    kd = k * mx.exp(G_last[..., None] - G)[..., None]
    out, S = scan(U, W, qd, kd, mix, G_last, S)
    out = out[:, :, :L]  # (B, H, L, Dv)
    return out.transpose(0, 2, 1, 3).astype(out_dtype), S


# ---------------------------------------------------------------------------------------------
# Magpie's local transformer: the draw chain of one decoder step (bodies/magpie_lt.body)


class MagpieLTWeights(NamedTuple):
    """A Magpie local transformer's weights, stacked for `magpie_lt_draws` (one dtype: bf16, f16 or f32).

    pos (P, D) learned positions (P >= n); ln (NL, 2, D) the two bias-free LayerNorms of each layer
    (self-attention's, feed-forward's); qkv (NL, 3 D, D) fused Q | K | V, each H heads x D / H; wo (NL, D, D);
    ff1 (NL, F, D); ff2 (NL, D, F); out_w (n, V, D), out_b (n, V) the n output heads; emb (n, V, d) the
    decoder's audio tables (code j's next input row is emb[j][code]); in_w (D, d), in_b (D,) the LT's
    in-projection, None where it is the identity (d == D); heads H."""

    pos: mx.array
    ln: mx.array
    qkv: mx.array
    wo: mx.array
    ff1: mx.array
    ff2: mx.array
    out_w: mx.array
    out_b: mx.array
    emb: mx.array
    heads: int
    in_w: Optional[mx.array] = None
    in_b: Optional[mx.array] = None


def _gelu_tanh(x):
    # torch's GELU(approximate="tanh") = mlx.nn.gelu_approx's formula
    return 0.5 * x * (1.0 + mx.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def magpie_lt_draws(h, w: MagpieLTWeights, bad, cfg_scale: float, temperature: float, top_k: int, state):
    """The n = out_w.shape[0] draws of one decoder step, in float32: h (R, d) the decoder states (R = 2:
    row 0 conditional, row 1 unconditional, logits scale * l0 + (1 - scale) * l1), bad (V,) additive mask.
    Draw j runs the LT (LayerNorm eps 1e-5, causal attention over the rows so far, GELU-tanh FFN, no final
    norm) on row j (in_proj(h) at j = 0, in_proj(emb[j-1][code]) after), plus pos[j], then samples with
    `sample` (top-k, temperature; argmax at temperature <= 0) at state [seed, counter + j].
    Returns (codes (n,) int32, next_state [seed, counter + n])."""
    f32 = mx.float32

    def f(a):
        return a.astype(f32)

    R = h.shape[0]
    n = w.out_w.shape[0]
    NL, _, D = w.qkv.shape
    H = int(w.heads)
    dh = D // H
    temp = max(0.0, float(temperature))
    keys = [[] for _ in range(NL)]
    values = [[] for _ in range(NL)]
    src = f(h)  # (R, d)
    codes = []
    for j in range(n):
        x = src @ f(w.in_w).T + f(w.in_b) if w.in_w is not None else src
        x = x + f(w.pos[j])  # (R, D)
        for li in range(NL):
            y = mx.fast.layer_norm(x, f(w.ln[li, 0]), None, 1e-5)
            q, k, v = (t.reshape(R, H, dh) for t in mx.split(y @ f(w.qkv[li]).T, 3, axis=-1))
            keys[li].append(k)
            values[li].append(v)
            K, Vv = mx.stack(keys[li], axis=1), mx.stack(values[li], axis=1)  # (R, j + 1, H, dh)
            s = mx.einsum("rhd,rthd->rht", q, K) * (dh ** -0.5)
            a = mx.einsum("rht,rthd->rhd", mx.softmax(s, axis=-1), Vv).reshape(R, D)
            x = x + a @ f(w.wo[li]).T
            y = mx.fast.layer_norm(x, f(w.ln[li, 1]), None, 1e-5)
            x = x + _gelu_tanh(y @ f(w.ff1[li]).T) @ f(w.ff2[li]).T
        lg = x @ f(w.out_w[j]).T + f(w.out_b[j])  # (R, V)
        lg = cfg_scale * lg[0] + (1.0 - cfg_scale) * lg[1] if R > 1 else lg[0]
        tok, _, state = sample((lg + f(bad))[None], temp, int(top_k), 1.0, 0.0, state)
        codes.append(tok)
        src = mx.broadcast_to(f(w.emb[j][tok]), (R, w.emb.shape[-1]))
    return mx.concatenate(codes).astype(mx.int32), state


# ----------------------------------------------------------------------------------------------
# Magpie TTS decoder step (docs/kernels.md, "Magpie decoder kernel")

MAGPIE_LN_EPS = 1e-5  # torch.nn.LayerNorm's default, which NeMo keeps
# float32's smallest normal number: NeMo adds it to the prior before multiplying it in
MAGPIE_TINY = float(np.finfo(np.float32).tiny)


class MagpieDecoderWeights(NamedTuple):
    """A Magpie decoder's weights stacked over its NL layers, all in one dtype T (the kernel's):
    pos_table (P, d) the learned positions, wqkv (NL, 3d, d) the fused self-attention projection (q | k |
    v rows), wo (NL, d, d), wxq (NL, XD, d) and wxo (NL, d, XD) the cross-attention's query and output
    projections (one head of width XD), wf1 (NL, F, d) and wf2 (NL, d, F) the feed-forward, norms (NL, 3,
    d) the LayerNorm weights (self, cross query, feed-forward), fnorm (d,) norm_out's, n_heads the
    self-attention heads. `metalgen.magpie.decoder_kernel.pack_decoder` makes one from a Model."""

    pos_table: mx.array
    wqkv: mx.array
    wo: mx.array
    wxq: mx.array
    wxo: mx.array
    wf1: mx.array
    wf2: mx.array
    norms: mx.array
    fnorm: mx.array
    n_heads: int

    @property
    def layers(self) -> int:
        return self.wqkv.shape[0]

    @property
    def d_model(self) -> int:
        return self.wqkv.shape[2]

    @property
    def xa_dim(self) -> int:
        return self.wxq.shape[1]

    @property
    def ffn(self) -> int:
        return self.wf1.shape[1]

    @property
    def dtype(self):
        return self.wqkv.dtype


def magpie_layer_flags(spec, n_layers: int) -> tuple:
    """A layer selection -> a tuple of n_layers bools: None is every layer; a sequence of n_layers bools
    is a mask; any other sequence lists layer indices."""
    if spec is None:
        return (True,) * n_layers
    spec = list(spec)
    if len(spec) == n_layers and all(isinstance(v, (bool, np.bool_)) for v in spec):
        return tuple(bool(v) for v in spec)
    chosen = {int(i) for i in spec}
    return tuple(i in chosen for i in range(n_layers))


def magpie_decoder_step(x, pos, kc, vc, mem_k, mem_v, mem_mask, prior, weights: MagpieDecoderWeights,
                        prior_layers=None, est_layers=None):
    """One Magpie decoder step for R rows (the CFG rows), in float32 with the activations rounded to the
    weights' dtype T wherever the MLX path stores T (the kernel rounds at the same points).

    x (R, d) or (R, 1, d): this step's input rows (before the position embedding); pos: the position
    written (int or int32 array); kc, vc (NL, R, H, C, d / H) the self-attention caches, updated in place
    at pos (item assignment: the caller's arrays see the write); mem_k, mem_v (NL, R, Lt, XD) the text's
    cross-attention keys and values; mem_mask (R, Lt) true / nonzero where the text is valid (None: all);
    prior (R, Lt) float32 or None (no prior anywhere); prior_layers, est_layers: the layers that apply
    the prior and those averaged into the alignment estimate (`magpie_layer_flags`; None: all).
    Returns (h (R, d) in T after norm_out, scores (Lt,) float32: row 0's prior-modified cross-attention
    probabilities averaged over the estimate layers; zeros when there are none)."""
    w = weights
    T = w.dtype
    f32 = mx.float32
    NL, R, H, C, dh = kc.shape
    d = w.d_model
    XD = w.xa_dim
    Lt = mem_k.shape[2]

    def rnd(a):
        return a.astype(T).astype(f32)

    def ln(v, wt):
        c = v - v.mean(axis=-1, keepdims=True)
        var = (c * c).mean(axis=-1, keepdims=True)
        return rnd(c * mx.rsqrt(var + MAGPIE_LN_EPS) * wt.astype(f32))

    def proj(v, W):
        return rnd(v @ W.astype(f32).T)

    pos = (pos if isinstance(pos, mx.array) else mx.array(int(pos))).astype(mx.int32).reshape(1)
    h = rnd(x.reshape(R, d).astype(f32) + mx.take(w.pos_table, pos, axis=0).astype(f32))
    valid = mx.arange(C) <= pos  # (C,): the positions written so far, this one included
    mm = mx.ones((R, Lt), dtype=mx.bool_) if mem_mask is None else mem_mask.astype(mx.bool_)
    pflags = magpie_layer_flags(prior_layers, NL) if prior is not None else (False,) * NL
    eflags = magpie_layer_flags(est_layers, NL)
    kc_new, vc_new = kc, vc
    est = []
    for l in range(NL):
        qkv = proj(ln(h, w.norms[l, 0]), w.wqkv[l])  # (R, 3d)
        q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(R, H, 1, dh) for i in range(3))
        start = mx.concatenate([mx.array([l], dtype=mx.int32), pos])
        kc_new = mx.slice_update(kc_new, k.astype(kc.dtype)[None], start, axes=(0, 3))
        vc_new = mx.slice_update(vc_new, v.astype(vc.dtype)[None], start, axes=(0, 3))
        s = (q @ kc_new[l].astype(f32).swapaxes(-1, -2)) * dh ** -0.5  # (R, H, 1, C)
        p = mx.softmax(mx.where(valid, s, -mx.inf), axis=-1)
        o = rnd((p @ vc_new[l].astype(f32)).reshape(R, d))
        h = rnd(h + proj(o, w.wo[l]))

        q = proj(ln(h, w.norms[l, 1]), w.wxq[l])  # (R, XD)
        s = (q[:, None, :] @ mem_k[l].astype(f32).swapaxes(-1, -2))[:, 0] * XD ** -0.5  # (R, Lt)
        p = mx.softmax(mx.where(mm, s, -mx.inf), axis=-1)
        if pflags[l]:
            p = p * (prior.astype(f32) + MAGPIE_TINY)
            p = p / p.sum(axis=-1, keepdims=True)
        p = mx.where(mm, p, 0.0)
        if eflags[l]:
            est.append(p[0])
        y = rnd((p[:, None, :] @ mem_v[l].astype(f32))[:, 0])  # (R, XD)
        h = rnd(h + proj(y, w.wxo[l]))

        f = proj(ln(h, w.norms[l, 2]), w.wf1[l])  # (R, F)
        u = 0.7978845608028654 * (f + 0.044715 * f * f * f)
        f = rnd(0.5 * f * (1.0 + mx.tanh(u)))
        h = rnd(h + proj(f, w.wf2[l]))
    out = ln(h, w.fnorm).astype(T)
    scores = mx.stack(est).mean(axis=0) if est else mx.zeros((Lt,), f32)
    kc[...] = kc_new
    vc[...] = vc_new
    return out, scores
