"""Per-layer weights of a loaded CausalLM stacked into a few big arrays, once per model.

The fused and megakernel decode paths take every layer's weights as a handful of inputs:
wqkv (L, QKV, H) (q, k, v rows concatenated), bqkv (L, QKV), qkn (L, 2, D) (q_norm, k_norm),
wo (L, H, Hq*D), wgu (L, 2, I, H) (gate, up), wd (L, H, I), norms (L, 2, H) (input and
post-attention norms), plus the embedding, the final norm and the RoPE table.

`stack_weights(model, rebind=True)` then points the model's own per-layer parameters at views
of the stacked arrays, so the plain path (prefill) and the stacked paths share one copy of the
weights and memory does not double.

MoE models (`MoeStacks`): wgu and wd hold the dense layers only (by their ordinal among dense
layers); the sparse layers' routers wr (Ls, E, H), experts wgx, wux (Ls, E, MI, H) and wdx
(Ls, E, H, MI) (the model's own expert stacks, made at load) and shared experts wsgu (Ls, 2, SI, H),
wsd (Ls, H, SI), wsg (Ls, H) are indexed by the ordinal among sparse layers; ltab (L, 2) int32 says per
layer (sparse?, ordinal).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import mlx.core as mx

from ..models.layers import QuantizedLinear
from ..models.moe import QuantizedSwitchLinear, stack_sparse_layers


@dataclasses.dataclass
class MoeStacks:
    """The sparse layers' weights of an MoE decoder, stacked (see the module doc)."""

    experts: int
    top_k: int
    inter: int  # per expert
    shared: int  # the shared expert's intermediate size, 0: none
    norm_topk: bool
    sparse_layers: tuple
    ltab: mx.array
    wr: mx.array
    wgx: mx.array
    wux: mx.array
    wdx: mx.array
    wsgu: mx.array
    wsd: mx.array
    wsg: mx.array

    @property
    def arrays(self):
        return (self.ltab, self.wr, self.wgx, self.wux, self.wdx, self.wsgu, self.wsd, self.wsg)


@dataclasses.dataclass
class StackedWeights:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int  # 0: no token embedding (a stack fed embeddings only)
    eps: float
    has_bias: bool
    qk_norm: bool
    dtype: mx.Dtype
    embed: mx.array
    wqkv: mx.array
    bqkv: mx.array
    qkn: mx.array
    wo: mx.array
    wgu: mx.array
    wd: mx.array
    norms: mx.array
    fnorm: mx.array
    rope_table: object  # kernels_metal RopeTable (cos, sin, max_positions)
    moe: Optional[MoeStacks] = None

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    @property
    def nbytes(self) -> int:
        arrays = (self.embed, self.wqkv, self.bqkv, self.qkn, self.wo, self.wgu, self.wd, self.norms,
                  self.fnorm) + (self.moe.arrays if self.moe is not None else ())
        return sum(a.nbytes for a in arrays)


def _stack_of(model):
    """The layer stack (a DecoderModel) of a CausalLM, or the DecoderModel itself."""
    return model.model if hasattr(model, "model") and hasattr(model.model, "layers") else model


def unsupported_reason(model) -> Optional[str]:
    """Why the stacked paths cannot run this model (None if they can). `model` is a CausalLM or
    a bare DecoderModel (the speech talker and code predictor, fed embeddings)."""
    stack = _stack_of(model)
    layers = stack.layers
    if not layers:
        return "the model has no layers"
    for layer in layers:
        mlp = layer.mlp
        lins = [layer.self_attn.q_proj, layer.self_attn.o_proj]
        if "switch_mlp" in mlp:
            lins += [mlp.gate, mlp.switch_mlp.gate_proj] + ([mlp.shared_expert.gate_proj] if "shared_expert" in mlp else [])
        else:
            lins.append(mlp.gate_proj)
        if any(isinstance(lin, (QuantizedLinear, QuantizedSwitchLinear)) for lin in lins):
            return "quantized weights (the stacked paths are dense only)"
    moe = stack.spec.moe
    if moe is not None:
        if moe.intermediate_size % 8 or moe.shared_intermediate_size % 8:
            return "expert intermediate sizes not divisible by 8"
        st = stack._expert_stacks
        if st is None and len({tuple(layers[i].mlp.switch_mlp.gate_proj.weight.shape)
                               for i in moe.sparse_layers}) != 1:
            return "sparse layers with different expert shapes"
    if "lm_head" in model and isinstance(model.lm_head, QuantizedLinear):
        return "a quantized LM head"
    embed = getattr(_stack_of(model), "embed_tokens", None)
    if embed is not None and not hasattr(embed, "weight"):  # pragma: no cover - defensive
        return "an unexpected embedding"
    return None


