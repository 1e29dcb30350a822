"""Assembles each kernel's Metal and CUDA text from one body and a per-backend prelude.

A body (kernels_metal/bodies/<name>.body) is the inside of the generated kernel function, written
only in the shared vocabulary (mg_* functions, MG_* macros, mg_tid / mg_lane / ... indices). For a
backend, the assembler gives:

  header = preludes/<backend>.h + preludes/common.h + "#define" lines of the variant + extra preludes
           (+ preludes/cuda_tail.h on CUDA: the megakernel's launch bounds)
  source = preludes/<backend>_entry.h (the index variables) + the body

which is exactly what mx.fast.metal_kernel / mx.fast.cuda_kernel take as `header=` and `source=`.
The index variables must sit in `source`: MLX adds a Metal attribute (thread_position_in_grid...)
to the generated signature only when its name appears in the source text.

`metal_program` / `cuda_program` rebuild the whole translation unit that MLX generates around a
body (signature, template parameters, explicit instantiation), for the CI syntax checks.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace

import mlx.core as mx

_HERE = os.path.dirname(os.path.abspath(__file__))
BACKENDS = ("metal", "cuda")


@functools.lru_cache(maxsize=None)
def _read(rel: str) -> str:
    with open(os.path.join(_HERE, rel), encoding="utf-8") as f:
        text = f.read()
    # the pieces are pasted into one text; a stray "#pragma once" there only warns
    return "\n".join(line for line in text.splitlines() if line.strip() != "#pragma once") + "\n"


def prelude(name: str) -> str:
    """The text of `kernels_metal/preludes/<name>` (e.g. "cuda.h") as the generated kernels paste it: for
    probes that build their own kernels on the same vocabulary (benchmarks/*_probe.py)."""
    return _read(os.path.join("preludes", name))


@dataclass(frozen=True)
class KernelSpec:
    """One kernel variant: its body, the names MLX puts in the signature, its #defines, and the
    names of its template parameters in the order the Python side passes them."""

    name: str
    body: str
    inputs: tuple
    outputs: tuple
    templates: tuple
    defines: tuple = ()
    # extra prelude files (preludes/<name>), appended after common.h
    preludes: tuple = ()
    # an example instantiation for the source checks: (input dtypes, input ndims, output dtypes,
    # template values) with dtypes as mx.Dtype, ints, bools
    example: dict = field(default_factory=dict, compare=False, hash=False)


def _spec(name, body, inputs, outputs, templates, defines=(), preludes=(), **example):
    return KernelSpec(name, body, tuple(inputs), tuple(outputs), tuple(templates), tuple(defines),
                      tuple(preludes), example)


bf16, f32, i32, u32 = mx.bfloat16, mx.float32, mx.int32, mx.uint32

DECODE_INPUTS = ("tok", "emb", "embed", "wqkv", "bqkv", "qkn", "wo", "wgu", "wd", "norms", "fnorm", "cos_t",
                 "sin_t", "kc", "vc", "scratch", "params", "fparams", "dep")
DECODE_TEMPLATES = ("T", "D", "QKN", "BIAS", "SK", "HT", "HQT", "HKVT", "IT")
DECODE_DTYPES = [i32, bf16, bf16, bf16, bf16, bf16, bf16, bf16, bf16, bf16, bf16, f32, f32, bf16, bf16, f32, i32,
                 f32, u32]
# decoders with sparse MoE layers (MG_MOE 1): the layer table, the routers, the experts, the shared expert
DECODE_MOE_INPUTS = DECODE_INPUTS + ("ltab", "wr", "wgx", "wux", "wdx", "wsgu", "wsd", "wsg")
DECODE_MOE_TEMPLATES = DECODE_TEMPLATES + ("EXT", "KX", "MIT", "SIT")
DECODE_MOE_DTYPES = DECODE_DTYPES + [i32, bf16, bf16, bf16, bf16, bf16, bf16, bf16]
# MLX-quantized weights (MG_QUANT 1, both decode paths): each quantized input's scales and biases
QUANT_WEIGHTS = ("embed", "wqkv", "wo", "wgu", "wd")
QUANT_MOE_WEIGHTS = QUANT_WEIGHTS + ("wr", "wgx", "wux", "wdx", "wsgu", "wsd", "wsg")


# Magpie's local transformer (bodies/magpie_lt.body): weights T, the rest float32 / int32 / uint32
MAGPIE_LT_INPUTS = ("h", "in_w", "in_b", "pos", "ln", "qkv", "wo", "ff1", "ff2", "out_w", "out_b", "emb", "bad",
                    "fparams", "params", "state", "scratch", "sw_in")
MAGPIE_LT_TEMPLATES = ("T", "DT", "DIN", "FT", "VT", "HT", "NLT", "NN")
MAGPIE_LT_DTYPES = [f32] + [bf16] * 11 + [f32, f32, i32, u32, f32, u32]
MAGPIE_LT_357M = [bf16, 768, 768, 3072, 2024, 12, 2, 16]  # Magpie 357M: 8 codebooks x 2 stacked frames


def _quant_inputs(names):
    return tuple(f"{n}_{p}" for n in names for p in ("s", "b"))


def _quant_dtypes(inputs, dtypes, names):
    """The input dtypes with the quantized weights as uint32 words, then their bf16 scales and biases."""
    out = [u32 if n in names else d for n, d in zip(inputs, dtypes)]
    return out + [bf16] * (2 * len(names))


DECODE_Q_INPUTS = DECODE_INPUTS + _quant_inputs(QUANT_WEIGHTS)
DECODE_MOE_Q_INPUTS = DECODE_MOE_INPUTS + _quant_inputs(QUANT_MOE_WEIGHTS)
QUANT_TEMPLATES = ("QB", "GS", "QBR", "GSR")
# Qwen3-30B-A3B's sizes, and Qwen1.5-MoE-A2.7B's (shared expert, q/k/v biases, head dim 128)
QWEN3_MOE_TMPL = [bf16, 128, True, False, 6144, 2048, 32, 4, 6144, 128, 8, 768, 0]
QWEN2_MOE_TMPL = [bf16, 128, False, True, 5632, 2048, 16, 16, 5632, 60, 4, 1408, 5632]
# hybrid Gated DeltaNet stacks (MG_HYBRID 1, on the MoE variant): the Gated DeltaNet layers' input
# projections, output projections, conv weights, (A_log, dt_bias), gated-norm weights, and their conv
# and recurrent states (updated in place)
DECODE_HYBRID_INPUTS = DECODE_MOE_INPUTS + ("wlin", "wlo", "cw", "lpar", "gnw", "cst", "rst")
DECODE_HYBRID_TEMPLATES = DECODE_MOE_TEMPLATES + ("ROT", "HKL", "HVL", "DKL", "DVL", "KCT", "QKVZ")
DECODE_HYBRID_DTYPES = DECODE_MOE_DTYPES + [bf16, bf16, bf16, bf16, bf16, bf16, f32]
QUANT_HYBRID_WEIGHTS = QUANT_MOE_WEIGHTS + ("wlin", "wlo")
DECODE_HYBRID_Q_INPUTS = DECODE_HYBRID_INPUTS + _quant_inputs(QUANT_HYBRID_WEIGHTS)
# Qwen3.5-35B-A3B's sizes (every layer sparse, a shared expert), Qwen3.5-0.8B's (dense: one placeholder
# expert), Qwen3-Next-80B-A3B's (the per-key-head packing)
QWEN35_MOE_TMPL = [bf16, 256, True, False, 4096, 2048, 16, 2, 8, 256, 8, 512, 512, 64, 16, 32, 128, 128, 4, 0]
QWEN35_DENSE_TMPL = [bf16, 256, True, False, 3584, 1024, 8, 2, 3584, 1, 1, 8, 0, 64, 16, 16, 128, 128, 4, 0]
QWEN3_NEXT_TMPL = [bf16, 256, True, False, 5120, 2048, 16, 2, 5120, 512, 10, 512, 512, 64, 16, 32, 128, 128, 4, 1]

PAGED_ATTN_INPUTS = ("q", "k", "v", "table", "lengths", "params", "scale")
QK_STORE_INPUTS = ("q", "k", "v", "qw", "kw", "cos_t", "sin_t", "pos", "slots", "kp", "vp", "params", "fparams")

SPECS = {
    s.name: s
    for s in [
        _spec("rms_norm", "rms_norm", ["x", "w", "eps"], ["y"], ["T", "W", "D"], [("MG_ADD", 0)],
              dtypes=[bf16, bf16, f32], out=[bf16], tmpl=[bf16, bf16, 896]),
        _spec("add_rms_norm", "rms_norm", ["x", "res", "w", "eps"], ["y", "h"], ["T", "W", "D"], [("MG_ADD", 1)],
              dtypes=[bf16, bf16, bf16, f32], out=[bf16, bf16], tmpl=[bf16, bf16, 1024]),
        _spec("rope", "rope", ["x", "cos_t", "sin_t", "params"], ["y"], ["T", "HALF"], [("MG_MROPE", 0)],
              dtypes=[bf16, f32, f32, i32], out=[bf16], tmpl=[bf16, 64]),
        _spec("mrope", "rope", ["x", "cos_t", "sin_t", "params", "pos"], ["y"],
              ["T", "HALF", "S0", "S1", "S2", "INTERLEAVED"], [("MG_MROPE", 1)],
              dtypes=[bf16, f32, f32, i32, i32], out=[bf16], tmpl=[bf16, 64, 24, 20, 20, True]),
        _spec("decode_attention", "decode_attention", ["q", "k", "v", "params", "scale"], ["out"],
              ["T", "D", "G", "NW"], [("MG_SPLIT", 0), ("MG_PAGED", 0)],
              dtypes=[bf16, bf16, bf16, i32, f32], out=[bf16], tmpl=[bf16, 128, 4, 4]),
        _spec("decode_attention_split", "decode_attention", ["q", "k", "v", "params", "scale"], ["po", "pml"],
              ["T", "D", "G", "NW"], [("MG_SPLIT", 1), ("MG_PAGED", 0)],
              dtypes=[bf16, bf16, bf16, i32, f32], out=[f32, f32], tmpl=[bf16, 64, 7, 4]),
        # the same body over a paged pool: each row its own length and block table (a batch's decode step)
        _spec("paged_decode_attention", "decode_attention", PAGED_ATTN_INPUTS, ["out"], ["T", "D", "G", "NW", "BS"],
              [("MG_SPLIT", 0), ("MG_PAGED", 1)],
              dtypes=[bf16, bf16, bf16, i32, i32, i32, f32], out=[bf16], tmpl=[bf16, 128, 2, 4, 32]),
        _spec("paged_decode_attention_split", "decode_attention", PAGED_ATTN_INPUTS, ["po", "pml"],
              ["T", "D", "G", "NW", "BS"], [("MG_SPLIT", 1), ("MG_PAGED", 1)],
              dtypes=[bf16, bf16, bf16, i32, i32, i32, f32], out=[f32, f32], tmpl=[bf16, 64, 7, 4, 16]),
        # a batch's decode step: q/k norms, RoPE at each row's position, k/v into the paged pools (in place)
        _spec("qk_rope_store", "qk_rope_store", QK_STORE_INPUTS, ["qo", "sync"], ["T", "HALF", "QKN"],
              dtypes=[bf16, bf16, bf16, bf16, bf16, f32, f32, i32, i32, bf16, bf16, i32, f32], out=[bf16, u32],
              tmpl=[bf16, 64, True]),
        _spec("kv_store", "kv_store", ["kc", "vc", "k", "v", "params", "dep"], ["sync", "ko", "vo"], ["T"],
              dtypes=[bf16, bf16, bf16, bf16, i32, u32], out=[u32, bf16, bf16], tmpl=[bf16]),
        _spec("attention_combine", "attention_combine", ["po", "pml", "params"], ["out"], ["T", "D", "G"],
              dtypes=[f32, f32, i32], out=[bf16], tmpl=[bf16, 128, 2]),
        _spec("gemv", "gemv", ["x", "w", "params"], ["y"], ["T", "M", "NW", "R"], [("MG_QBITS", 0), ("MG_BIAS", 0)],
              ("qdot.h",), dtypes=[bf16, bf16, i32], out=[bf16], tmpl=[bf16, 1, 4, 1]),
        _spec("gemv_bias", "gemv", ["x", "w", "bias", "params"], ["y"], ["T", "M", "NW", "R"],
              [("MG_QBITS", 0), ("MG_BIAS", 1)], ("qdot.h",),
              dtypes=[mx.float16, mx.float16, mx.float16, i32], out=[mx.float16], tmpl=[mx.float16, 3, 4, 2]),
        _spec("gemv_q4", "gemv", ["x", "w", "scales", "biases", "params"], ["y"], ["T", "M", "NW", "R", "S", "GS"],
              [("MG_QBITS", 4), ("MG_BIAS", 0)], ("qdot.h",),
              dtypes=[bf16, u32, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 1, 4, 4, bf16, 64]),
        _spec("gemv_q4_bias", "gemv", ["x", "w", "scales", "biases", "bias", "params"], ["y"],
              ["T", "M", "NW", "R", "S", "GS"], [("MG_QBITS", 4), ("MG_BIAS", 1)], ("qdot.h",),
              dtypes=[bf16, u32, bf16, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 2, 4, 1, bf16, 32]),
        _spec("gemv_q8", "gemv", ["x", "w", "scales", "biases", "params"], ["y"], ["T", "M", "NW", "R", "S", "GS"],
              [("MG_QBITS", 8), ("MG_BIAS", 0)], ("qdot.h",),
              dtypes=[bf16, u32, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 4, 4, 2, bf16, 64]),
        _spec("gemv_q8_bias", "gemv", ["x", "w", "scales", "biases", "bias", "params"], ["y"],
              ["T", "M", "NW", "R", "S", "GS"], [("MG_QBITS", 8), ("MG_BIAS", 1)], ("qdot.h",),
              dtypes=[mx.float16, u32, mx.float16, mx.float16, mx.float16, i32], out=[mx.float16],
              tmpl=[mx.float16, 1, 4, 4, mx.float16, 128]),
        # mixture of experts (docs/kernels.md): the router, the gathered expert products for
        # decode-shaped routings, and the grouping of assignments by expert for the grouped GEMM
        _spec("moe_route", "moe_route", ["logits", "params"], ["scores", "inds"], ["T"],
              dtypes=[bf16, i32], out=[bf16, i32], tmpl=[bf16]),
        _spec("moe_gate_up", "moe_gate_up", ["x", "inds", "wg", "wu", "params"], ["act"], ["T", "NW"],
              [("MG_QBITS", 0)], ("qdot.h",), dtypes=[bf16, i32, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 4]),
        _spec("moe_gate_up_q4", "moe_gate_up", ["x", "inds", "wg", "sg", "bg", "wu", "su", "bu", "params"], ["act"],
              ["T", "NW", "S", "GS"], [("MG_QBITS", 4)], ("qdot.h",),
              dtypes=[bf16, i32, u32, bf16, bf16, u32, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 4, bf16, 64]),
        _spec("moe_gate_up_q8", "moe_gate_up", ["x", "inds", "wg", "sg", "bg", "wu", "su", "bu", "params"], ["act"],
              ["T", "NW", "S", "GS"], [("MG_QBITS", 8)], ("qdot.h",),
              dtypes=[mx.float16, i32, u32, mx.float16, mx.float16, u32, mx.float16, mx.float16, i32],
              out=[mx.float16], tmpl=[mx.float16, 4, mx.float16, 32]),
        _spec("moe_down", "moe_down", ["act", "inds", "scores", "wd", "params"], ["y"], ["T", "NW"],
              [("MG_QBITS", 0)], ("qdot.h",), dtypes=[bf16, i32, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 4]),
        _spec("moe_down_q4", "moe_down", ["act", "inds", "scores", "wd", "sd", "bd", "params"], ["y"],
              ["T", "NW", "S", "GS"], [("MG_QBITS", 4)], ("qdot.h",),
              dtypes=[bf16, i32, bf16, u32, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 4, bf16, 128]),
        _spec("moe_down_q8", "moe_down", ["act", "inds", "scores", "wd", "sd", "bd", "params"], ["y"],
              ["T", "NW", "S", "GS"], [("MG_QBITS", 8)], ("qdot.h",),
              dtypes=[bf16, i32, bf16, u32, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 4, bf16, 64]),
        # the grouped expert GEMM on the matrix units (prefill-shaped routings, 16-bit weights)
        _spec("moe_gemm_gate_up", "moe_gemm", ["x", "src", "bexp", "wt", "wu", "params"], ["out"], ["T", "B", "BN"],
              [("MG_GATE_UP", 1), ("MG_QBITS", 0)], dtypes=[bf16, i32, i32, bf16, bf16, i32], out=[bf16],
              tmpl=[bf16, 64, 128]),
        _spec("moe_gemm_down", "moe_gemm", ["x", "src", "bexp", "wt", "params"], ["out"], ["T", "B", "BN"],
              [("MG_GATE_UP", 0), ("MG_QBITS", 0)], dtypes=[mx.float16, i32, i32, mx.float16, i32],
              out=[mx.float16], tmpl=[mx.float16, 64, 64]),
        _spec("moe_gemm_gate_up_q4", "moe_gemm", ["x", "src", "bexp", "wt", "wt_s", "wt_b", "wu", "wu_s", "wu_b",
                                                  "params"], ["out"], ["T", "B", "BN", "S", "GS"],
              [("MG_GATE_UP", 1), ("MG_QBITS", 4)], dtypes=[bf16, i32, i32, u32, bf16, bf16, u32, bf16, bf16, i32],
              out=[bf16], tmpl=[bf16, 64, 128, bf16, 64]),
        _spec("moe_gemm_gate_up_q8", "moe_gemm", ["x", "src", "bexp", "wt", "wt_s", "wt_b", "wu", "wu_s", "wu_b",
                                                  "params"], ["out"], ["T", "B", "BN", "S", "GS"],
              [("MG_GATE_UP", 1), ("MG_QBITS", 8)], dtypes=[bf16, i32, i32, u32, bf16, bf16, u32, bf16, bf16, i32],
              out=[bf16], tmpl=[bf16, 64, 64, bf16, 32]),
        _spec("moe_gemm_down_q4", "moe_gemm", ["x", "src", "bexp", "wt", "wt_s", "wt_b", "params"], ["out"],
              ["T", "B", "BN", "S", "GS"], [("MG_GATE_UP", 0), ("MG_QBITS", 4)],
              dtypes=[mx.float16, i32, i32, u32, mx.float16, mx.float16, i32], out=[mx.float16],
              tmpl=[mx.float16, 64, 128, mx.float16, 128]),
        _spec("moe_gemm_down_q8", "moe_gemm", ["x", "src", "bexp", "wt", "wt_s", "wt_b", "params"], ["out"],
              ["T", "B", "BN", "S", "GS"], [("MG_GATE_UP", 0), ("MG_QBITS", 8)],
              dtypes=[bf16, i32, i32, u32, bf16, bf16, i32], out=[bf16], tmpl=[bf16, 64, 128, bf16, 64]),
        _spec("moe_unpack", "moe_unpack", ["y", "dst", "scores", "params"], ["out"], ["T"],
              dtypes=[bf16, i32, bf16, i32], out=[bf16], tmpl=[bf16]),
        _spec("moe_pack", "moe_pack", ["inds", "params"], ["src", "dst", "bexp"], ["B"],
              dtypes=[i32, i32], out=[i32, i32, i32], tmpl=[64]),
        _spec("sample", "sample", ["logits", "rparams", "iparams", "state", "recent", "work", "scr"],
              ["tok", "lp", "next_state"], ["T"],
              dtypes=[bf16, f32, i32, u32, i32, f32, u32], out=[i32, f32, u32], tmpl=[bf16]),
        # Gated DeltaNet decode (docs/kernels.md): one token of the gated delta rule for every value head
        _spec("gated_delta_step", "gated_delta_step", ["q", "k", "v", "g", "beta", "s_in", "params"],
              ["out", "s_out"], ["T", "DK", "DV", "NW"], [("MG_CONV", 0)], dtypes=[bf16, bf16, bf16, f32, f32, f32, i32],
              out=[bf16, f32], tmpl=[bf16, 128, 128, 8]),
        # ... from the layer's input projections: the conv and its state, SiLU and the gates folded in
        _spec("gated_delta_conv_step", "gated_delta_step",
              ["mixed", "cstate", "cw", "a_in", "b_in", "alog", "dtb", "s_in", "params"], ["out", "s_out", "cstate_out"],
              ["T", "DK", "DV", "NW", "KC"], [("MG_CONV", 1)],
              dtypes=[bf16, bf16, bf16, bf16, bf16, bf16, bf16, f32, i32], out=[bf16, f32, bf16],
              tmpl=[bf16, 128, 128, 8, 4]),
        # Gated DeltaNet prefill: the chunked form's scan over chunks (the rest is batched MLX matmuls)
        _spec("gated_delta_scan", "gated_delta_scan", ["U", "W", "qd", "kd", "mix", "glast", "s_in", "params"],
              ["out", "s_out"], ["DK", "DV", "C"], dtypes=[f32, f32, f32, f32, f32, f32, f32, i32], out=[f32, f32],
              tmpl=[128, 128, 64]),
        # the fused decode path (metalgen/decode, docs/decode.md): one launch per phase of a layer
        _spec("decode_layer", "decode_layer", DECODE_INPUTS, ["out", "sync"], DECODE_TEMPLATES,
              [("MG_GRID", 0), ("MG_DECODE_V", 1)], ("qdot.h", "decode.h"), dtypes=DECODE_DTYPES, out=[bf16, u32],
              tmpl=[bf16, 128, True, False, 9728, 2560, 32, 8, 9728]),
        # decode v2 (split-K o_proj/down with atomic partial sums, residual folded into the next norm)
        _spec("decode_layer_v2", "decode_layer", DECODE_INPUTS, ["out", "sync"], DECODE_TEMPLATES,
              [("MG_GRID", 0), ("MG_DECODE_V", 2)], ("qdot.h", "decode.h"), dtypes=DECODE_DTYPES, out=[bf16, u32],
              tmpl=[bf16, 128, True, False, 9728, 2560, 32, 8, 9728]),
        # with sparse MoE layers (6 phases a layer)
        _spec("decode_layer_moe", "decode_layer", DECODE_MOE_INPUTS, ["out", "sync"], DECODE_MOE_TEMPLATES,
              [("MG_GRID", 0), ("MG_DECODE_V", 1), ("MG_MOE", 1)], ("qdot.h", "decode.h"), dtypes=DECODE_MOE_DTYPES,
              out=[bf16, u32], tmpl=QWEN2_MOE_TMPL),
        # with Gated DeltaNet layers (Qwen3-Next, Qwen3.5; 6 phases a layer)
        _spec("decode_layer_hybrid", "decode_layer", DECODE_HYBRID_INPUTS, ["out", "sync"], DECODE_HYBRID_TEMPLATES,
              [("MG_GRID", 0), ("MG_DECODE_V", 1), ("MG_MOE", 1), ("MG_HYBRID", 1)], ("qdot.h", "decode.h"),
              dtypes=DECODE_HYBRID_DTYPES, out=[bf16, u32], tmpl=QWEN35_MOE_TMPL),
        # Magpie's local-transformer draw chain (docs/kernels.md): one launch per step where no grid barrier exists
        _spec("magpie_lt", "magpie_lt", MAGPIE_LT_INPUTS, ["codes", "next_state"], MAGPIE_LT_TEMPLATES,
              [("MG_GRID", 0)], ("magpie_lt.h",), dtypes=MAGPIE_LT_DTYPES, out=[i32, u32], tmpl=MAGPIE_LT_357M),
    ]
}

# CUDA-only kernels (no Metal variant: they need a grid-wide barrier, which Metal cannot promise).
# The decode megakernel: one launch per token for all layers, blocks synchronized by an atomic counter.
CUDA_ONLY_SPECS = {
    s.name: s
    for s in [
        _spec("decode_megakernel", "decode_layer", DECODE_INPUTS, ["out", "sync"], DECODE_TEMPLATES,
              [("MG_GRID", 1), ("MG_DECODE_V", 1)], ("qdot.h", "decode.h"), dtypes=DECODE_DTYPES, out=[bf16, u32],
              tmpl=[bf16, 64, False, True, 4864, 896, 14, 2, 4864]),
        _spec("decode_megakernel_v2", "decode_layer", DECODE_INPUTS, ["out", "sync"], DECODE_TEMPLATES,
              [("MG_GRID", 1), ("MG_DECODE_V", 2)], ("qdot.h", "decode.h"), dtypes=DECODE_DTYPES, out=[bf16, u32],
              tmpl=[bf16, 64, False, True, 4864, 896, 14, 2, 4864]),
        _spec("decode_megakernel_moe", "decode_layer", DECODE_MOE_INPUTS, ["out", "sync"], DECODE_MOE_TEMPLATES,
              [("MG_GRID", 1), ("MG_DECODE_V", 1), ("MG_MOE", 1)], ("qdot.h", "decode.h"), dtypes=DECODE_MOE_DTYPES,
              out=[bf16, u32], tmpl=QWEN3_MOE_TMPL),
        # MLX-quantized weights (4 or 8 bits): mlx_lm.convert's 4-bit, group 64, routers at 8 bits
        _spec("decode_megakernel_q", "decode_layer", DECODE_Q_INPUTS, ["out", "sync"], DECODE_TEMPLATES + QUANT_TEMPLATES,
              [("MG_GRID", 1), ("MG_DECODE_V", 1), ("MG_QUANT", 1)], ("qdot.h", "decode.h"),
              dtypes=_quant_dtypes(DECODE_INPUTS, DECODE_DTYPES, QUANT_WEIGHTS), out=[bf16, u32],
              tmpl=[bf16, 128, True, False, 3072, 1024, 16, 8, 3072, 4, 64, 8, 64]),
        _spec("decode_megakernel_moe_q", "decode_layer", DECODE_MOE_Q_INPUTS, ["out", "sync"],
              DECODE_MOE_TEMPLATES + QUANT_TEMPLATES, [("MG_GRID", 1), ("MG_DECODE_V", 1), ("MG_MOE", 1), ("MG_QUANT", 1)],
              ("qdot.h", "decode.h"), dtypes=_quant_dtypes(DECODE_MOE_INPUTS, DECODE_MOE_DTYPES, QUANT_MOE_WEIGHTS),
              out=[bf16, u32], tmpl=QWEN3_MOE_TMPL + [4, 64, 8, 64]),
        _spec("decode_megakernel_hybrid", "decode_layer", DECODE_HYBRID_INPUTS, ["out", "sync"],
              DECODE_HYBRID_TEMPLATES, [("MG_GRID", 1), ("MG_DECODE_V", 1), ("MG_MOE", 1), ("MG_HYBRID", 1)],
              ("qdot.h", "decode.h"), dtypes=DECODE_HYBRID_DTYPES, out=[bf16, u32], tmpl=QWEN35_DENSE_TMPL),
        _spec("decode_megakernel_hybrid_q", "decode_layer", DECODE_HYBRID_Q_INPUTS, ["out", "sync"],
              DECODE_HYBRID_TEMPLATES + QUANT_TEMPLATES,
              [("MG_GRID", 1), ("MG_DECODE_V", 1), ("MG_MOE", 1), ("MG_HYBRID", 1), ("MG_QUANT", 1)],
              ("qdot.h", "decode.h"),
              dtypes=_quant_dtypes(DECODE_HYBRID_INPUTS, DECODE_HYBRID_DTYPES, QUANT_HYBRID_WEIGHTS),
              out=[bf16, u32], tmpl=QWEN3_NEXT_TMPL + [4, 64, 8, 64]),
        # Magpie's local-transformer draw chain in one launch, grid barriers between its steps
        _spec("magpie_lt_megakernel", "magpie_lt", MAGPIE_LT_INPUTS, ["codes", "next_state"], MAGPIE_LT_TEMPLATES,
              [("MG_GRID", 1)], ("magpie_lt.h",), dtypes=MAGPIE_LT_DTYPES, out=[i32, u32], tmpl=MAGPIE_LT_357M),
    ]
}


def _fused_form(spec: KernelSpec, name: str) -> KernelSpec:
    """A megakernel's spec without its grid barrier (MG_GRID 0): the fused path's one launch a phase, for both
    backends."""
    return replace(spec, name=name, defines=tuple((k, 0 if k == "MG_GRID" else v) for k, v in spec.defines))


# MLX-quantized weights (4 or 8 bits) on the fused path too: the quantized megakernels' specs without the grid
# barrier, so that Metal, which runs the fused path, reads 4/8-bit models as the megakernel does
SPECS.update({fused: _fused_form(CUDA_ONLY_SPECS[mega], fused) for mega, fused in (
    ("decode_megakernel_q", "decode_layer_q"), ("decode_megakernel_moe_q", "decode_layer_moe_q"),
    ("decode_megakernel_hybrid_q", "decode_layer_hybrid_q"))})


# the algorithms, for the "every kernel has both variants" check
KERNELS = ("rms_norm", "add_rms_norm", "rope", "mrope", "decode_attention", "decode_attention_split",
           "paged_decode_attention", "paged_decode_attention_split", "qk_rope_store", "kv_store",
           "attention_combine", "gemv", "gemv_bias", "gemv_q4", "gemv_q4_bias", "gemv_q8", "gemv_q8_bias",
           "sample", "moe_route", "moe_gate_up", "moe_gate_up_q4", "moe_gate_up_q8", "moe_down", "moe_down_q4",
           "moe_down_q8", "moe_gemm_gate_up", "moe_gemm_down", "moe_gemm_gate_up_q4", "moe_gemm_gate_up_q8",
           "moe_gemm_down_q4", "moe_gemm_down_q8", "moe_unpack", "moe_pack", "gated_delta_step", "gated_delta_conv_step", "gated_delta_scan", "decode_layer",
           "decode_layer_v2", "decode_layer_moe", "decode_layer_hybrid", "decode_layer_q", "decode_layer_moe_q",
           "decode_layer_hybrid_q", "magpie_lt")


# Magpie TTS's decoder step (bodies/magpie_decoder.body, docs/kernels.md "Magpie decoder kernel"): the
# step's input rows, its position, the stacked weights, the self-attention caches (written in place),
# the text's cross keys and values, the memory mask and prior, the layer flags, a float32 scratch
MAGPIE_DEC_INPUTS = ("x", "posa", "ptab", "wqkv", "wo", "wxq", "wxo", "wf1", "wf2", "norms", "fnorm", "kc", "vc",
                     "mk", "mv", "mmask", "prior", "lmask", "scratch", "params", "fparams", "dep")
MAGPIE_DEC_TEMPLATES = ("T", "R", "DM", "NH", "XD", "FF")
MAGPIE_DEC_DTYPES = [bf16, i32] + [bf16] * 13 + [f32, f32, i32, f32, i32, f32, u32]
MAGPIE_DEC_357M = [bf16, 2, 768, 12, 128, 3072]  # Magpie 357M with CFG's two rows
SPECS["magpie_decoder"] = _spec("magpie_decoder", "magpie_decoder", MAGPIE_DEC_INPUTS, ["h", "scores", "sync"],
                                MAGPIE_DEC_TEMPLATES, [("MG_GRID", 0)], ("magpie_decoder.h",),
                                dtypes=MAGPIE_DEC_DTYPES, out=[bf16, f32, u32], tmpl=MAGPIE_DEC_357M)
CUDA_ONLY_SPECS["magpie_decoder_megakernel"] = _spec(
    "magpie_decoder_megakernel", "magpie_decoder", MAGPIE_DEC_INPUTS, ["h", "scores", "sync"], MAGPIE_DEC_TEMPLATES,
    [("MG_GRID", 1)], ("magpie_decoder.h",), dtypes=MAGPIE_DEC_DTYPES, out=[bf16, f32, u32], tmpl=MAGPIE_DEC_357M)
KERNELS = KERNELS + ("magpie_decoder",)


def with_defines(name: str, label: str, defines=(), body=None) -> str:
    """A copy of spec `name` built otherwise, registered beside it (in SPECS or CUDA_ONLY_SPECS) as
    `<name>__<label>`: `defines` replace or add to its #defines, and `body` (a bodies/ name) replaces its body.
    Returns the copy's name. For timing a kernel against another build of it and for tests that hold two builds
    to the same bits (benchmarks/decode_step_probe.py --variants, tests/test_decode_paths.py)."""
    table = CUDA_ONLY_SPECS if name in CUDA_ONLY_SPECS else SPECS
    new = f"{name}__{label}"
    if new not in table:
        base = table[name]
        kept = tuple(d for d in base.defines if d[0] not in dict(defines))
        table[new] = replace(base, name=new, body=body or base.body, defines=kept + tuple(defines))
    return new


def header(spec: KernelSpec, backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(backend)
    defines = "".join(f"#define {k} {int(v)}\n" for k, v in spec.defines)
    extra = "".join(_read(f"preludes/{p}") for p in spec.preludes)
    tail = _read("preludes/cuda_tail.h") if backend == "cuda" else ""
    # the variant's #defines come before the extra preludes, which may read them (decode.h's MG_QROW_CHUNKS)
    return (f"// metalgen kernel {spec.name} ({backend})\n" + _read(f"preludes/{backend}.h")
            + _read("preludes/common.h") + defines + extra + tail)


def body(spec: KernelSpec, backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(backend)
    return _read(f"preludes/{backend}_entry.h") + _read(f"bodies/{spec.body}.body")


def variant_name(spec: KernelSpec, dtype) -> str:
    """e.g. rms_norm_bf16, gemv_q4_f16."""
    return f"{spec.name}_{_short(dtype)}"


def _short(dtype) -> str:
    return {mx.bfloat16: "bf16", mx.float16: "f16", mx.float32: "f32"}.get(dtype, str(dtype).split(".")[-1])


# ---------------------------------------------------------------------------------------------
# The translation units MLX generates (rebuilt here for the CI checks only)

_METAL_TYPE = {mx.bfloat16: "bfloat16_t", mx.float16: "float16_t", mx.float32: "float", mx.int32: "int32_t",
               mx.uint32: "uint32_t", mx.int64: "int64_t", mx.uint8: "uint8_t", mx.bool_: "bool"}
_CUDA_TYPE = {mx.bfloat16: "__nv_bfloat16", mx.float16: "__half", mx.float32: "float", mx.int32: "int32_t",
              mx.uint32: "uint32_t", mx.int64: "int64_t", mx.uint8: "uint8_t", mx.bool_: "bool"}

METAL_ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"), ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"), ("grid_origin", "uint3"), ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"), ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"), ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"), ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"), ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"), ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"), ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"), ("threads_per_simdgroup", "uint"), ("threads_per_threadgroup", "uint3"),
]


def _tvalue(v, table):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return table[v]


def metal_program(spec: KernelSpec, input_sizes=None) -> str:
    """The Metal text mx.fast.metal_kernel compiles for spec.example (after MLX's own utilities,
    which the caller supplies: the real ones on a Mac, tests/metal_stub.h in CI)."""
    ex = spec.example
    src = body(spec, "metal")
    kname = "custom_kernel_" + variant_name(spec, ex["tmpl"][0])
    out = [header(spec, "metal")]
    tparams = []
    for n, v in zip(spec.templates, ex["tmpl"]):
        tparams.append(("bool " if isinstance(v, bool) else "int " if isinstance(v, int) else "typename ") + n)
    if tparams:
        out.append("template <" + ", ".join(tparams) + ">\n")
    out.append(f"[[kernel]] void {kname}(\n")
    args = []
    idx = 0
    for i, (n, dt) in enumerate(zip(spec.inputs, ex["dtypes"])):
        size = (input_sizes or {}).get(n, 1 << 20)
        loc = "constant" if size < 8 else "device"
        args.append(f"  const {loc} {_METAL_TYPE[dt]}* {n} [[buffer({idx})]]")
        idx += 1
    for n, dt in zip(spec.outputs, ex["out"]):
        args.append(f"  device {_METAL_TYPE[dt]}* {n} [[buffer({idx})]]")
        idx += 1
    for attr, ty in METAL_ATTRIBUTES:
        if attr in src:
            args.append(f"  {ty} {attr} [[{attr}]]")
    out.append(",\n".join(args) + ") {\n")
    out.append(src)
    out.append("\n}\n")
    if tparams:
        tdef = kname + "<" + ", ".join(_tvalue(v, _METAL_TYPE) for v in ex["tmpl"]) + ">"
        out.append(f'\ntemplate [[host_name("{kname}")]] [[kernel]] decltype({tdef}) {tdef};\n')
    return "".join(out)


def cuda_program(spec: KernelSpec) -> str:
    """The CUDA text mx.fast.cuda_kernel compiles for spec.example (MLX's default header, which
    includes its device utilities and cooperative_groups.h, is the caller's to supply)."""
    ex = spec.example
    kname = "custom_kernel_" + variant_name(spec, ex["tmpl"][0])
    out = [header(spec, "cuda"), "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"]
    out.append(f"__global__ void {kname}(\n")
    args = [f"    const {_CUDA_TYPE[dt]}* {n}" for n, dt in zip(spec.inputs, ex["dtypes"])]
    args += [f"    {_CUDA_TYPE[dt]}* {n}" for n, dt in zip(spec.outputs, ex["out"])]
    out.append(",\n".join(args) + ") {\n")
    for n, v in zip(spec.templates, ex["tmpl"]):
        if isinstance(v, bool):
            out.append(f"  constexpr bool {n} = {'true' if v else 'false'};\n")
        elif isinstance(v, int):
            out.append(f"  constexpr int {n} = {v};\n")
        else:
            out.append(f"  using {n} = {_CUDA_TYPE[v]};\n")
    out.append("\n" + body(spec, "cuda") + "\n}\n\n} // namespace mlx::core::cu\n")
    return "".join(out)
