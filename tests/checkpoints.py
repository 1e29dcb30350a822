"""Tiny random checkpoints in Hugging Face layout written with MLX (no torch needed)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from metalgen.dummy import random_weights
from metalgen.models import build_model

from conftest import copy_tokenizer

TINY_QWEN3 = dict(
    model_type="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, intermediate_size=128, vocab_size=151936,
    max_position_embeddings=256, rope_theta=1000000.0, tie_word_embeddings=True,
    eos_token_id=151645,
)


def write_checkpoint(folder: Path, config=None, *, shards=1, quantize=None, dtype=mx.float32,
                     tokenizer=True, seed=0):
    """Write config.json, safetensors (optionally sharded with an index, optionally
    MLX-quantized) and the tokenizer files; return the in-memory model."""
    config = dict(config or TINY_QWEN3)
    folder.mkdir(parents=True, exist_ok=True)
    model = build_model(config)
    model.update(random_weights(model, seed=seed, dtype=dtype))
    if quantize:
        nn.quantize(model, quantize["group_size"], quantize["bits"])
        config["quantization"] = dict(quantize)
    weights = dict(tree_flatten(model.parameters()))
    names = sorted(weights)
    if shards == 1:
        mx.save_safetensors(str(folder / "model.safetensors"), weights)
    else:
        weight_map = {}
        for i in range(shards):
            part = {n: weights[n] for n in names[i::shards]}
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            mx.save_safetensors(str(folder / fname), part)
            weight_map.update({n: fname for n in part})
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )
    (folder / "config.json").write_text(json.dumps(config))
    if tokenizer:
        copy_tokenizer(folder)
    return model


# Small-vocabulary decoders for the batching tests (metalgen.batch, metalgen.batch_cache): one of each
# attention kind (qwen2's q/k/v biases, qwen3's per-head q/k norms) and an MoE stack (layer 1 dense).
BATCH_CONFIGS = {
    "qwen2": dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, vocab_size=512, max_position_embeddings=256,
                  rope_theta=10000.0, tie_word_embeddings=False),
    "qwen3": dict(TINY_QWEN3, vocab_size=512),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, intermediate_size=96, moe_intermediate_size=64,
                      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                      vocab_size=512, tie_word_embeddings=True, max_position_embeddings=256,
                      decoder_sparse_step=1, rms_norm_eps=1e-6, rope_theta=1e6),
}
# the same with heads of 64 dims, which a batch's traced step turns and stores in one kernel launch
# (kernels_metal.qk_rope_store: a multiple of 64)
BATCH_CONFIGS_HD64 = {
    "qwen2": dict(BATCH_CONFIGS["qwen2"], hidden_size=256),
    "qwen3": dict(BATCH_CONFIGS["qwen3"], head_dim=64),
    "qwen3_moe": dict(BATCH_CONFIGS["qwen3_moe"], head_dim=64),
}

# hybrid stacks for the same tests: Gated DeltaNet layers (2 key heads of 16, 4 value heads of 8, a 4-tap conv)
# and gated attention layers (heads of 16). Qwen3-Next: layer 3 attention (the default interval), a quarter of
# each head turned, sparse layers but layer 1; Qwen3.5: attention first and third, whole heads turned, dense.
_HYBRID = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               intermediate_size=96, vocab_size=512, max_position_embeddings=256, rms_norm_eps=1e-6,
               rope_theta=10000.0, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=8,
               linear_num_key_heads=2, linear_num_value_heads=4, tie_word_embeddings=False)
HYBRID_BATCH_CONFIGS = {
    "qwen3_next": dict(_HYBRID, model_type="qwen3_next", partial_rotary_factor=0.25, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1]),
    "qwen3_5": dict(_HYBRID, model_type="qwen3_5", partial_rotary_factor=1.0,
                    layer_types=["full_attention", "linear_attention", "full_attention", "linear_attention"]),
}


def tiny_model(config: dict, seed: int = 0):
    """An in-memory model of `config` with seeded random float32 weights (no files)."""
    from metalgen.loading import finish_loading

    model = build_model(config)
    weights = dict(tree_flatten(random_weights(model, seed=seed, dtype=mx.float32)))
    if model.spec.hybrid is not None:
        weights = _lasting_states(weights, seed)
    weights = model.pack_weights(weights)
    model.load_weights(list(weights.items()))
    finish_loading(model)
    return model


def _lasting_states(weights: dict, seed: int) -> dict:
    """Gated DeltaNet layers whose states matter: with N(0, 0.02) weights a state decays by half a token
    (A_log 0, dt_bias 0) and barely moves the logits, so a test that lost a state could still pass. Here
    the decay is ~1% a token and the layer's projections 10x larger."""
    key = mx.random.key(seed + 1)
    for name in list(weights):
        if name.endswith(".A_log"):
            weights[name] = -4.0 + 0.5 * mx.random.normal(weights[name].shape, key=key)
        elif ".linear_attn.in_proj" in name or ".linear_attn.out_proj" in name:
            weights[name] = 10 * weights[name]
    return weights


def prefill_group(model, prompts):
    """Prompts (id lists) prefilled together, left-padded, as metalgen.batch does before they join: (per-layer
    caches, the last logits (G, vocab))."""
    from metalgen.batch_cache import empty_group_caches

    T = max(map(len, prompts))
    padding = [T - len(p) for p in prompts]
    group = empty_group_caches(model, padding)
    ids = mx.array([[0] * n + p for n, p in zip(padding, prompts)])
    logits = model(ids, cache=group)[:, -1]
    mx.eval(logits, [c.state for c in group])
    return group, logits