def stack_weights(model, rebind: bool = True) -> StackedWeights:
    """Stack the per-layer weights of `model` (see the module doc): a CausalLM, or a bare
    DecoderModel without a token embedding, whose decode steps then take embeddings only (the
    stacked `embed` is a one-row placeholder the kernels never read)."""
    reason = unsupported_reason(model)
    if reason:
        raise ValueError(f"cannot stack this model's weights: {reason}")
    stack = _stack_of(model)
    spec = stack.spec
    layers = stack.layers
    attn0 = layers[0].self_attn
    H, L = spec.hidden_size, len(layers)
    Hq, Hkv, D = attn0.n_heads, attn0.n_kv_heads, attn0.head_dim
    QD, KD = Hq * D, Hkv * D
    has_bias = "bias" in attn0.q_proj
    qk_norm = "q_norm" in attn0
    dtype = attn0.q_proj.weight.dtype

    moe = spec.moe
    sparse = set(moe.sparse_layers) if moe is not None else set()
    dense = [i for i in range(L) if i not in sparse]

    def stk(f, which=None):
        chosen = layers if which is None else [layers[i] for i in which]
        return mx.stack([f(layer) for layer in chosen])

    wqkv = stk(lambda y: mx.concatenate([y.self_attn.q_proj.weight, y.self_attn.k_proj.weight,
                                         y.self_attn.v_proj.weight], axis=0))
    bqkv = (stk(lambda y: mx.concatenate([y.self_attn.q_proj.bias, y.self_attn.k_proj.bias,
                                          y.self_attn.v_proj.bias])) if has_bias else mx.zeros((1,), dtype))
    qkn = (stk(lambda y: mx.stack([y.self_attn.q_norm.weight, y.self_attn.k_norm.weight]))
           if qk_norm else mx.zeros((1,), dtype))
    wo = stk(lambda y: y.self_attn.o_proj.weight)
    # the dense feed-forwards, by their ordinal among dense layers (a placeholder the kernels never
    # read when every layer is sparse)
    wgu = stk(lambda y: mx.stack([y.mlp.gate_proj.weight, y.mlp.up_proj.weight]), dense) if dense else mx.zeros((1,), dtype)
    wd = stk(lambda y: y.mlp.down_proj.weight, dense) if dense else mx.zeros((1,), dtype)
    norms = stk(lambda y: mx.stack([y.input_layernorm.weight, y.post_attention_layernorm.weight]))
    embed_tokens = getattr(stack, "embed_tokens", None)
    embed = embed_tokens.weight if embed_tokens is not None else mx.zeros((1, H), dtype)
    arrays = [wqkv, bqkv, qkn, wo, wgu, wd, norms, embed]
    moe_stacks = _stack_moe(stack, moe, dense, dtype) if moe is not None else None
    if moe_stacks is not None:
        arrays += [moe_stacks.ltab, moe_stacks.wr, moe_stacks.wsgu, moe_stacks.wsd, moe_stacks.wsg]
    mx.eval(arrays)
    if rebind:
        views = []
        for l, layer in enumerate(layers):
            a, m = layer.self_attn, layer.mlp
            a.q_proj["weight"] = wqkv[l, :QD]
            a.k_proj["weight"] = wqkv[l, QD:QD + KD]
            a.v_proj["weight"] = wqkv[l, QD + KD:]
            if has_bias:
                a.q_proj["bias"] = bqkv[l, :QD]
                a.k_proj["bias"] = bqkv[l, QD:QD + KD]
                a.v_proj["bias"] = bqkv[l, QD + KD:]
            if qk_norm:
                a.q_norm["weight"] = qkn[l, 0]
                a.k_norm["weight"] = qkn[l, 1]
            # `wo[l, ...]` is a view; a bare integer index would gather a copy (memory would double)
            a.o_proj["weight"] = wo[l, ...]
            if l not in sparse:
                d = dense.index(l)
                m.gate_proj["weight"] = wgu[d, 0]
                m.up_proj["weight"] = wgu[d, 1]
                m.down_proj["weight"] = wd[d, ...]
                views += [m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight]
            layer.input_layernorm["weight"] = norms[l, 0]
            layer.post_attention_layernorm["weight"] = norms[l, 1]
            views += [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight]
        if moe_stacks is not None:
            views += _rebind_moe(stack, moe_stacks)
        mx.eval(views)
    return StackedWeights(
        hidden=H, layers=L, heads=Hq, kv_heads=Hkv, head_dim=D, inter=spec.intermediate_size,
        vocab=spec.vocab_size if embed_tokens is not None else 0, eps=float(spec.rms_norm_eps),
        has_bias=has_bias, qk_norm=qk_norm, dtype=dtype, embed=embed, wqkv=wqkv, bqkv=bqkv, qkn=qkn,
        wo=wo, wgu=wgu, wd=wd, norms=norms, fnorm=stack.norm.weight, rope_table=attn0._rope.table,
        moe=moe_stacks)


