"""The sparse mixture-of-experts feed-forward block of Qwen2-MoE and Qwen3-MoE.

A router (`gate`, hidden -> experts) scores the experts of every token; the top k run a SwiGLU
feed-forward each (`switch_mlp`: the experts' gate/up/down weights stacked on a leading expert
axis, the MLX community layout) and their outputs are summed with the routing weights. Qwen2-MoE
adds a dense `shared_expert` scaled by sigmoid(`shared_expert_gate`). The arithmetic is in
`kernels_metal` (moe_route, moe_experts), so each backend runs its variant.

Checkpoints publish the experts one tensor each (`mlp.experts.{e}.gate_proj.weight`),
transformers 5 may save them packed (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`), and
MLX conversions stack them (`mlp.switch_mlp.gate_proj.weight`, quantized or not):
`sanitize_experts` turns all three into the stacked names, and `stack_sparse_layers` then stacks the
sparse layers' experts across layers in place (the layout the decode kernels read), handing each
layer views of the stacks.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, Iterable, List, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn

import kernels_metal as K

from ..errors import MetalgenError
from .layers import MLP, Linear

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class MoeSpec:
    """The sparse layers of a decoder: which layers, how many experts, how they are picked."""

    num_experts: int
    top_k: int
    intermediate_size: int  # per expert (moe_intermediate_size)
    norm_topk_prob: bool
    sparse_layers: Tuple[int, ...]
    shared_intermediate_size: int = 0  # 0: no shared expert (Qwen3-MoE)

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers


def moe_spec_from_args(args, shared_intermediate_size: int = 0) -> Optional[MoeSpec]:
    """The MoeSpec of a ModelArgs with Hugging Face's MoE fields (None when no layer is sparse).
    Layer i is sparse when it is not in mlp_only_layers, num_experts > 0 and
    (i + 1) % decoder_sparse_step == 0, as transformers decides."""
    E, k, step = int(args.num_experts), int(args.num_experts_per_tok), int(args.decoder_sparse_step)
    only = set(int(i) for i in (args.mlp_only_layers or []))
    if E < 0 or (E > 0 and not 1 <= k <= E):
        raise MetalgenError(f"config.json: num_experts_per_tok {k} must be between 1 and num_experts {E}")
    if step < 1:
        raise MetalgenError(f"config.json: decoder_sparse_step must be >= 1, got {step}")
    if E > K.MOE_MAX_EXPERTS or k > K.MOE_MAX_TOP_K:
        raise MetalgenError(f"config.json: {E} experts, top {k}: the kernels take at most "
                            f"{K.MOE_MAX_EXPERTS} experts and top {K.MOE_MAX_TOP_K}")
    sparse = tuple(i for i in range(args.num_hidden_layers) if E > 0 and i not in only and (i + 1) % step == 0)
    if not sparse:
        return None
    return MoeSpec(E, k, int(args.moe_intermediate_size), bool(args.norm_topk_prob), sparse,
                   int(shared_intermediate_size))


EXPERT_BITS = (4, 8)
EXPERT_GROUP_SIZES = (32, 64, 128)


def check_expert_quantization(path: str, group_size: int, bits: int) -> None:
    """Raise unless the expert kernels take this quantization (a whole 16-byte chunk of a row must
    lie in one group)."""
    if bits not in EXPERT_BITS or group_size not in EXPERT_GROUP_SIZES:
        raise MetalgenError(f"{path}: {bits}-bit experts with group size {group_size} are not supported "
                            f"(the expert kernels take {' or '.join(map(str, EXPERT_BITS))} bits with group "
                            f"size {', '.join(map(str, EXPERT_GROUP_SIZES))})")


class SwitchLinear(nn.Module):
    """The experts' weights of one projection, stacked: weight (experts, out, in)."""

    def __init__(self, input_dims: int, output_dims: int, num_experts: int):
        super().__init__()
        scale = input_dims**-0.5
        self.weight = mx.random.uniform(-scale, scale, (num_experts, output_dims, input_dims))

    def experts(self) -> K.Experts:
        return K.Experts(self["weight"])

    def to_quantized(self, group_size: int = 64, bits: int = 4, mode: str = "affine", **_):
        if mode != "affine":
            raise ValueError(f"quantization mode '{mode}' is not supported (only affine)")
        E, out, inp = self.weight.shape
        q = QuantizedSwitchLinear(inp, out, E, group_size, bits)
        q.weight, q.scales, q.biases = mx.quantize(self.weight, group_size, bits)
        return q


