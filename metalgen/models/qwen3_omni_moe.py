"""Qwen3-Omni as a text model (`model_type: qwen3_omni_moe`): the thinker's decoder alone, for
`metalgen generate`, `chat`, `serve` and `bench`. Only `thinker.model.*` and `thinker.lm_head` are
read; the audio encoder, the talker and Code2Wav belong to metalgen.omni, and the image encoder is
not supported (its weights are skipped). The model file of the whole checkpoint is
models/qwen3_omni/model.py."""

from __future__ import annotations

from .qwen3_omni.config import OmniArgs as ModelArgs
from .qwen3_omni.thinker import Thinker

__all__ = ["Model", "ModelArgs"]


class Model(Thinker):
    """The thinker's text decoder; `__call__(inputs, cache=None)` returns logits."""

    def __init__(self, args: ModelArgs):
        super().__init__(args, with_audio=False)

    def sanitize(self, weights: dict) -> dict:
        prefix = "thinker."
        text = {k[len(prefix):]: v for k, v in weights.items()
                if k.startswith(("thinker.model.", "thinker.lm_head."))}
        if not text:  # a thinker saved on its own, without the prefix
            text = {k: v for k, v in weights.items() if k.startswith(("model.", "lm_head."))}
        return super().sanitize(text)
