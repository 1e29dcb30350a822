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

Hybrid Gated DeltaNet stacks (Qwen3-Next, Qwen3.5): `hybrid_stacks.py` (`StackedWeights.hybrid`).

MLX-quantized models (`QuantStacks`): the same arrays hold the packed uint32 words (rows of K * bits / 32),
and each has its scales and biases stacked alike; one bits and group size for everything the kernels
read, but the routers and shared experts' gates (their own: mlx_lm.convert keeps them at 8 bits).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import mlx.core as mx

from ..models.moe import EXPERT_BITS, EXPERT_GROUP_SIZES, stack_sparse_layers
from . import hybrid_stacks
from .hybrid_stacks import HybridStacks


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
class QuantStacks:
    """The quantization of a stack: bits and group size of the weights, of the gates (routers, shared
    experts' gates), and each quantized array's (scales, biases) by its name (kernels_metal.source's
    QUANT_MOE_WEIGHTS)."""

    bits: int
    group_size: int
    gate_bits: int
    gate_group_size: int
    params: Dict[str, Tuple[mx.array, mx.array]]


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
    quant: Optional[QuantStacks] = None
    hybrid: Optional[HybridStacks] = None

    @property
    def kv_layers(self) -> int:
        """The layers with a KV cache (a hybrid stack's attention layers)."""
        return len(self.hybrid.attn_layers) if self.hybrid is not None else self.layers

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
        if self.hybrid is not None:
            arrays += self.hybrid.arrays
        if self.quant is not None:
            arrays += tuple(a for pair in self.quant.params.values() for a in pair)
        return sum(a.nbytes for a in arrays)


def _stack_of(model):
    """The layer stack (a DecoderModel) of a CausalLM, or the DecoderModel itself."""
    return model.model if hasattr(model, "model") and hasattr(model.model, "layers") else model


def _quantized(m) -> Optional[Tuple[int, int]]:
    """(bits, group_size) of an MLX-quantized layer (Linear, Embedding or experts), None if dense."""
    return (int(m.bits), int(m.group_size)) if "scales" in m else None


