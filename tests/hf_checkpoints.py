"""Tiny random Qwen checkpoints saved by Hugging Face transformers' own `save_pretrained`."""

from __future__ import annotations

from pathlib import Path


# tiny MoE shapes: 8 experts, top 2 (qwen2_moe adds a shared expert)
MOE_BASE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
# router weights this large spread the router logits (std ~4), so that no two experts' probabilities
# come within float32 noise of each other at the top-k edge: a near-tie would let the two
# implementations' last-bit differences pick different experts
ROUTER_SCALE = 0.5


def save_tiny_hf_model(folder: Path, model_type: str, seed: int = 0, packed: bool = False, **overrides):
    """Build a tiny transformers model with every parameter random (biases and norm scales
    too, which transformers initializes to constants), save it, return the torch model.
    model_type: qwen2, qwen3, qwen2_moe, qwen3_moe. `save_pretrained` writes MoE experts one tensor
    each (the published layout); packed=True writes transformers 5's in-memory layout instead
    (mlp.experts.gate_up_proj / down_proj, experts on axis 0)."""
    import torch
    from transformers import (Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                              Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

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
    if model_type.endswith("_moe"):
        base.update(MOE_BASE)
        if model_type == "qwen2_moe":
            base["shared_expert_intermediate_size"] = 48
    base.update(overrides)
    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
               "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
               "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM)}
    if model_type not in classes:
        raise ValueError(model_type)
    config_cls, model_cls = classes[model_type]
    model = model_cls(config_cls(**base))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(ROUTER_SCALE * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
    model.eval()
    model.save_pretrained(folder)
    if packed:
        from safetensors.torch import save_file

        for f in Path(folder).glob("*.safetensors*"):
            f.unlink()
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(Path(folder) / "model.safetensors"), metadata={"format": "pt"})
    return model
