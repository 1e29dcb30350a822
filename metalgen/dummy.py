"""`dummy:<shape>` models: real architectures with seeded random weights, made in memory.

They serve benchmarks, the offline demo and tests: the compute and memory traffic of the
real model, with the real Qwen tokenizer shipped in this package, and no download. Any shape takes a
`-4bit` or `-8bit` suffix (`dummy:qwen3-30b-a3b-4bit`): its weights are then MLX affine-quantized
with group size 64 as `mlx_lm.convert` quantizes that model type, so that quantized speed can be
measured offline.
"""

from __future__ import annotations

import re
import zlib
from importlib import resources
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from .errors import MetalgenError
from .models import build_model

_QWEN_VOCAB = 151936
_QWEN_EOS = [151645, 151643]  # <|im_end|>, <|endoftext|>
QUANT_GROUP_SIZE = 64


def _qwen2(hidden, layers, heads, kv_heads, inter, tied=True, vocab=_QWEN_VOCAB):
    return dict(
        model_type="qwen2", hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inter,
        vocab_size=vocab, tie_word_embeddings=tied, rms_norm_eps=1e-6,
        rope_theta=1000000.0, max_position_embeddings=32768,
    )


def _qwen3(hidden, layers, heads, kv_heads, inter, tied=True, vocab=_QWEN_VOCAB):
    return dict(
        model_type="qwen3", hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=128,
        intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=tied,
        rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=40960,
    )


def _qwen3_moe(hidden, layers, heads, kv_heads, inter, moe_inter, experts, top_k, **extra):
    return _qwen3(hidden, layers, heads, kv_heads, inter, tied=False) | dict(
        model_type="qwen3_moe", moe_intermediate_size=moe_inter, num_experts=experts,
        num_experts_per_tok=top_k, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
    ) | extra


def _qwen2_moe(hidden, layers, heads, kv_heads, inter, moe_inter, shared, experts, top_k, **extra):
    return _qwen2(hidden, layers, heads, kv_heads, inter, tied=False) | dict(
        model_type="qwen2_moe", moe_intermediate_size=moe_inter, shared_expert_intermediate_size=shared,
        num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], qkv_bias=True,
    ) | extra


def _hybrid(model_type, hidden, layers, heads, kv_heads, lin_k_heads, lin_v_heads, vocab, **extra):
    # Qwen3-Next / Qwen3.5: every fourth layer full attention (head_dim 256, a quarter of it turned),
    # the others Gated DeltaNet with 128-dim key and value heads and a 4-tap conv
    return dict(
        model_type=model_type, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=256, vocab_size=vocab, tie_word_embeddings=False,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                            "partial_rotary_factor": 0.25},
        max_position_embeddings=262144, full_attention_interval=4, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=lin_k_heads,
        linear_num_value_heads=lin_v_heads,
    ) | extra


def _hybrid_moe(model_type, hidden, layers, heads, kv_heads, lin_k_heads, lin_v_heads, vocab, experts, top_k,
                moe_inter, shared, **extra):
    moe = dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=moe_inter,
               shared_expert_intermediate_size=shared, norm_topk_prob=True, decoder_sparse_step=1,
               mlp_only_layers=[])
    return _hybrid(model_type, hidden, layers, heads, kv_heads, lin_k_heads, lin_v_heads, vocab, **(moe | extra))


_QWEN35_VOCAB = 248320

