"""The hybrid Gated DeltaNet stacks (Qwen3-Next, Qwen3.5) on the stacked decode paths.

`stack_hybrid` is `stacked.stack_weights` for a model whose spec has `hybrid`: the attention layers'
weights are stacked by their ordinal among attention layers (wqkv keeps q_proj's layout, per head the
query then the gate), the Gated DeltaNet layers' in `HybridStacks` by theirs, the feed-forwards as
for any decoder (dense by dense ordinal, sparse through `MoeStacks`; a dense stack gets a one-expert
placeholder, since the hybrid kernel is the MoE variant), and the layer table says per layer (sparse?,
feed-forward ordinal, Gated DeltaNet?, mixer ordinal). The model's large parameters are rebound to
views of the stacks, as for the other stacks, so memory does not double.

A hybrid stack's decode state adds, per Gated DeltaNet layer, the conv taps (Ll, taps, conv_dim) and
the float32 recurrent state (Ll, Hv, Dk, Dv), which the kernel updates in place.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Sequence, Tuple

import mlx.core as mx

from ..cache import KVCache, LinearAttnCache


@dataclasses.dataclass
class HybridStacks:
    """The Gated DeltaNet layers' weights stacked (module doc) and the shapes the kernel takes."""

    attn_layers: Tuple[int, ...]
    linear_layers: Tuple[int, ...]
    key_heads: int
    value_heads: int
    key_dim: int  # per head
    value_dim: int  # per head
    conv_kernel: int
    packed: bool  # Qwen3-Next's in_proj_qkvz / in_proj_ba packing per key head
    rotary_dims: int
    wlin: mx.array  # (Ll, RL, H): [q | k | v | z | b | a] rows (packed per key head when `packed`)
    wlo: mx.array  # (Ll, H, Hv * Dv)
    cw: mx.array  # (Ll, conv_dim, conv_kernel)
    lpar: mx.array  # (Ll, 2, Hv): A_log, dt_bias
    gnw: mx.array  # (Ll, Dv): the gated norm's weight

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    @property
    def rows(self) -> int:
        """RL: the input projections' rows."""
        return self.conv_dim + self.value_heads * self.value_dim + 2 * self.value_heads

    @property
    def arrays(self):
        return (self.wlin, self.wlo, self.cw, self.lpar, self.gnw)


def _rows(module, fused: str, parts: Sequence[str], names) -> Dict[str, mx.array]:
    """{param: (rows, ...)} of `module`'s fused projection, or its parts' rows side by side."""
    if fused in module:
        return {n: module[fused][n] for n in names}
    return {n: mx.concatenate([module[p][n] for p in parts], axis=0) for n in names}


def _rebind_rows(module, fused: str, parts: Sequence[str], sizes: Sequence[int], stacked, o: int, names) -> list:
    """Point `module`'s fused projection (or its parts, row slices) at slot `o` of `stacked`."""
    views = []
    for n in names:
        if fused in module:
            module[fused][n] = stacked[n][o, ...]
            views.append(module[fused][n])
        else:
            start = 0
            for p, size in zip(parts, sizes):
                module[p][n] = stacked[n][o, start:start + size]
                views.append(module[p][n])
                start += size
    return views


def weight_modules(stack):
    """The layers whose weights the hybrid kernel reads (`stacked._weight_layers`' main list, less the
    routers and shared experts' gates, which that function adds)."""
    mods = []
    for layer in stack.layers:
        if "linear_attn" in layer:
            la = layer.linear_attn
            mods += [la.in_proj] if "in_proj" in la else [la[n] for n in la._input_names()]
            mods.append(la.out_proj)
        else:
            a = layer.self_attn
            mods += [a.qkv_proj] if "qkv_proj" in a else [a.q_proj, a.k_proj, a.v_proj]
            mods.append(a.o_proj)
        m = layer.mlp
        if "switch_mlp" not in m:
            mods += [m.gate_up_proj] if "gate_up_proj" in m else [m.gate_proj, m.up_proj]
            mods.append(m.down_proj)
    return mods


def unsupported_reason(stack):
    """Why the hybrid kernel cannot run this stack's shapes (None if it can)."""
    hy = stack.spec.hybrid
    ls = hy.linear
    r = hy.rotary_dims
    if not (r % 64 == 0 or (r <= 32 and r & (r - 1) == 0)):
        return f"{r} rotary dims a head (the kernel turns a multiple of 64, or a power of two up to 32)"
    if ls.value_head_dim % 32 or ls.key_head_dim > 128 or ls.key_head_dim % 8:
        return (f"Gated DeltaNet heads of {ls.key_head_dim} x {ls.value_head_dim} (the kernel takes key heads of "
                "at most 128 in multiples of 8, value heads in multiples of 32)")
    if ls.conv_kernel < 2:
        return "a Gated DeltaNet conv of one tap"
    if hy.attention_bias:
        return "attention biases in a hybrid stack"
    if all(hy.is_linear(i) for i in range(len(stack.layers))):
        return "a hybrid stack without attention layers"
    return None


