"""The stacked-weight decode algorithm in plain MLX ops (through kernels_metal's functions).

It runs on every backend, CPU included, and proves the stacking and cache indexing that the
fused and megakernel paths rely on against the model's own plain path; it is also the oracle of
the GPU paths' self-check. One token per call; many MLX operations per token (it is not fast).

`split_k=True` ("reference_v2") follows version 2 of the kernel body: o_proj and down as float32 sums
of K-slice partial products cut exactly as `mg_splitk_gemv` cuts them (`splitk_tasks`), rounded
once, the residual added afterwards; it proves that restructuring on the CPU.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

import kernels_metal as K

from .stacked import DecodeState, StackedWeights


GRID_WARPS = 264 * 8  # the megakernel's lane-groups on an H100/H200 (2 groups of 8 per multiprocessor)


def splitk_tasks(N: int, K: int, nw: int = GRID_WARPS) -> Tuple[int, List[Tuple[int, int]]]:
    """The K slices [k0, k1) of every row in kernels_metal/preludes/decode.h mg_splitk_gemv
    (per = clamp(ceil(N*K/8 / (32 nw)), 1, 4) loads a lane, slices of 256 * per), and the task count."""
    lanes = nw * 32
    per = min(4, max(1, -(-(N * (K // 8)) // lanes)))
    kt = 256 * per
    nk = -(-K // kt)
    return N * nk, [(i * kt, min(K, (i + 1) * kt)) for i in range(nk)]


def splitk_linear(x: mx.array, w: mx.array, nw: int = GRID_WARPS) -> mx.array:
    """x @ w.T as float32 partial sums over the kernel's K slices, rounded once to w.dtype."""
    _, slices = splitk_tasks(w.shape[0], w.shape[1], nw)
    xf, wf = x.astype(mx.float32), w.astype(mx.float32)
    acc = None
    for k0, k1 in slices:
        p = xf[..., k0:k1] @ wf[:, k0:k1].T
        acc = p if acc is None else acc + p
    return acc.astype(w.dtype)


class ReferenceDecoder:
    name = "reference"

    def __init__(self, weights: StackedWeights, split_k: bool = False):
        self.w = weights
        self.split_k = split_k
        if split_k:
            self.name = "reference_v2"

    def prepare(self, state: DecodeState) -> DecodeState:
        return state

    def _arrays(self, name: str) -> mx.array:
        w, m = self.w, self.w.moe
        return {"embed": w.embed, "wqkv": w.wqkv, "wo": w.wo, "wgu": w.wgu, "wd": w.wd}.get(name) if m is None or \
            name in ("embed", "wqkv", "wo", "wgu", "wd") else getattr(m, name)

    def _quant(self, name: str):
        """(scales, biases, group size, bits) of a stacked array, or None where it is dense."""
        q = self.w.quant
        if q is None:
            return None
        gate = name in ("wr", "wsg")
        bits, gs = (q.gate_bits, q.gate_group_size) if gate else (q.bits, q.group_size)
        return (*q.params[name], gs, bits) if bits else None

    def _linear(self, name: str, index, x: mx.array, bias=None) -> mx.array:
        """x @ W.T for the rows `index` (a tuple index) of the stacked array `name`, dense or quantized,
        as the plain path's Linear / QuantizedLinear computes it."""
        q = self._quant(name)
        w = self._arrays(name)[index]
        if q is None:
            return K.linear(x, w, bias)
        s, b, gs, bits = q
        return K.quantized_linear(x, w, s[index], b[index], gs, bits, bias=bias)

    def _experts(self, name: str, s: int) -> K.Experts:
        q = self._quant(name)
        w = self._arrays(name)[s, ...]
        if q is None:
            return K.Experts(w)
        sc, b, gs, bits = q
        return K.Experts(w, sc[s, ...], b[s, ...], gs, bits)

    def step(self, state: DecodeState, token: Optional[mx.array] = None,
             embedding: Optional[mx.array] = None) -> mx.array:
        """Run one token (token id (1,) int32, or an embedding (H,) / (1, H)) at `state.pos` and
        return the final-norm hidden state (1, H). Advances state.pos."""
        w = self.w
        H, Hq, Hkv, D, eps = w.hidden, w.heads, w.kv_heads, w.head_dim, w.eps
        QD, KD = w.q_dim, w.kv_dim
        pos = state.pos
        if pos >= state.capacity:
            raise ValueError(f"decode position {pos} is past the cache capacity {state.capacity}")
        if self.split_k and w.quant is not None:
            raise ValueError("the split-K reference is dense only")
        if embedding is None:
            if not w.vocab:
                raise ValueError("this stack has no token embedding: pass an embedding")
            tok = token.reshape(-1)[:1]
            q = self._quant("embed")
            h = w.embed[tok] if q is None else mx.dequantize(w.embed[tok], q[0][tok], q[1][tok], group_size=q[2],
                                                             bits=q[3])
        else:
            h = embedding.reshape(1, H).astype(w.dtype)
        h = h.reshape(1, 1, H)
        table = w.rope_table
        for l in range(w.layers):
            x = K.rms_norm(h, w.norms[l, 0], eps)
            qkv = self._linear("wqkv", (l, ...), x, w.bqkv[l] if w.has_bias else None)
            q = qkv[..., :QD].reshape(1, 1, Hq, D)
            k = qkv[..., QD:QD + KD].reshape(1, 1, Hkv, D)
            v = qkv[..., QD + KD:].reshape(1, 1, Hkv, D)
            if w.qk_norm:
                q = K.rms_norm(q, w.qkn[l, 0], eps)
                k = K.rms_norm(k, w.qkn[l, 1], eps)
            q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
            q = K.rope(q, table, pos)
            k = K.rope(k, table, pos)
            state.kc[l, :, pos:pos + 1, :] = k[0]
            state.vc[l, :, pos:pos + 1, :] = v[0]
            o = K.decode_attention(q, state.kc[l:l + 1], state.vc[l:l + 1], pos + 1, D**-0.5)
            o = o.transpose(0, 2, 1, 3).reshape(1, 1, QD)
            h = h + (splitk_linear(o, w.wo[l]) if self.split_k else self._linear("wo", (l, ...), o))
            x = K.rms_norm(h, w.norms[l, 1], eps)
            m = w.moe
            if m is not None and l in m.sparse_layers:
                h = h + self._sparse(x.reshape(1, H), m, m.sparse_layers.index(l)).reshape(1, 1, H)
                continue
            d = l if m is None else l - sum(1 for i in m.sparse_layers if i < l)  # ordinal among dense layers
            g = self._linear("wgu", (d, 0), x)
            u = self._linear("wgu", (d, 1), x)
            a = nn.silu(g) * u
            h = h + (splitk_linear(a, w.wd[d, ...]) if self.split_k else self._linear("wd", (d, ...), a))
        state.pos = pos + 1
        return K.rms_norm(h, w.fnorm, eps).reshape(1, H)

    def _sparse(self, x: mx.array, m, s: int) -> mx.array:
        """A sparse layer's feed-forward (the plain path's SparseMoeBlock on the stacks): x (1, H)."""
        scores, inds = K.moe_route(self._linear("wr", (s, ...), x), m.top_k, m.norm_topk)
        y = K.moe_experts(x, inds, scores, self._experts("wgx", s), self._experts("wux", s), self._experts("wdx", s))
        if m.shared:
            a = nn.silu(self._linear("wsgu", (s, 0), x)) * self._linear("wsgu", (s, 1), x)
            y = y + mx.sigmoid(self._linear("wsg", (slice(s, s + 1),), x)) * self._linear("wsd", (s, ...), a)
        return y
