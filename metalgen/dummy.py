"""`dummy:<shape>` models: real architectures with seeded random weights, made in memory.

They serve benchmarks, the offline demo and tests: the compute and memory traffic of the
real model, with the real Qwen tokenizer shipped in this package, and no download.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Dict

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from .errors import MetalgenError
from .models import build_model

_QWEN_VOCAB = 151936
_QWEN_EOS = [151645, 151643]  # <|im_end|>, <|endoftext|>


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
    # Small enough for tests and a quick look on any machine.
    "tiny-qwen3": _qwen3(128, 2, 4, 2, 256) | {"head_dim": 32, "max_position_embeddings": 2048},
}

TOKENIZER_ASSET = "qwen3-tokenizer"


def tokenizer_folder() -> Path:
    """The Qwen tokenizer files shipped as package data."""
    return Path(str(resources.files("metalgen") / "assets" / TOKENIZER_ASSET))


def dummy_config(shape: str) -> Dict[str, Any]:
    if shape not in SHAPES:
        raise MetalgenError(f"unknown dummy shape '{shape}' (known: {', '.join(SHAPES)})")
    return dict(SHAPES[shape], eos_token_ids=list(_QWEN_EOS))


def random_weights(model, seed: int = 0, dtype=mx.bfloat16):
    """Seeded N(0, 0.02) weights for matrices and ones for norm scales."""
    key = mx.random.key(seed)
    params = tree_flatten(model.parameters())
    keys = mx.random.split(key, len(params))
    new = []
    for (name, p), k in zip(params, keys):
        if name.endswith("norm.weight"):
            value = mx.ones(p.shape, dtype)
        else:
            value = (0.02 * mx.random.normal(p.shape, key=k)).astype(dtype)
        new.append((name, value))
    return tree_unflatten(new)


def load_dummy(shape: str, dtype=None):
    """Build `dummy:<shape>`: returns (model, tokenizer), bf16 unless `dtype` says otherwise."""
    from .loading import load_tokenizer

    config = dummy_config(shape)
    model = build_model(config)
    model.update(random_weights(model, dtype=dtype or mx.bfloat16))
    model.eval()
    mx.eval(model.parameters())
    return model, load_tokenizer(tokenizer_folder(), config["eos_token_ids"])
