"""Tiny random Qwen checkpoints saved by Hugging Face transformers' own `save_pretrained`."""

from __future__ import annotations

from pathlib import Path


def save_tiny_hf_model(folder: Path, model_type: str, seed: int = 0, **overrides):
    """Build a tiny transformers model with every parameter random (biases and norm scales
    too, which transformers initializes to constants), save it, return the torch model."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    base = dict(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        attn_implementation="eager",
    )
    base.update(overrides)
    if model_type == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**base))
    elif model_type == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**base))
    else:
        raise ValueError(model_type)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(folder)
    return model
