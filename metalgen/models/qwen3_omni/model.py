"""The whole Qwen3-Omni checkpoint (`model_type: qwen3_omni_moe`): `thinker.*`, `talker.*` and
`code2wav.*` in one set of safetensors.

`Model(args, parts=...)` builds only the parts asked for; `sanitize` drops the tensors of the
parts left out (and always the image encoder's, `thinker.visual.*`, which metalgen does not
run), so that loading stays strict for what is built.
"""

from __future__ import annotations

from typing import Dict, Iterable

import mlx.core as mx
import mlx.nn as nn

from ..moe import sanitize_experts
from .config import OmniArgs
from .thinker import Thinker

PARTS = ("thinker", "audio", "talker", "code2wav")


class Model(nn.Module):
    """Qwen3-Omni. parts: which of thinker (text), audio (the thinker's audio encoder), talker
    (with its code predictor) and code2wav to build; talker and code2wav need audio output
    enabled in the config."""

    def __init__(self, args: OmniArgs, parts: Iterable[str] = PARTS):
        super().__init__()
        parts = set(parts)
        self.args = args
        self.thinker = Thinker(args, with_audio="audio" in parts)
        if args.talker is not None and "talker" in parts:
            from .talker import Talker

            self.talker = Talker(args.talker)
        if args.code2wav is not None and "code2wav" in parts:
            from .code2wav import Code2Wav, Code2WavArgs

            self.code2wav = Code2Wav(Code2WavArgs.from_dict(args.code2wav))

    def sanitize(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        keep = ["thinker.model.", "thinker.lm_head."]
        if "audio_tower" in self.thinker:
            keep.append("thinker.audio_tower.")
        if "talker" in self:
            keep.append("talker.")
        if "code2wav" in self:
            keep.append("code2wav.")
        keep = tuple(keep)
        weights = {k: v for k, v in weights.items() if k.startswith(keep) and "rotary_emb.inv_freq" not in k}
        if "lm_head" not in self.thinker:
            weights.pop("thinker.lm_head.weight", None)
        # the two decoders have their own expert counts: each part's experts renamed on their own
        for prefix, decoder in (("thinker.", self.thinker.model), ("talker.model.", self._talker_model())):
            if decoder is None or decoder.spec.moe is None:
                continue
            part = {k: v for k, v in weights.items() if k.startswith(prefix) and not k.startswith("talker.code")}
            for k in part:
                del weights[k]
            weights.update(sanitize_experts(part, decoder.spec.moe.num_experts))
        if "audio_tower" in self.thinker:
            from .audio_encoder import sanitize_audio_weights

            weights = sanitize_audio_weights(weights, "thinker.audio_tower.")
        if "code2wav" in self:
            from .code2wav import sanitize_code2wav_weights

            weights = sanitize_code2wav_weights(weights, "code2wav.")
        return weights

    def _talker_model(self):
        return self.talker.model if "talker" in self else None

    def pack_weights(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        """The sparse layers' experts stacked across layers, per decoder (DecoderModel.pack_experts)."""
        weights = self.thinker.model.pack_experts(weights, prefix="thinker.model.")
        if "talker" in self:
            weights = self.talker.model.pack_experts(weights, prefix="talker.model.")
        return weights
