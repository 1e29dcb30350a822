"""Magpie's decoder step on the fused kernel (`kernels_metal.magpie_decoder_step`, docs/kernels.md
"Magpie decoder kernel").

The frame loop (metalgen.magpie.frames) keeps its self-attention caches in the kernel's stacked
layout from the prefill on: `FrameLoop.prefill` runs the MLX decoder over the prompt rows as
before, then copies its per-layer caches once into two stacked buffers (NL, R, H, C, dh) that the
kernel writes in place, step after step, and gathers the text's per-layer cross-attention keys and
values into (NL, R, Lt, XD) (`StackedMemory`). The weights are stacked once per model
(`pack_decoder`, cached).

The kernel serves GPU backends only (`decoder_kernel(model)` is None on the CPU, or for a decoder
it cannot take: quantized, several cross-attention heads, a feed-forward kernel wider than 1); the
frame loop then keeps its eager MLX path. MG_MAGPIE_DECODER_KERNEL=0 turns the kernel off.
"""

from __future__ import annotations

import os
import weakref
from typing import List, NamedTuple, Optional, Sequence, Tuple

import mlx.core as mx

import kernels_metal as K
from kernels_metal.reference import MagpieDecoderWeights

from ..cache import KVCache

_PACKED = {}  # id(model) -> (weak reference to the model, MagpieDecoderWeights or None)


def _weight(linear) -> Optional[mx.array]:
    """A plain Linear's weight (out, in), or None for anything else (a quantized layer)."""
    w = linear.get("weight") if hasattr(linear, "get") else None
    if w is None or "scales" in linear or w.ndim != 2:
        return None
    return w


def pack_decoder(model, dtype=None) -> Optional[MagpieDecoderWeights]:
    """The decoder of `model` (metalgen.models.magpie.model.Model) stacked for the kernel, in `dtype`
    (default: the decoder's own), or None where the kernel cannot take it. Stacked once per model and
    dtype; later calls return the same arrays."""
    key = (id(model), None if dtype is None else str(dtype))
    got = _PACKED.get(key)
    if got is not None and got[0]() is model:
        return got[1]
    packed = _pack(model, dtype)
    _PACKED[key] = (weakref.ref(model), packed)
    weakref.finalize(model, _PACKED.pop, key, None)
    return packed


def _pack(model, dtype) -> Optional[MagpieDecoderWeights]:
    dec = model.decoder
    a = dec.args
    if (not a.has_xattn or a.kernel_size != 1 or (a.xa_n_heads or 1) != 1 or "position_embeddings" not in dec
            or "norm_out" not in dec):
        return None
    rows = {n: [] for n in ("wqkv", "wo", "wxq", "wxo", "wf1", "wf2", "norms")}
    for layer in dec.layers:
        sa, xa, ff = layer.self_attention, layer.cross_attention, layer.pos_ff
        ws = [_weight(sa.qkv_net), _weight(sa.o_net), _weight(xa.q_net), _weight(xa.o_net),
              _weight(ff.proj.conv), _weight(ff.o_net.conv)]
        if any(w is None for w in ws):
            return None
        for n, w in zip(("wqkv", "wo", "wxq", "wxo", "wf1", "wf2"), ws):
            rows[n].append(w)
        rows["norms"].append(mx.stack([layer.norm_self.weight, layer.norm_xattn_query.weight,
                                       layer.norm_pos_ff.weight]))
    T = dtype or rows["wqkv"][0].dtype
    st = {n: mx.stack(v).astype(T) for n, v in rows.items()}
    w = MagpieDecoderWeights(pos_table=dec.position_embeddings.weight.astype(T), fnorm=dec.norm_out.weight.astype(T),
                             n_heads=a.sa_n_heads, **st)
    mx.eval(*[v for v in w if isinstance(v, mx.array)])
    return w


def decoder_kernel(model) -> Optional[MagpieDecoderWeights]:
    """The packed weights when the frame loop should step the decoder on the kernel: a GPU backend, a
    decoder the kernel takes, and MG_MAGPIE_DECODER_KERNEL not "0"; else None (the eager MLX path)."""
    if os.environ.get("MG_MAGPIE_DECODER_KERNEL", "1") == "0" or K.backend() == "cpu":
        return None
    return pack_decoder(model)


def stack_caches(caches: Sequence[KVCache], capacity: int) -> Tuple[mx.array, mx.array]:
    """Per-layer caches (each (R, H, *, dh), `offset` positions valid, all alike) -> the kernel's stacked
    (NL, R, H, capacity, dh) keys and values, zero past the offset; evaluated, so that the kernel's
    in-place writes land in these buffers."""
    n = int(caches[0].offset)
    if n > capacity:
        raise ValueError(f"a stacked cache of {capacity} positions cannot hold {n}")
    pad = [(0, 0)] * 3 + [(0, capacity - n), (0, 0)]
    kc = mx.pad(mx.stack([c.keys[..., :n, :] for c in caches]), pad)
    vc = mx.pad(mx.stack([c.values[..., :n, :] for c in caches]), pad)
    mx.eval(kc, vc)
    return kc, vc


class StackedMemory(NamedTuple):
    """The text side of one utterance in the kernel's layout: keys, values (NL, R, Lt, XD), the memory
    mask (R, Lt) float32, the packed weights, the kernel's scratch, and the per-layer list it came from
    (`Model.decoder_memory`'s, which the MLX prefill reads)."""

    keys: mx.array
    values: mx.array
    mask: mx.array
    weights: MagpieDecoderWeights
    scratch: Optional[mx.array]
    layers: List[Tuple[mx.array, mx.array]]

    @classmethod
    def make(cls, weights: MagpieDecoderWeights, memory_kv, memory_mask) -> "StackedMemory":
        """From `Model.decoder_memory`'s per-layer (k, v), each (R, 1, Lt, XD), and the mask (R, Lt)."""
        T = weights.dtype
        keys = mx.stack([k[:, 0] for k, _ in memory_kv]).astype(T)
        values = mx.stack([v[:, 0] for _, v in memory_kv]).astype(T)
        R, Lt = keys.shape[1], keys.shape[2]
        mask = mx.ones((R, Lt), mx.float32) if memory_mask is None else memory_mask.astype(mx.float32)
        scratch = K.make_magpie_decoder_scratch(weights, R, Lt)
        mx.eval(keys, values, mask)
        return cls(keys, values, mask, weights, scratch, list(memory_kv))


def kernel_step(x, prior, offset, kc, vc, memory: StackedMemory, prior_layers=None, est_layers=None):
    """One decoder step on the kernel: x (R, 1, d) or (R, d) at position `offset`, prior (R, 1, Lt) or
    (R, Lt) or None, kc / vc the stacked caches (written in place) -> (h (R, d), scores (Lt,)).
    prior_layers / est_layers: layer indices (None: all)."""
    R = kc.shape[1]
    p = None if prior is None else prior.reshape(R, -1)
    pl = None if prior_layers is None else sorted(prior_layers)
    return K.magpie_decoder_step(x.reshape(R, -1), offset, kc, vc, memory.keys, memory.values, memory.mask, p,
                                 memory.weights, pl, est_layers, memory.scratch)