# The shapes of the released checkpoints' config.json files.
SHAPES: Dict[str, Dict[str, Any]] = {
    "qwen2.5-0.5b": _qwen2(896, 24, 14, 2, 4864),
    "qwen2.5-1.5b": _qwen2(1536, 28, 12, 2, 8960),
    "qwen2.5-3b": _qwen2(2048, 36, 16, 2, 11008),
    "qwen2.5-7b": _qwen2(3584, 28, 28, 4, 18944, tied=False, vocab=152064),
    "qwen3-0.6b": _qwen3(1024, 28, 16, 8, 3072),
    "qwen3-1.7b": _qwen3(2048, 28, 16, 8, 6144),
    "qwen3-4b": _qwen3(2560, 36, 32, 8, 9728),
    "qwen3-8b": _qwen3(4096, 36, 32, 8, 12288, tied=False),
    # Qwen3-30B-A3B (and Qwen3-Coder-30B-A3B): 128 experts, top 8, 3.3B active of 30.5B
    "qwen3-30b-a3b": _qwen3_moe(2048, 48, 32, 4, 6144, 768, 128, 8),
    # Qwen3-235B-A22B: 22B active of 235B (470 GB in bf16, ~130 GB in 4 bits)
    "qwen3-235b-a22b": _qwen3_moe(4096, 94, 64, 4, 12288, 1536, 128, 8),
    # Qwen1.5-MoE-A2.7B: 60 experts, top 4, and a shared expert with its sigmoid gate
    "qwen1.5-moe-a2.7b": _qwen2_moe(2048, 24, 16, 16, 5632, 1408, 5632, 60, 4, max_position_embeddings=8192),
    # Qwen3-Next-80B-A3B: 512 experts, top 10, a shared expert; 3B active
    "qwen3-next-80b-a3b": _hybrid_moe("qwen3_next", 2048, 48, 16, 2, 16, 32, _QWEN_VOCAB, 512, 10, 512, 512,
                                      intermediate_size=5120),
    # the dense Qwen3.5 sizes (image-text checkpoints; these are their text_config): key heads of the
    # linear layers 16, value heads 16 / 16 / 32 / 32 / 48; 0.8B, 2B and 4B tie their embeddings
    "qwen3.5-0.8b": _hybrid("qwen3_5", 1024, 24, 8, 2, 16, 16, _QWEN35_VOCAB, intermediate_size=3584,
                            tie_word_embeddings=True),
    "qwen3.5-2b": _hybrid("qwen3_5", 2048, 24, 8, 2, 16, 16, _QWEN35_VOCAB, intermediate_size=6144,
                          tie_word_embeddings=True),
    "qwen3.5-4b": _hybrid("qwen3_5", 2560, 32, 16, 4, 16, 32, _QWEN35_VOCAB, intermediate_size=9216,
                          tie_word_embeddings=True),
    "qwen3.5-9b": _hybrid("qwen3_5", 4096, 32, 16, 4, 16, 32, _QWEN35_VOCAB, intermediate_size=12288),
    "qwen3.5-27b": _hybrid("qwen3_5", 5120, 64, 24, 4, 16, 48, _QWEN35_VOCAB, intermediate_size=17408),
    # Qwen3.5-35B-A3B, Qwen3.5-122B-A10B and Qwen3.5-397B-A17B: every layer sparse, a shared expert
    # as wide as a routed one
    "qwen3.5-35b-a3b": _hybrid_moe("qwen3_5_moe", 2048, 40, 16, 2, 16, 32, _QWEN35_VOCAB, 256, 8, 512, 512),
    "qwen3.5-122b-a10b": _hybrid_moe("qwen3_5_moe", 3072, 48, 32, 2, 16, 64, _QWEN35_VOCAB, 256, 8, 1024, 1024),
    "qwen3.5-397b-a17b": _hybrid_moe("qwen3_5_moe", 4096, 60, 32, 2, 16, 64, _QWEN35_VOCAB, 512, 10, 1024, 1024),
    # Small enough for tests and a quick look on any machine.
    "tiny-qwen3": _qwen3(128, 2, 4, 2, 256) | {"head_dim": 32, "max_position_embeddings": 2048},
    # qwen3-8b's widths in two layers: where the dense 4-bit kernels make each phase's chunk sums of x once
    # (H >= 4096, docs/decode.md), in a model quick to build
    "tiny-qwen3-h4096": _qwen3(4096, 2, 32, 8, 12288) | {"max_position_embeddings": 2048},
    # 7 query heads of 128 on one KV head (Qwen2.5-7B's 28 / 4): where the decode kernels' attention items
    # take 2 query heads of a KV head each (long contexts), the last item of a split takes 1
    "tiny-qwen2-gqa7": _qwen2(896, 2, 7, 1, 256) | {"max_position_embeddings": 2048},
    # layer 1 dense (mlp_only_layers), layers 0 and 2 sparse: 8 experts, top 2; head_dim 64, the
    # smallest the decode kernels take
    "tiny-qwen3-moe": _qwen3_moe(128, 3, 4, 2, 256, 64, 8, 2, head_dim=64, max_position_embeddings=2048,
                                 mlp_only_layers=[1], tie_word_embeddings=True),
    # hybrid stacks: layers 0-2 Gated DeltaNet (2 key heads, 4 value heads of 64), layer 3 attention
    # (head_dim 64, 16 dims turned); tiny-qwen3-next has layer 1 dense
    "tiny-qwen3.5": _hybrid("qwen3_5", 128, 4, 4, 2, 2, 4, _QWEN_VOCAB, intermediate_size=256, head_dim=64,
                            linear_key_head_dim=64, linear_value_head_dim=64, max_position_embeddings=2048,
                            tie_word_embeddings=True),
    "tiny-qwen3-next": _hybrid_moe("qwen3_next", 128, 4, 4, 2, 2, 4, _QWEN_VOCAB, 8, 2, 64, 64,
                                   intermediate_size=256, head_dim=64, linear_key_head_dim=64,
                                   linear_value_head_dim=64, max_position_embeddings=2048, mlp_only_layers=[1]),
    "tiny-qwen3.5-moe": _hybrid_moe("qwen3_5_moe", 128, 4, 4, 2, 2, 4, _QWEN_VOCAB, 8, 2, 64, 64, head_dim=64,
                                    linear_key_head_dim=64, linear_value_head_dim=64,
                                    max_position_embeddings=2048, tie_word_embeddings=True),
    "tiny-qwen2-moe": _qwen2_moe(256, 2, 4, 2, 256, 64, 128, 8, 2, max_position_embeddings=2048,
                                 tie_word_embeddings=True),
}

