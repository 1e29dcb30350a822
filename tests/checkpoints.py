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


def tiny_model(config: dict, seed: int = 0):
    """An in-memory model of `config` with seeded random float32 weights (no files)."""
    from metalgen.loading import finish_loading

    model = build_model(config)
    weights = model.pack_weights(dict(tree_flatten(random_weights(model, seed=seed, dtype=mx.float32))))
    model.load_weights(list(weights.items()))
    finish_loading(model)
    return model