class QuantizedSwitchLinear(nn.Module):
    """MLX affine-quantized experts (4 or 8 bits): weight (experts, out, in * bits / 32) uint32,
    scales and biases (experts, out, in / group_size)."""

    def __init__(self, input_dims: int, output_dims: int, num_experts: int, group_size: int = 64,
                 bits: int = 4):
        super().__init__()
        check_expert_quantization("experts", group_size, bits)
        self.group_size = group_size
        self.bits = bits
        self.weight = mx.zeros((num_experts, output_dims, input_dims * bits // 32), mx.uint32)
        self.scales = mx.zeros((num_experts, output_dims, input_dims // group_size))
        self.biases = mx.zeros((num_experts, output_dims, input_dims // group_size))

    def experts(self) -> K.Experts:
        return K.Experts(self["weight"], self["scales"], self["biases"], self.group_size, self.bits)


class SwitchGLU(nn.Module):
    """The routed experts: SwiGLU feed-forwards with stacked gate/up/down weights."""

    def __init__(self, dims: int, hidden_dims: int, num_experts: int):
        super().__init__()
        self.gate_proj = SwitchLinear(dims, hidden_dims, num_experts)
        self.up_proj = SwitchLinear(dims, hidden_dims, num_experts)
        self.down_proj = SwitchLinear(hidden_dims, dims, num_experts)

    def __call__(self, x: mx.array, inds: mx.array, scores: mx.array) -> mx.array:
        """x (T, H), inds and scores (T, k) -> sum_j scores[:, j] * expert_{inds[:, j]}(x), (T, H)."""
        return K.moe_experts(x, inds, scores, self.gate_proj.experts(), self.up_proj.experts(),
                             self.down_proj.experts())


class SparseMoeBlock(nn.Module):
    """Router, top-k routed experts and (Qwen2-MoE) the gated shared expert."""

    def __init__(self, hidden_size: int, moe: MoeSpec):
        super().__init__()
        self.num_experts = moe.num_experts
        self.top_k = moe.top_k
        self.norm_topk_prob = moe.norm_topk_prob
        self.gate = Linear(hidden_size, moe.num_experts, bias=False)
        self.switch_mlp = SwitchGLU(hidden_size, moe.intermediate_size, moe.num_experts)
        if moe.shared_intermediate_size:
            self.shared_expert = MLP(hidden_size, moe.shared_intermediate_size)
            self.shared_expert_gate = Linear(hidden_size, 1, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        shape = x.shape
        # (..., H) -> (T, H): routing is per token
        xf = x.reshape(-1, shape[-1])
        scores, inds = K.moe_route(self.gate(xf), self.top_k, self.norm_topk_prob)
        y = self.switch_mlp(xf, inds, scores)
        if "shared_expert" in self:
            y = y + mx.sigmoid(self.shared_expert_gate(xf)) * self.shared_expert(xf)
        return y.reshape(shape)


# ------------------------------------------------------------------------------------------------
# Checkpoint layouts


_PER_EXPERT = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|scales|biases)$")
_PACKED = re.compile(r"^(.*\.mlp)\.experts\.(gate_up_proj|down_proj)$")


def sanitize_experts(weights: Dict[str, mx.array], num_experts: int, source: Optional[Dict[str, str]] = None
                     ) -> Dict[str, mx.array]:
    """Rename every expert layout to the stacked `<mlp>.switch_mlp.<proj>.<param>` (experts on axis 0):
    per-expert tensors are stacked, transformers 5's packed gate_up_proj (E, 2I, H) is split into gate
    and up, its down_proj (E, H, I) renamed. A layer with missing or surplus experts raises, naming the
    first missing key and its file."""
    source = source if source is not None else {}
    groups: Dict[Tuple[str, str, str], Dict[int, str]] = {}
    out: Dict[str, mx.array] = {}
    for name, value in weights.items():
        m = _PER_EXPERT.match(name)
        if m:
            groups.setdefault((m.group(1), m.group(3), m.group(4)), {})[int(m.group(2))] = name
            continue
        m = _PACKED.match(name)
        if m:
            prefix, kind = m.group(1), m.group(2)
            if value.ndim != 3 or value.shape[0] != num_experts:
                raise MetalgenError(f"tensor '{name}' in {source.get(name, 'the checkpoint')} has shape "
                                    f"{tuple(value.shape)}: expected {num_experts} experts on axis 0")
            if kind == "gate_up_proj":
                if value.shape[1] % 2:
                    raise MetalgenError(f"tensor '{name}' has an odd gate_up size {value.shape[1]}")
                half = value.shape[1] // 2
                out[f"{prefix}.switch_mlp.gate_proj.weight"] = value[:, :half]
                out[f"{prefix}.switch_mlp.up_proj.weight"] = value[:, half:]
            else:
                out[f"{prefix}.switch_mlp.down_proj.weight"] = value
            continue
        out[name] = value
    for (prefix, proj, param), by_expert in groups.items():
        ids = sorted(by_expert)
        if ids != list(range(num_experts)):
            missing = sorted(set(range(num_experts)) - set(ids))
            example = next(iter(by_expert.values()))
            where = source.get(example, "the checkpoint")
            if missing:
                raise MetalgenError(f"tensor '{prefix}.experts.{missing[0]}.{proj}.{param}' is missing from {where} "
                                    f"(config.json says num_experts {num_experts}; found {len(ids)})")
            raise MetalgenError(f"tensor '{prefix}.experts.{ids[-1]}.{proj}.{param}' in {where} is past "
                                f"num_experts {num_experts} in config.json")
        out[f"{prefix}.switch_mlp.{proj}.{param}"] = mx.stack([weights[by_expert[e]] for e in ids])
    return out


# ------------------------------------------------------------------------------------------------
# Experts stacked across the sparse layers


def _switch(model_stack, layer: int) -> SwitchGLU:
    return model_stack.layers[layer].mlp.switch_mlp


@dataclasses.dataclass
class ExpertStacks:
    """The sparse layers' expert weights stacked across layers, (sparse layers, E, out, in) for each
    array of each projection (`arrays["gate_proj.weight"]`...), with the per-layer views they were
    handed out as. `valid_for` tells whether a model still holds exactly those views (its weights
    may have been replaced since)."""

    arrays: Dict[str, mx.array]
    views: List[Tuple[mx.array, ...]]  # per sparse layer: the views, in `keys` order
    keys: Tuple[str, ...]
    group_size: int = 0
    bits: int = 0

    def valid_for(self, model_stack, sparse_layers: Iterable[int]) -> bool:
        for views, layer in zip(self.views, sparse_layers):
            sw = _switch(model_stack, layer)
            for key, view in zip(self.keys, views):
                proj, param = key.split(".")
                if sw[proj].get(param) is not view:
                    return False
        return True


def expert_keys(quantized: bool) -> Tuple[str, ...]:
    params = ("weight", "scales", "biases") if quantized else ("weight",)
    return tuple(f"{p}.{q}" for p in PROJECTIONS for q in params)


def stack_problem(model_stack, moe: MoeSpec, shape_of) -> Optional[str]:
    """Why the sparse layers' experts cannot be stacked across layers (None if they can): every
    projection of every sparse layer must have the same shape, dtype and quantization.
    `shape_of(layer, key)` gives (shape, dtype) of a layer's array."""
    first = _switch(model_stack, moe.sparse_layers[0])
    quant = isinstance(first.gate_proj, QuantizedSwitchLinear)
    want_q = (first.gate_proj.group_size, first.gate_proj.bits) if quant else None
    keys = expert_keys(quant)
    want = {key: shape_of(moe.sparse_layers[0], key) for key in keys}
    for layer in moe.sparse_layers:
        sw = _switch(model_stack, layer)
        for proj in PROJECTIONS:
            lin = sw[proj]
            q = (lin.group_size, lin.bits) if isinstance(lin, QuantizedSwitchLinear) else None
            if q != want_q:
                return f"layer {layer}'s {proj} experts are quantized as {q}, layer {moe.sparse_layers[0]}'s gate_proj as {want_q}"
        for key in keys:
            got = shape_of(layer, key)
            if got != want[key]:
                return f"layer {layer}'s experts '{key}' are {got}, layer {moe.sparse_layers[0]}'s {want[key]}"
    return None


def stack_sparse_layers(model_stack, moe: MoeSpec, layer_arrays) -> ExpertStacks:
    """Stack the experts of every sparse layer across layers and give each layer views of the stacks.

    `layer_arrays(i, key)` returns the (E, out, in) array of sparse layer `i` (a layer index) for `key`
    (e.g. "gate_proj.weight"); it may be lazy (read from a file, made at random), and is asked for
    once. The stacks are allocated first and filled a layer at a time, evaluating as they go, so that
    memory holds the stacks plus one layer's arrays, never two copies of the experts (a packed
    gate_up tensor is read once for both of its halves). `stack_problem` must have said None.
    """
    first = _switch(model_stack, moe.sparse_layers[0])
    quant = isinstance(first.gate_proj, QuantizedSwitchLinear)
    keys = expert_keys(quant)
    n = len(moe.sparse_layers)
    head = {key: layer_arrays(moe.sparse_layers[0], key) for key in keys}
    arrays = {key: mx.zeros((n,) + tuple(a.shape), a.dtype) for key, a in head.items()}
    mx.eval(list(arrays.values()))
    for s, layer in enumerate(moe.sparse_layers):
        for key in keys:
            a = head.pop(key) if s == 0 else layer_arrays(layer, key)
            # slice assignment updates the stack's buffer in place (the dict holds its only reference)
            arrays[key][s] = a
        del a
        mx.eval(list(arrays.values()))
    views = []
    for s, layer in enumerate(moe.sparse_layers):
        sw = _switch(model_stack, layer)
        # `stack[s, ...]` is a view; a bare integer index would gather a copy
        vs = tuple(arrays[key][s, ...] for key in keys)
        for key, v in zip(keys, vs):
            proj, param = key.split(".")
            sw[proj][param] = v
        views.append(vs)
    mx.eval([v for vs in views for v in vs])
    gs = first.gate_proj.group_size if quant else 0
    bits = first.gate_proj.bits if quant else 0
    return ExpertStacks(arrays, views, keys, gs, bits)
