"""Qwen3-Omni checkpoints from a folder, a hub id or `dummy:<shape>` (metalgen.omni.dummy).

The published layout is one Hugging Face folder: config.json (`model_type: qwen3_omni_moe`),
safetensors with `thinker.*`, `talker.*` and `code2wav.*`, generation_config.json, and the Qwen
tokenizer with Omni's added tokens. Loading is strict for the parts built; the image encoder's
tensors are skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, Optional

import mlx.core as mx

from ..errors import MetalgenError
from ..loading import load_tokenizer, load_weights_strict, parse_dtype, quantization_of, read_config, resolve_model_path
from ..models.qwen3_omni.config import OmniArgs
from ..models.qwen3_omni.model import PARTS, Model


@dataclasses.dataclass
class OmniParts:
    """What metalgen.omni runs: the model, its tokenizer, the checkpoint's generation defaults."""

    model: Model
    tokenizer: Any
    generation_config: Dict[str, Any]
    name: str

    @property
    def args(self) -> OmniArgs:
        return self.model.args


def omni_args(config: Dict[str, Any], where: str) -> OmniArgs:
    """OmniArgs of a config.json, or one line saying the checkpoint is not Qwen3-Omni."""
    if config.get("model_type") != OmniArgs.model_type:
        raise MetalgenError(f"{where} is not a Qwen3-Omni checkpoint (model_type "
                            f"'{config.get('model_type')}', expected '{OmniArgs.model_type}')")
    return OmniArgs.from_dict(config)


def load_args(path_or_id: str, revision: Optional[str] = None) -> OmniArgs:
    """A checkpoint's OmniArgs from its config.json alone: no weights are read."""
    if path_or_id.startswith("dummy:"):
        from .dummy import dummy_config

        return OmniArgs.from_dict(dummy_config(path_or_id[len("dummy:"):]))
    folder = resolve_model_path(path_or_id, revision)
    return omni_args(read_config(folder), str(folder))


def keep_audio_float32(model: Model) -> None:
    """Code2Wav in float32 whatever the rest is: its output is the waveform itself."""
    if "code2wav" in model:
        model.code2wav.set_dtype(mx.float32)
        mx.eval(model.code2wav.parameters())


def load(path_or_id: str, *, dtype=None, parts: Iterable[str] = PARTS, revision: Optional[str] = None) -> OmniParts:
    """Load a Qwen3-Omni checkpoint: `parts` of thinker, audio, talker and code2wav (all by default).

    dtype: "bfloat16", "float16" or "float32" for the decoders (None keeps the checkpoint's);
    Code2Wav always runs in float32.
    """
    if path_or_id.startswith("dummy:"):
        from .dummy import load_dummy

        return load_dummy(path_or_id[len("dummy:"):], dtype=dtype, parts=parts)
    folder = resolve_model_path(path_or_id, revision)
    config = read_config(folder)
    args = omni_args(config, str(folder))
    model = Model(args, parts)
    load_weights_strict(model, folder, parse_dtype(dtype), quantization_of(config))
    keep_audio_float32(model)
    gen_path = folder / "generation_config.json"
    generation = {}
    if gen_path.exists():
        from ..loading import read_json

        generation = read_json(gen_path, "generation_config.json")
    tokenizer = load_tokenizer(folder, config["eos_token_ids"] or [args.im_end_token_id])
    return OmniParts(model, tokenizer, generation, str(path_or_id))