def _stack_moe(stack, moe, dense, dtype) -> MoeStacks:
    """The sparse layers' stacks: the routers and shared experts stacked here, the experts taken from
    the model's own stacks (made at load), or stacked now if the model has none (a model built in
    memory, or whose expert weights were replaced since)."""
    layers = stack.layers
    sp = list(moe.sparse_layers)
    ltab = mx.array([[1, sp.index(i)] if i in sp else [0, dense.index(i)] for i in range(len(layers))], mx.int32)
    experts = stack.expert_stacks()
    if experts is None:

        def current(layer, key):
            proj, param = key.split(".")
            return layers[layer].mlp.switch_mlp[proj][param]

        stack._expert_stacks = experts = stack_sparse_layers(stack, moe, current)
    wr = mx.stack([layers[i].mlp.gate.weight for i in sp])
    if moe.shared_intermediate_size:
        wsgu = mx.stack([mx.stack([layers[i].mlp.shared_expert.gate_proj.weight,
                                   layers[i].mlp.shared_expert.up_proj.weight]) for i in sp])
        wsd = mx.stack([layers[i].mlp.shared_expert.down_proj.weight for i in sp])
        wsg = mx.concatenate([layers[i].mlp.shared_expert_gate.weight for i in sp])  # (Ls, H)
    else:
        wsgu = wsd = wsg = mx.zeros((1,), dtype)
    a = experts.arrays
    return MoeStacks(moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_intermediate_size,
                     moe.norm_topk_prob, tuple(sp), ltab, wr, a["gate_proj.weight"], a["up_proj.weight"],
                     a["down_proj.weight"], wsgu, wsd, wsg)


def _rebind_moe(stack, m: MoeStacks) -> list:
    """Point the sparse layers' routers and shared experts at views of the stacks (the experts are
    views already)."""
    views = []
    for s, i in enumerate(m.sparse_layers):
        blk = stack.layers[i].mlp
        blk.gate["weight"] = m.wr[s, ...]
        views.append(blk.gate.weight)
        if m.shared:
            sh = blk.shared_expert
            sh.gate_proj["weight"] = m.wsgu[s, 0]
            sh.up_proj["weight"] = m.wsgu[s, 1]
            sh.down_proj["weight"] = m.wsd[s, ...]
            blk.shared_expert_gate["weight"] = m.wsg[s:s + 1]
            views += [sh.gate_proj.weight, sh.up_proj.weight, sh.down_proj.weight, blk.shared_expert_gate.weight]
    return views


@dataclasses.dataclass
class DecodeState:
    """The KV cache of one generation in the stacked layout (L, kv_heads, capacity, D), the
    position of the next token, and the GPU paths' float32 scratch. The GPU kernels update kc, vc
    and scratch in place."""

    kc: mx.array
    vc: mx.array
    pos: int
    capacity: int
    scratch: Optional[mx.array] = None
    dep: Optional[mx.array] = None  # the GPU paths' last launch on this state (its ordering edge)

    def reset(self) -> None:
        """Start again at position 0 (the old entries are overwritten before they are read)."""
        self.pos = 0


def empty_state(w: StackedWeights, capacity: int) -> DecodeState:
    """A zeroed stacked cache of `capacity` positions, at position 0 (the GPU kernels write into
    its arrays in place, so they are two buffers, made here)."""
    shape = (w.layers, w.kv_heads, capacity, w.head_dim)
    kc, vc = mx.zeros(shape, w.dtype), mx.zeros(shape, w.dtype)
    mx.eval(kc, vc)
    return DecodeState(kc, vc, 0, capacity)


def stacked_cache(w: StackedWeights, cache, length: int, capacity: int) -> DecodeState:
    """Copy the first `length` positions of per-layer KVCaches (filled by the plain prefill) into a
    fresh stacked cache of `capacity` positions."""
    L, Hkv, D = w.layers, w.kv_heads, w.head_dim
    pad = capacity - length
    out = []
    for name in ("keys", "values"):
        parts = [mx.stack([getattr(c, name)[0, :, :length] for c in cache])] if length else []
        if pad:
            parts.append(mx.zeros((L, Hkv, pad, D), w.dtype))
        a = mx.concatenate(parts, axis=2) if len(parts) > 1 else parts[0]
        out.append(a.astype(w.dtype))
    mx.eval(out)
    return DecodeState(out[0], out[1], length, capacity)