def _weight_layers(stack):
    """The layers whose weights the decode kernels read, as (main, gates): attention, dense feed-forwards,
    experts, shared experts and the token embedding; the routers and shared experts' gates."""
    main, gates = [], []
    hybrid = stack.spec.hybrid is not None
    if hybrid:
        main += hybrid_stacks.weight_modules(stack)
    for layer in stack.layers:
        m = layer.mlp
        if not hybrid:
            a = layer.self_attn
            main += [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
        if "switch_mlp" in m:
            main += [m.switch_mlp.gate_proj, m.switch_mlp.up_proj, m.switch_mlp.down_proj]
            gates.append(m.gate)
            if "shared_expert" in m:
                main += [m.shared_expert.gate_proj, m.shared_expert.up_proj, m.shared_expert.down_proj]
                gates.append(m.shared_expert_gate)
        elif not hybrid:
            main += [m.gate_proj, m.up_proj, m.down_proj]
    if "embed_tokens" in stack:
        main.append(stack.embed_tokens)
    return main, gates


def quantization_of(model) -> Tuple[Optional[str], Optional[Tuple[int, int]], Optional[Tuple[int, int]]]:
    """(why the kernels cannot read this model's weights or None, (bits, group size) of its weights or
    None if dense, of its gates or None). The kernels take one quantization for all the weights (and one
    for the gates), 4 or 8 bits with group size 32, 64 or 128, scales in the activations' dtype."""
    stack = _stack_of(model)
    main, gates = _weight_layers(stack)
    dtype = stack.layers[0].input_layernorm.weight.dtype
    found = []
    for what, mods in (("weights", main), ("routers", gates)):
        kinds = {_quantized(m) for m in mods}
        if len(kinds) > 1:
            return f"mixed quantization of the {what} ({', '.join(sorted(map(str, kinds)))})", None, None
        q = kinds.pop() if kinds else None
        if q is not None:
            if q[0] not in EXPERT_BITS or q[1] not in EXPERT_GROUP_SIZES:
                return f"{q[0]}-bit {what} with group size {q[1]} (the kernels take 4 or 8 bits, groups of 32-128)", None, None
            if any(m.scales.dtype != dtype for m in mods):
                return f"quantization scales in another dtype than the activations' ({dtype})", None, None
        found.append(q)
    if found[0] is None and found[1] is not None:
        return "quantized routers with dense weights", None, None
    return None, found[0], found[1]


def unsupported_reason(model) -> Optional[str]:
    """Why the stacked paths cannot run this model (None if they can). `model` is a CausalLM or
    a bare DecoderModel (the speech talker and code predictor, fed embeddings)."""
    stack = _stack_of(model)
    layers = stack.layers
    if not layers:
        return "the model has no layers"
    if stack.spec.hybrid is not None:
        problem = hybrid_stacks.unsupported_reason(stack)
        if problem:
            return problem
    problem = quantization_of(model)[0]
    if problem:
        return problem
    moe = stack.spec.moe
    if moe is not None:
        if moe.intermediate_size % 8 or moe.shared_intermediate_size % 8:
            return "expert intermediate sizes not divisible by 8"
        st = stack._expert_stacks
        if st is None and len({tuple(layers[i].mlp.switch_mlp.gate_proj.weight.shape)
                               for i in moe.sparse_layers}) != 1:
            return "sparse layers with different expert shapes"
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
    _, qmain, qgate = quantization_of(model)
    stack = _stack_of(model)
    spec = stack.spec
    if spec.hybrid is not None:
        return _stack_hybrid(stack, qmain, qgate, rebind)
    layers = stack.layers
    attn0 = layers[0].self_attn
    H, L = spec.hidden_size, len(layers)
    Hq, Hkv, D = attn0.n_heads, attn0.n_kv_heads, attn0.head_dim
    QD, KD = Hq * D, Hkv * D
    has_bias = "bias" in attn0.q_proj
    qk_norm = "q_norm" in attn0
    dtype = layers[0].input_layernorm.weight.dtype  # the activations' (a quantized weight is uint32 words)
    # a quantized layer's arrays: its words, scales and biases, stacked alike
    names = ("weight", "scales", "biases") if qmain else ("weight",)
    gate_names = ("weight", "scales", "biases") if qgate else ("weight",)

    moe = spec.moe
    sparse = set(moe.sparse_layers) if moe is not None else set()
    dense = [i for i in range(L) if i not in sparse]

    def stk(f, which=None, params=names):
        """{param: stacked f(layer, param)} over all layers, or the layers `which`."""
        chosen = layers if which is None else [layers[i] for i in which]
        return {n: mx.stack([f(layer, n) for layer in chosen]) for n in params}

    def none():
        return {n: mx.zeros((1,), dtype) for n in names}

    wqkv = stk(lambda y, n: mx.concatenate([y.self_attn.q_proj[n], y.self_attn.k_proj[n], y.self_attn.v_proj[n]], axis=0))
    bqkv = (stk(lambda y, n: mx.concatenate([y.self_attn.q_proj.bias, y.self_attn.k_proj.bias, y.self_attn.v_proj.bias]),
                params=("weight",))["weight"] if has_bias else mx.zeros((1,), dtype))
    qkn = (stk(lambda y, n: mx.stack([y.self_attn.q_norm.weight, y.self_attn.k_norm.weight]), params=("weight",))["weight"]
           if qk_norm else mx.zeros((1,), dtype))
    wo = stk(lambda y, n: y.self_attn.o_proj[n])
    # the dense feed-forwards, by their ordinal among dense layers (a placeholder the kernels never
    # read when every layer is sparse)
    wgu = stk(lambda y, n: mx.stack([y.mlp.gate_proj[n], y.mlp.up_proj[n]]), dense) if dense else none()
    wd = stk(lambda y, n: y.mlp.down_proj[n], dense) if dense else none()
    norms = stk(lambda y, n: mx.stack([y.input_layernorm.weight, y.post_attention_layernorm.weight]),
                params=("weight",))["weight"]
    embed_tokens, embed = _embedding(stack, names, H, dtype)
    families = {"embed": embed, "wqkv": wqkv, "wo": wo, "wgu": wgu, "wd": wd}
    arrays = [a for fam in families.values() for a in fam.values()] + [bqkv, qkn, norms]
    moe_stacks, moe_quant, moe_st = (_stack_moe(stack, moe, dense, dtype, names, gate_names) if moe is not None
                                     else (None, {}, None))
    if moe_stacks is not None:
        arrays += [moe_stacks.ltab, moe_stacks.wr, moe_stacks.wsgu, moe_stacks.wsd, moe_stacks.wsg]
        arrays += [a for pair in moe_quant.values() for a in pair]
    mx.eval(arrays)
    if rebind:
        views = []
        for l, layer in enumerate(layers):
            a, m = layer.self_attn, layer.mlp
            for n in names:
                a.q_proj[n] = wqkv[n][l, :QD]
                a.k_proj[n] = wqkv[n][l, QD:QD + KD]
                a.v_proj[n] = wqkv[n][l, QD + KD:]
                # `wo[l, ...]` is a view; a bare integer index would gather a copy (memory would double)
                a.o_proj[n] = wo[n][l, ...]
                views += [a.q_proj[n], a.k_proj[n], a.v_proj[n], a.o_proj[n]]
                if l not in sparse:
                    d = dense.index(l)
                    m.gate_proj[n] = wgu[n][d, 0]
                    m.up_proj[n] = wgu[n][d, 1]
                    m.down_proj[n] = wd[n][d, ...]
                    views += [m.gate_proj[n], m.up_proj[n], m.down_proj[n]]
            if has_bias:
                a.q_proj["bias"] = bqkv[l, :QD]
                a.k_proj["bias"] = bqkv[l, QD:QD + KD]
                a.v_proj["bias"] = bqkv[l, QD + KD:]
                views += [a.q_proj["bias"], a.k_proj["bias"], a.v_proj["bias"]]
            if qk_norm:
                a.q_norm["weight"] = qkn[l, 0]
                a.k_norm["weight"] = qkn[l, 1]
                views += [a.q_norm["weight"], a.k_norm["weight"]]
            views += _rebind_norms(layer, norms, l)
        if moe_stacks is not None:
            views += _rebind_moe(stack, moe_stacks, moe_st, names, gate_names)
        # every view evaluated here: a lazy one left in the model would belong to the stream of the thread that
        # stacked (a server's worker), and another thread's eval of the parameters then fails on a GPU
        # ("There is no Stream(gpu, N) in current thread"; two engines share Qwen3-Omni's thinker)
        mx.eval(views)
    quant = _quant_stacks(qmain, qgate, families, moe_quant)
    return StackedWeights(
        hidden=H, layers=L, heads=Hq, kv_heads=Hkv, head_dim=D, inter=spec.intermediate_size,
        vocab=spec.vocab_size if embed_tokens is not None else 0, eps=float(spec.rms_norm_eps),
        has_bias=has_bias, qk_norm=qk_norm, dtype=dtype, embed=embed["weight"], wqkv=wqkv["weight"], bqkv=bqkv,
        qkn=qkn, wo=wo["weight"], wgu=wgu["weight"], wd=wd["weight"], norms=norms, fnorm=stack.norm.weight,
        rope_table=attn0._rope.table, moe=moe_stacks, quant=quant)


def _embedding(stack, names, H: int, dtype):
    """(the stack's token embedding or None, its params by name; a one-row placeholder the kernels
    never read for a stack fed embeddings only)."""
    embed_tokens = getattr(stack, "embed_tokens", None)
    if embed_tokens is None:
        return None, {n: mx.zeros((1, H), dtype) for n in names}
    return embed_tokens, {n: embed_tokens[n] for n in names}


def _quant_stacks(qmain, qgate, families, moe_quant) -> Optional[QuantStacks]:
    """The QuantStacks of quantized stacks (None if dense): each family's (scales, biases), the MoE ones."""
    if not qmain:
        return None
    params = {k: (fam["scales"], fam["biases"]) for k, fam in families.items()}
    params.update(moe_quant)
    return QuantStacks(qmain[0], qmain[1], *(qgate or (0, 32)), params)


def _rebind_norms(layer, norms, l: int) -> list:
    """Point a layer's two norms at their rows of the stacked norms (L, 2, H); the views made."""
    layer.input_layernorm["weight"] = norms[l, 0]
    layer.post_attention_layernorm["weight"] = norms[l, 1]
    return [layer.input_layernorm["weight"], layer.post_attention_layernorm["weight"]]


def _stack_hybrid(stack, qmain, qgate, rebind: bool) -> StackedWeights:
    """stack_weights for a hybrid Gated DeltaNet stack (hybrid_stacks.py): the kernel is the MoE variant,
    so a stack without sparse layers gets a one-expert placeholder MoeStacks, and ltab is (L, 4)."""
    spec = stack.spec
    layers = stack.layers
    L, H = len(layers), spec.hidden_size
    dtype = layers[0].input_layernorm.weight.dtype
    names = ("weight", "scales", "biases") if qmain else ("weight",)
    gate_names = ("weight", "scales", "biases") if qgate else ("weight",)
    wqkv, qkn, wo, wgu, wd, hs, hquant, views = hybrid_stacks.stack_hybrid(stack, names, dtype, rebind)
    moe = spec.moe
    sparse = [i for i in range(L) if moe is not None and moe.is_sparse(i)]
    dense = [i for i in range(L) if i not in sparse]
    if moe is not None:
        m, moe_quant, moe_st = _stack_moe(stack, moe, dense, dtype, names, gate_names)
    else:
        z = mx.zeros((1,), dtype)
        m, moe_quant, moe_st = MoeStacks(1, 1, 8, 0, False, (), z, z, z, z, z, z, z, z), {}, None
        if qmain:
            moe_quant = {k: (z, z) for k in ("wr", "wgx", "wux", "wdx", "wsgu", "wsd", "wsg")}
    m.ltab = hybrid_stacks.layer_table(stack, hs, {i: o for o, i in enumerate(sparse)}, dense)
    norms = mx.stack([mx.stack([y.input_layernorm.weight, y.post_attention_layernorm.weight]) for y in layers])
    embed_tokens, embed = _embedding(stack, names, H, dtype)
    mx.eval([m.ltab, norms] + ([m.wr, m.wsgu, m.wsd, m.wsg] + [a for p in moe_quant.values() for a in p]
                               if moe is not None else []))
    if rebind:
        for l, layer in enumerate(layers):
            views += _rebind_norms(layer, norms, l)
        if moe_st is not None:
            views += _rebind_moe(stack, m, moe_st, names, gate_names)
        mx.eval(views)
    families = {"embed": embed, "wqkv": wqkv, "wo": wo, "wgu": wgu, "wd": wd, **hquant}
    quant = _quant_stacks(qmain, qgate, families, moe_quant)
    attn0 = layers[hs.attn_layers[0]].self_attn
    return StackedWeights(
        hidden=H, layers=L, heads=attn0.n_heads, kv_heads=attn0.n_kv_heads, head_dim=attn0.head_dim,
        inter=spec.intermediate_size if dense else 8, vocab=spec.vocab_size if embed_tokens is not None else 0,
        eps=float(spec.rms_norm_eps), has_bias=False, qk_norm=True, dtype=dtype, embed=embed["weight"],
        wqkv=wqkv["weight"], bqkv=mx.zeros((1,), dtype), qkn=qkn, wo=wo["weight"], wgu=wgu["weight"],
        wd=wd["weight"], norms=norms, fnorm=stack.norm.weight, rope_table=attn0._rope.table, moe=m, quant=quant,
        hybrid=hs)


def _stack_moe(stack, moe, dense, dtype, names, gate_names):
    """The sparse layers' stacks (MoeStacks), if quantized the (scales, biases) of each of their arrays
    by name, and the stacks of every param (for rebinding): the routers and shared experts stacked here, the experts taken from the model's own
    stacks (made at load), or stacked now if the model has none (a model built in memory, or whose
    expert weights were replaced since)."""
    layers = stack.layers
    sp = list(moe.sparse_layers)
    ltab = mx.array([[1, sp.index(i)] if i in sp else [0, dense.index(i)] for i in range(len(layers))], mx.int32)
    experts = stack.expert_stacks()
    if experts is None:

        def current(layer, key):
            proj, param = key.split(".")
            return layers[layer].mlp.switch_mlp[proj][param]

        stack._expert_stacks = experts = stack_sparse_layers(stack, moe, current)
    blocks = [layers[i].mlp for i in sp]
    wr = {n: mx.stack([b.gate[n] for b in blocks]) for n in gate_names}
    if moe.shared_intermediate_size:
        wsgu = {n: mx.stack([mx.stack([b.shared_expert.gate_proj[n], b.shared_expert.up_proj[n]]) for b in blocks])
                for n in names}
        wsd = {n: mx.stack([b.shared_expert.down_proj[n] for b in blocks]) for n in names}
        wsg = {n: mx.concatenate([b.shared_expert_gate[n] for b in blocks]) for n in gate_names}  # (Ls, ...)
    else:
        wsgu = wsd = {n: mx.zeros((1,), dtype) for n in names}
        wsg = {n: mx.zeros((1,), dtype) for n in gate_names}
    a = experts.arrays
    ex = {p: {n: a[f"{p}.{n}"] for n in names} for p in ("gate_proj", "up_proj", "down_proj")}
    m = MoeStacks(moe.num_experts, moe.top_k, moe.intermediate_size, moe.shared_intermediate_size,
                  moe.norm_topk_prob, tuple(sp), ltab, wr["weight"], ex["gate_proj"]["weight"],
                  ex["up_proj"]["weight"], ex["down_proj"]["weight"], wsgu["weight"], wsd["weight"], wsg["weight"])
    quant = {}
    if len(names) > 1:
        for key, fam in (("wgx", ex["gate_proj"]), ("wux", ex["up_proj"]), ("wdx", ex["down_proj"]), ("wsgu", wsgu),
                         ("wsd", wsd)):
            quant[key] = (fam["scales"], fam["biases"])
    if len(gate_names) > 1:
        quant["wr"] = (wr["scales"], wr["biases"])
        quant["wsg"] = (wsg["scales"], wsg["biases"])
    elif len(names) > 1:
        # dense gates beside quantized weights: the kernels read them dense (gate bits 0) and never
        # read these placeholders
        quant["wr"] = quant["wsg"] = (mx.zeros((1,), dtype), mx.zeros((1,), dtype))
    return m, quant, {"wr": wr, "wsgu": wsgu, "wsd": wsd, "wsg": wsg}


def _rebind_moe(stack, m: MoeStacks, st, names, gate_names) -> list:
    """Point the sparse layers' routers and shared experts at views of their stacks `st` (the experts
    are views already)."""
    views = []
    for s, i in enumerate(m.sparse_layers):
        blk = stack.layers[i].mlp
        for n in gate_names:
            blk.gate[n] = st["wr"][n][s, ...]
            views.append(blk.gate[n])
            if m.shared:
                blk.shared_expert_gate[n] = st["wsg"][n][s:s + 1]
                views.append(blk.shared_expert_gate[n])
        if m.shared:
            sh = blk.shared_expert
            for n in names:
                sh.gate_proj[n] = st["wsgu"][n][s, 0]
                sh.up_proj[n] = st["wsgu"][n][s, 1]
                sh.down_proj[n] = st["wsd"][n][s, ...]
                views += [sh.gate_proj[n], sh.up_proj[n], sh.down_proj[n]]
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
    # a hybrid stack's Gated DeltaNet layers: conv taps (Ll, taps, conv_dim), float32 recurrent states
    # (Ll, Hv, Dk, Dv), updated in place by the kernel
    conv: Optional[mx.array] = None
    rec: Optional[mx.array] = None

    def reset(self) -> None:
        """Start again at position 0 (the old entries are overwritten before they are read)."""
        self.pos = 0


def empty_state(w: StackedWeights, capacity: int) -> DecodeState:
    """A zeroed stacked cache of `capacity` positions, at position 0 (the GPU kernels write into
    its arrays in place, so they are two buffers, made here)."""
    shape = (w.kv_layers, w.kv_heads, capacity, w.head_dim)
    kc, vc = mx.zeros(shape, w.dtype), mx.zeros(shape, w.dtype)
    mx.eval(kc, vc)
    state = DecodeState(kc, vc, 0, capacity)
    if w.hybrid is not None:
        state.conv, state.rec = hybrid_stacks.empty_linear_state(w.hybrid, w.dtype)
    return state


def stacked_cache(w: StackedWeights, cache, length: int, capacity: int) -> DecodeState:
    """Copy the first `length` positions of per-layer KVCaches (filled by the plain prefill) into a
    fresh stacked cache of `capacity` positions."""
    L, Hkv, D = w.kv_layers, w.kv_heads, w.head_dim
    kv = hybrid_stacks.attention_caches(cache) if w.hybrid is not None else cache
    out = []
    for name in ("keys", "values"):
        # each layer's positions written into the one array in place (each update donates the array before
        # it). A stack of the layers, then a concatenation with the padding, held two more copies of the cache
        # at once: qwen3-0.6b after a 16384-token prompt peaked at 6.91 GB against the plain path's 4.47
        # (H200, 2026-11-24, docs/decode.md "Prompt caches"); in place, 5.00 GB (H200, 2026-11-27)
        a = mx.zeros((L, Hkv, capacity, D), w.dtype)  # (layers, kv heads, positions, head_dim)
        for i, c in enumerate(kv if length else ()):
            a[i, :, :length] = getattr(c, name)[0, :, :length].astype(w.dtype)
        out.append(a)
    mx.eval(out)
    state = DecodeState(out[0], out[1], length, capacity)
    if w.hybrid is not None:
        state.conv, state.rec = hybrid_stacks.linear_state_from(w.hybrid, cache, w.dtype)
    return state
