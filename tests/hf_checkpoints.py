"""Tiny random Qwen checkpoints saved by Hugging Face transformers' own `save_pretrained`."""

from __future__ import annotations

from pathlib import Path


# tiny MoE shapes: 8 experts, top 2 (qwen2_moe adds a shared expert)
MOE_BASE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
# router weights this large spread the router logits (std ~4), so that no two experts' probabilities
# come within float32 noise of each other at the top-k edge: a near-tie would let the two
# implementations' last-bit differences pick different experts
ROUTER_SCALE = 0.5


# tiny hybrid shapes: four layers (three Gated DeltaNet, then full attention), 2 key heads of 16 and
# 4 value heads of 8 in the linear layers, attention heads of 16 with a quarter of their dims turned
HYBRID = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
HYBRID_BASE = dict(num_hidden_layers=4, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                   linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)


def save_tiny_hf_model(folder: Path, model_type: str, seed: int = 0, packed: bool = False, **overrides):
    """Build a tiny transformers model with every parameter random (biases and norm scales
    too, which transformers initializes to constants), save it, return the torch model.
    model_type: qwen2, qwen3, qwen2_moe, qwen3_moe, and the hybrid qwen3_next, qwen3_5 (the text model,
    Qwen3_5ForCausalLM), qwen3_5_moe. `save_pretrained` writes MoE experts one tensor
    each (the published layout); packed=True writes transformers 5's in-memory layout instead
    (mlp.experts.gate_up_proj / down_proj, experts on axis 0)."""
    import torch
    from transformers import (Qwen2Config, Qwen2ForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM,
                              Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig,
                              Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                              Qwen3MoeForCausalLM, Qwen3NextConfig, Qwen3NextForCausalLM)

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
    if model_type in HYBRID:
        base.update(HYBRID_BASE)
    if model_type.endswith("_moe") or model_type == "qwen3_next":
        base.update(MOE_BASE)
        if model_type != "qwen3_moe":
            base["shared_expert_intermediate_size"] = 48
    base.update(overrides)
    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
               "qwen2_moe": (Qwen2MoeConfig, Qwen2MoeForCausalLM),
               "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
               "qwen3_next": (Qwen3NextConfig, Qwen3NextForCausalLM),
               "qwen3_5": (Qwen3_5TextConfig, Qwen3_5ForCausalLM),
               "qwen3_5_moe": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM)}
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


def rel_err(a, b) -> float:
    """max |a - b| over max |b|: the parity tests' measure."""
    import numpy as np

    return float(np.abs(a - b).max() / np.abs(b).max())


def saved_pair(tmp_path_factory, name: str, model_type: str, overrides: dict):
    """A tiny checkpoint saved by transformers into a fresh folder named for the case, and ours loaded
    from it: (the torch model, our model)."""
    from metalgen.loading import load_model, read_config

    folder = tmp_path_factory.mktemp(name.replace(".", "_"))
    hf = save_tiny_hf_model(folder, model_type, **overrides)
    return hf, load_model(folder, read_config(folder))