TOKENIZER_ASSET = "qwen3-tokenizer"


def tokenizer_folder() -> Path:
    """The Qwen tokenizer files shipped as package data."""
    return Path(str(resources.files("metalgen") / "assets" / TOKENIZER_ASSET))


def text_shapes() -> Dict[str, Dict[str, Any]]:
    """Every shape a text model can be built from: SHAPES, and the Qwen3-Omni shapes (metalgen.omni.dummy),
    whose thinker is a text model of its own (`model_type` qwen3_omni_moe)."""
    from .omni.dummy import SHAPES as OMNI_SHAPES

    return {**SHAPES, **OMNI_SHAPES}


def parse_quantized(name: str) -> Tuple[str, int, int]:
    """'qwen3-8b-4bit' -> ('qwen3-8b', 4, 64); 'qwen3-8b-4bit-g32' -> ('qwen3-8b', 4, 32); no suffix ->
    bits 0. The group size defaults to mlx_lm.convert's 64; community conversions also use 32 and 128."""
    m = re.fullmatch(r"(.+)-(4|8)bit(?:-g(32|64|128))?", name)
    if m:
        base, bits, group = m.group(1), int(m.group(2)), int(m.group(3) or QUANT_GROUP_SIZE)
    else:
        base, bits, group = name, 0, 0
    if base not in text_shapes():
        raise MetalgenError(f"unknown dummy shape '{name}' (known: {', '.join(text_shapes())}; "
                            "any of them with -4bit or -8bit, and -g32 or -g128 for other group sizes)")
    return base, bits, group


def parse_shape(name: str) -> Tuple[str, int]:
    """'qwen3-30b-a3b-4bit' -> ('qwen3-30b-a3b', 4); no suffix -> bits 0."""
    return parse_quantized(name)[:2]


