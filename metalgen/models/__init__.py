"""Model registry: one module per Hugging Face `model_type`."""

from __future__ import annotations

import importlib
import logging

from ..errors import MetalgenError

log = logging.getLogger("metalgen.models")

# model_type -> module under metalgen.models defining ModelArgs and Model
MODEL_TYPES = {
    "qwen2": "qwen2",
    "qwen2_moe": "qwen2_moe",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "qwen3_next": "qwen3_next",
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
    "qwen3_omni_moe": "qwen3_omni_moe",
}


def get_model_classes(model_type: str):
    """Return (Model, ModelArgs) for a config's model_type."""
    if model_type not in MODEL_TYPES:
        raise MetalgenError(
            f"unknown model_type '{model_type}' (supported: {', '.join(sorted(MODEL_TYPES))})"
        )
    module = importlib.import_module(f"{__name__}.{MODEL_TYPES[model_type]}")
    return module.Model, module.ModelArgs


def build_model(config: dict):
    """Instantiate the model a config.json describes (weights still random and lazy)."""
    if "model_type" not in config:
        raise MetalgenError("config.json has no 'model_type'")
    model_cls, args_cls = get_model_classes(config["model_type"])
    if config.get("vision_config") is not None:
        log.warning("%s: loading the text decoder; image input is not supported (vision weights skipped)",
                    config["model_type"])
    return model_cls(args_cls.from_dict(config))
