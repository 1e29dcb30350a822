"""The whole Qwen3-TTS checkpoint (`model_type: qwen3_tts`): `talker.*` (+ `speaker_encoder.*`
for the Base model type), and the speech tokenizer's decoder in `speech_tokenizer/`."""

from __future__ import annotations

from typing import Dict

import mlx.core as mx
import mlx.nn as nn

from .config import SpeechTokenizerArgs, TTSArgs
from .speech_decoder import SpeechDecoder, torch_conv_to_mlx
from .talker import Talker


class Model(nn.Module):
    """model.safetensors of a Qwen3-TTS checkpoint."""

    def __init__(self, args: TTSArgs):
        super().__init__()
        self.args = args
        self.talker = Talker(args.talker)
        if args.tts_model_type == "base":
            from .speaker_encoder import SpeakerEncoder

            self.speaker_encoder = SpeakerEncoder(args.speaker_encoder)

    def sanitize(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if "speaker_encoder" in self:
            weights = torch_conv_to_mlx(self.speaker_encoder, weights, "speaker_encoder.")
        else:
            # CustomVoice / VoiceDesign checkpoints carry no speaker encoder; drop one if present.
            weights = {k: v for k, v in weights.items() if not k.startswith("speaker_encoder.")}
        return weights


class SpeechTokenizer(nn.Module):
    """speech_tokenizer/model.safetensors: the decoder (codes -> audio); the encoder's tensors
    are read only when voice cloning needs them."""

    def __init__(self, args: SpeechTokenizerArgs, with_encoder: bool = False):
        super().__init__()
        self.args = args
        self.decoder = SpeechDecoder(args.decoder)
        if with_encoder:
            from .speech_encoder import SpeechEncoder

            self.encoder = SpeechEncoder(args.encoder, args.encoder_valid_num_quantizers, args.encode_downsample_rate)

    def sanitize(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        keep = ("decoder.", "encoder.") if "encoder" in self else ("decoder.",)
        weights = {k.replace("._codebook.", ".codebook."): v for k, v in weights.items() if k.startswith(keep)}
        weights = torch_conv_to_mlx(self.decoder, weights, "decoder.")
        if "encoder" in self:
            weights = self.encoder.sanitize(weights)
        return weights