def dummy_config(shape: str) -> Dict[str, Any]:
    """The config of `dummy:<shape>`, with its MLX `quantization` entry for a -4bit / -8bit shape."""
    base, bits, group = parse_quantized(shape)
    config = dict(text_shapes()[base], eos_token_ids=list(_QWEN_EOS))
    if bits:
        config["quantization"] = {"group_size": group, "bits": bits}
    return config


def quantize_like_mlx_lm(model: nn.Module, config: Dict[str, Any]) -> None:
    """Swap in quantized layers as mlx_lm.convert does for the config's model type: every layer with
    an input size divisible by the group size, Qwen3-MoE routers (`mlp.gate`) at 8 bits."""
    q = config["quantization"]
    gs, bits = q["group_size"], q["bits"]

    def predicate(path: str, module: nn.Module):
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % gs:
            return False
        # the routers (and the hybrid stacks' shared-expert gates) as mlx-lm keeps them, at 8 bits
        hybrid_moe = config["model_type"] in ("qwen3_next", "qwen3_5_moe")
        if ((config["model_type"] == "qwen3_moe" or hybrid_moe) and path.endswith("mlp.gate")) or \
                (hybrid_moe and path.endswith("shared_expert_gate")):
            q[path] = {"group_size": gs, "bits": 8}
            return q[path]
        return True

    nn.quantize(model, gs, bits, class_predicate=predicate)


def _key(seed: int, name: str) -> mx.array:
    # one key per parameter, from its name: independent of the order parameters are made in
    return mx.random.key((seed * 1000003 + zlib.crc32(name.encode())) & 0x7FFFFFFF)


def random_weight_dict(model: nn.Module, seed: int = 0, dtype=mx.bfloat16) -> Dict[str, mx.array]:
    """Seeded N(0, 0.02) weights for matrices, ones for norm scales, as a flat dict of lazy arrays
    (nothing is made until evaluated). Quantized layers get random float weights quantized with
    their own group size and bits."""
    out: Dict[str, mx.array] = {}
    quantized = {}
    for path, module in model.named_modules():
        if "scales" in module and hasattr(module, "group_size"):
            quantized[path] = module
    for name, p in tree_flatten(model.parameters()):
        path, _, leaf = name.rpartition(".")
        module = quantized.get(path)
        if module is not None and leaf in ("weight", "scales", "biases"):
            if leaf == "weight":
                # (..., out, in): the float shape behind the packed words
                shape = tuple(module.scales.shape[:-1]) + (module.scales.shape[-1] * module.group_size,)
                w = (0.02 * mx.random.normal(shape, key=_key(seed, name))).astype(dtype)
                wq, s, b = mx.quantize(w, module.group_size, module.bits)
                out[f"{path}.weight"], out[f"{path}.scales"], out[f"{path}.biases"] = wq, s, b
            continue
        if name.endswith("norm.weight"):
            out[name] = mx.ones(p.shape, dtype)
        else:
            out[name] = (0.02 * mx.random.normal(p.shape, key=_key(seed, name))).astype(dtype)
    return out


def random_weights(model, seed: int = 0, dtype=mx.bfloat16):
    """`random_weight_dict` as the nested tree `model.update` takes."""
    return tree_unflatten(list(random_weight_dict(model, seed, dtype).items()))


def load_dummy(shape: str, dtype=None):
    """Build `dummy:<shape>`: returns (model, tokenizer), bf16 unless `dtype` says otherwise. The
    weights are made (and MoE experts stacked across layers) a layer at a time, so that memory holds
    the model once."""
    from .loading import finish_loading, load_tokenizer

    config = dummy_config(shape)
    model = build_model(config)
    if "quantization" in config:
        quantize_like_mlx_lm(model, config)
    weights = random_weight_dict(model, dtype=dtype or mx.bfloat16)
    weights = model.pack_weights(weights)
    model.load_weights(list(weights.items()), strict=True)
    finish_loading(model)
    return model, load_tokenizer(tokenizer_folder(), config["eos_token_ids"])
