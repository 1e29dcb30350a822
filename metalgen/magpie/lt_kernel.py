"""Magpie's local-transformer draws of one decoder step as one fused kernel (kernels_metal.magpie_lt_draws).

`pack_lt(model)` stacks a `metalgen.models.magpie.model.Model`'s LT weights once into the kernel's
container (`kernels_metal.MagpieLTWeights`) with its working memory; `draw_codes(packed, h, bad, sampling,
state)` then draws the C * S codes of a step in one call, the same draws as `StepGraph.draw`'s eager loop
(`Model.local_step` / `local_embed` and a `DeviceSampler` call per code at the state's successive
counters) up to float rounding (the kernel computes in float32). `lt_kernel(model)` is what the frame loop
asks for: the weights stacked once per model, a scratch per loop, None on the CPU. docs/kernels.md, "Magpie local
transformer kernel", has the kernel's phases and figures.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Dict, Optional, Tuple

import mlx.core as mx

import kernels_metal as K

from ..errors import MetalgenError


@dataclasses.dataclass
class PackedLT:
    """The stacked LT weights (`weights`), the kernel's scratch (None on the CPU backend: the reference
    needs none) and the draw count n = C * S."""

    weights: K.MagpieLTWeights
    scratch: Optional[tuple]
    n: int


def _w(linear) -> mx.array:
    if "scales" in linear:
        raise MetalgenError("the fused Magpie LT kernel takes dense weights (this LT is quantized)")
    return linear["weight"]


def pack_lt(model, dtype=None) -> PackedLT:
    """Stack `model`'s local transformer (autoregressive, kernel-1 feed-forward, no cross-attention, no
    final norm: NeMo's Magpie LT) into a `PackedLT`, every array in `dtype` (default: the LT's own)."""
    a = model.args
    if "local_transformer" not in model or a.local_transformer_type != "autoregressive":
        raise MetalgenError("Magpie LT kernel: the model has no autoregressive local transformer")
    lt = model.local_transformer
    la = lt.args
    if la.kernel_size != 1 or la.has_xattn or "norm_out" in lt:
        raise MetalgenError("Magpie LT kernel: only kernel-1, self-attention-only LTs without a final norm")
    layers = lt.layers
    dt = dtype or _w(layers[0].self_attention.qkv_net).dtype
    D = la.d_model
    n = a.n_heads_out

    def stack(xs):
        return mx.stack(xs).astype(dt)

    pos = (lt.position_embeddings.weight if "position_embeddings" in lt else mx.zeros((n, D))).astype(dt)
    weights = K.MagpieLTWeights(
        pos=pos,
        ln=stack([mx.stack([L.norm_self.weight, L.norm_pos_ff.weight]) for L in layers]),  # (NL, 2, D)
        qkv=stack([_w(L.self_attention.qkv_net) for L in layers]),  # (NL, 3 D, D)
        wo=stack([_w(L.self_attention.o_net) for L in layers]),  # (NL, D, D)
        ff1=stack([_w(L.pos_ff.proj.conv) for L in layers]),  # (NL, F, D)
        ff2=stack([_w(L.pos_ff.o_net.conv) for L in layers]),  # (NL, D, F)
        out_w=stack([_w(p) for p in model.local_transformer_out_projections]),  # (n, V, D)
        out_b=stack([p["bias"] for p in model.local_transformer_out_projections]),  # (n, V)
        emb=stack([e.weight for e in model.audio_embeddings[:n]]),  # (n, V, d)
        heads=int(la.sa_n_heads),
        in_w=(_w(model.local_transformer_in_projection).astype(dt)
              if "local_transformer_in_projection" in model else None),
        in_b=(model.local_transformer_in_projection["bias"].astype(dt)
              if "local_transformer_in_projection" in model else None),
    )
    if pos.shape[0] < n:
        raise MetalgenError(f"Magpie LT kernel: {n} draws need {n} learned positions, the LT has {pos.shape[0]}")
    mx.eval([x for x in weights if isinstance(x, mx.array)])
    return PackedLT(weights, K.make_magpie_lt_scratch(weights), n)


_PACKS: Dict[int, Optional[K.MagpieLTWeights]] = {}


def lt_kernel(model) -> Optional[PackedLT]:
    """The LT packed for the frame loop's draws on the fused kernel, with working memory of its own
    (launches that share a scratch must be chained, and two utterances' loops are not), or None where
    the loop keeps its eager MLX draws: on the CPU backend, or for an LT the kernel does not take.
    The weights are stacked once per model."""
    if K.backend() == "cpu":
        return None
    key = id(model)
    if key not in _PACKS:
        try:
            weights = pack_lt(model).weights
        except MetalgenError:
            weights = None  # quantized, a final norm, ...: the eager path
        _PACKS[key] = weights
        weakref.finalize(model, _PACKS.pop, key, None)
    weights = _PACKS[key]
    if weights is None:
        return None
    return PackedLT(weights, K.make_magpie_lt_scratch(weights), int(weights.out_w.shape[0]))


def draw_codes(packed: PackedLT, h: mx.array, bad: mx.array, sampling, state: mx.array,
               cfg: Optional[bool] = None) -> Tuple[mx.array, mx.array]:
    """The step's n draws: h (rows, d) decoder states (rows 2 with CFG: conditional, unconditional), bad
    (V,) additive mask, `sampling` a MagpieSampling (temperature <= 0: argmax; top_k; cfg_scale), state the
    sampler's [seed, counter, padding] -> (codes (n,) int32 in draw order j = frame * C + codebook, next_state
    [seed, counter + n, padding]). `cfg` defaults to rows == 2."""
    rows = h.shape[0]
    use_cfg = rows > 1 if cfg is None else bool(cfg)
    if use_cfg and rows != 2:
        raise MetalgenError("Magpie LT kernel: CFG takes 2 rows (conditional, unconditional)")
    x = h if use_cfg else h[:1]
    return K.magpie_lt_draws(x, packed.weights, bad, float(sampling.cfg_scale), max(0.0, float(sampling.temperature)),
                             int(sampling.top_k), state, packed.scratch)
