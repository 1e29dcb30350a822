"""The thinker: Qwen3-Omni's Qwen3-MoE text decoder (`thinker.model.*`, `thinker.lm_head`) and,
when the checkpoint has it and audio input is wanted, its audio encoder (`thinker.audio_tower.*`).

The talker reads two things of the thinker: its input embeddings of every token (text tokens'
rows of `embed_tokens`, audio tokens' encoder outputs) and, at audio positions, the hidden
state after `accept_hidden_layer` layers. `hidden_and_tap` returns both in one prefill.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import mlx.core as mx

from ..base import mask_for
from ..decoder import CausalLM
from .config import OmniArgs


class Thinker(CausalLM):
    """`thinker.*`: a CausalLM (the text engine's generate and decode paths take it as it is),
    plus the audio encoder when `with_audio`."""

    def __init__(self, args: OmniArgs, with_audio: bool = True):
        super().__init__(args.thinker_text.to_spec(), args.thinker_text.tie_word_embeddings)
        self.args = args.thinker_text
        if with_audio and args.audio:
            from .audio_encoder import AudioEncoder, AudioEncoderArgs

            self.audio_tower = AudioEncoder(AudioEncoderArgs.from_dict(args.audio))

    def embed(self, ids: mx.array) -> mx.array:
        """Token ids (..., L) -> input embeddings (..., L, hidden)."""
        return self.model.embed_tokens(ids)

    def hidden_and_tap(self, embeddings: mx.array, cache: Optional[List] = None,
                       tap: int = 0) -> Tuple[mx.array, mx.array]:
        """(final-norm hidden (B, L, hidden), the hidden state after the first `tap` layers
        (B, L, hidden)) for input embeddings (B, L, hidden), filling `cache`. `tap` 0 is the
        embeddings themselves, as transformers numbers `hidden_states`."""
        h = embeddings
        tapped = h if tap == 0 else None
        mask = mask_for(h.shape[1], cache)
        layers = self.model.layers
        caches = cache if cache is not None else [None] * len(layers)
        for i, (layer, layer_cache) in enumerate(zip(layers, caches)):
            h = layer(h, mask, layer_cache)
            if i + 1 == tap:
                tapped = h
        if tapped is None:
            raise ValueError(f"tap {tap} is past the thinker's {len(layers)} layers")
        return self.model.norm(h), tapped