def stack_hybrid(stack, names, dtype, rebind: bool):
    """(the attention layers' wqkv, qkn, wo stacks as {param: array}, the dense feed-forwards' wgu, wd,
    HybridStacks (its wlin, wlo as {param: array} for the quantized), the views made) for the
    hybrid `stack` (a HybridDecoderModel); `names` are the weight params ("weight", or with the
    quantized "scales", "biases")."""
    spec = stack.spec
    hy = spec.hybrid
    ls = hy.linear
    layers = stack.layers
    attn = tuple(i for i in range(len(layers)) if not hy.is_linear(i))
    lin = tuple(i for i in range(len(layers)) if hy.is_linear(i))
    moe = spec.moe
    dense = [i for i in range(len(layers)) if moe is None or not moe.is_sparse(i)]

    views = []

    def family(which, part: str, fused: str, parts=(), sizes=()):
        """One family of weights stacked over the layers `which` ({param: (n, rows, ...)}: `fused` of the
        layer's `part`, or its `parts` side by side), evaluated, and (rebind) the layers pointed at its
        views before the next family is stacked: the old arrays go family by family, so at most one
        family is held twice."""
        st = {n: mx.stack([_rows(layers[i][part], fused, parts, (n,))[n] for i in which]) for n in names}
        mx.eval(list(st.values()))
        if rebind:
            for o, i in enumerate(which):
                views.extend(_rebind_rows(layers[i][part], fused, parts, sizes, st, o, names))
            mx.eval(views)
        return st

    # unsupported_reason made sure there are attention layers
    wqkv = family(attn, "self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj"), layers[attn[0]].self_attn._sizes())
    wo = family(attn, "self_attn", "o_proj")
    in_names = layers[lin[0]].linear_attn._input_names()
    wlin = family(lin, "linear_attn", "in_proj", in_names, layers[lin[0]].linear_attn._input_sizes())
    wlo = family(lin, "linear_attn", "out_proj")
    # a dense feed-forward's gate and up as one (2I, H) block of rows: the kernel reads gate row r at r,
    # up row r at I + r (the (L, 2, I, H) layout of the other stacks, in memory)
    inter = spec.intermediate_size
    none = {n: mx.zeros((1,), dtype) for n in names}
    wgu = family(dense, "mlp", "gate_up_proj", ("gate_proj", "up_proj"), (inter, inter)) if dense else none
    wd = family(dense, "mlp", "down_proj") if dense else none
    qkn = mx.stack([mx.stack([layers[i].self_attn.q_norm.weight, layers[i].self_attn.k_norm.weight]) for i in attn])
    taps = ls.conv_kernel
    cw = mx.stack([layers[i].linear_attn.conv1d.weight.reshape(ls.conv_dim, taps) for i in lin]).astype(dtype)
    lpar = mx.stack([mx.stack([layers[i].linear_attn.A_log.astype(dtype), layers[i].linear_attn.dt_bias.astype(dtype)])
                     for i in lin])
    gnw = mx.stack([layers[i].linear_attn.norm.weight for i in lin]).astype(dtype)
    mx.eval(qkn, cw, lpar, gnw)
    if rebind:
        for o, i in enumerate(attn):
            layers[i].self_attn.q_norm["weight"] = qkn[o, 0]
            layers[i].self_attn.k_norm["weight"] = qkn[o, 1]
            views += [layers[i].self_attn.q_norm["weight"], layers[i].self_attn.k_norm["weight"]]
    hs = HybridStacks(attn, lin, ls.num_key_heads, ls.num_value_heads, ls.key_head_dim, ls.value_head_dim, taps,
                      ls.layout == "qkvz", hy.rotary_dims, wlin["weight"], wlo["weight"], cw, lpar, gnw)
    return wqkv, qkn, wo, wgu, wd, hs, {"wlin": wlin, "wlo": wlo}, views


def layer_table(stack, hs: HybridStacks, sparse_ord, dense) -> mx.array:
    """(L, 4) int32: (sparse?, feed-forward ordinal, Gated DeltaNet?, mixer ordinal) per layer;
    `sparse_ord` maps a sparse layer to its ordinal, `dense` lists the dense layers."""
    rows = []
    for i in range(len(stack.layers)):
        ff = [1, sparse_ord[i]] if i in sparse_ord else [0, dense.index(i)]
        mix = [1, hs.linear_layers.index(i)] if i in hs.linear_layers else [0, hs.attn_layers.index(i)]
        rows.append(ff + mix)
    return mx.array(rows, mx.int32)


def empty_linear_state(hs: HybridStacks, dtype) -> Tuple[mx.array, mx.array]:
    """Zeroed conv taps (Ll, taps, conv_dim) and recurrent states (Ll, Hv, Dk, Dv) float32."""
    Ll = len(hs.linear_layers)
    conv = mx.zeros((Ll, hs.conv_kernel - 1, hs.conv_dim), dtype)
    rec = mx.zeros((Ll, hs.value_heads, hs.key_dim, hs.value_dim), mx.float32)
    mx.eval(conv, rec)
    return conv, rec


def linear_state_from(hs: HybridStacks, cache, dtype) -> Tuple[mx.array, mx.array]:
    """The Gated DeltaNet layers' states of per-layer caches (filled by the plain prefill), copied into
    fresh stacks (the kernel updates them in place; the caches keep their own)."""
    lin = [c for c in cache if isinstance(c, LinearAttnCache)]
    if len(lin) != len(hs.linear_layers) or any(c.conv_state is None or c.recurrent is None for c in lin):
        return empty_linear_state(hs, dtype)
    conv = mx.stack([c.conv_state[0] for c in lin]).astype(dtype)
    rec = mx.stack([c.recurrent[0] for c in lin]).astype(mx.float32)
    mx.eval(conv, rec)
    return conv, rec


def attention_caches(cache) -> list:
    """The KV caches of the attention layers, in layer order."""
    return [c for c in cache if isinstance(c, KVCache)]
