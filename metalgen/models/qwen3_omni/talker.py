"""The Qwen3-Omni talker and its code predictor (`talker.*`).

    talker.model.{layers,norm}            the MoE decoder (q/k norms, shared expert), fed embeddings
    talker.model.codec_embedding          codec vocabulary (3072) -> hidden
    talker.text_projection.linear_fc{1,2} thinker embedding -> talker hidden (SiLU MLP with biases)
    talker.hidden_projection.linear_fc{1,2}   thinker hidden state (audio positions) -> talker hidden
    talker.codec_head                     hidden -> codec logits (codebook 0 and control ids)
    talker.code_predictor.*               Qwen3-TTS's code predictor (codebooks 1..G-1)

The methods are those of Qwen3-TTS's talker, so that metalgen.tts.frames' frame loop drives
either. Models return hidden states or logits; sampling and prompts live in metalgen.omni.
"""

from __future__ import annotations


import mlx.core as mx
import mlx.nn as nn

from ..decoder import DecoderModel
from ..layers import Linear
from ..qwen3_tts.talker import CodePredictor, ResizeMLP
from .config import TalkerArgs


class TalkerModel(DecoderModel):
    """`talker.model`: the MoE stack and the codec embedding (no token embedding)."""

    def __init__(self, args: TalkerArgs):
        super().__init__(args.text.to_spec(), embed_tokens=False)
        self.codec_embedding = nn.Embedding(args.text.vocab_size, args.text.hidden_size)


class Talker(nn.Module):
    """`talker.*`: returns hidden states and codec logits; never samples."""

    def __init__(self, args: TalkerArgs):
        super().__init__()
        self.args = args
        hidden = args.text.hidden_size
        self.model = TalkerModel(args)
        # both projections: thinker width -> the text config's intermediate size -> talker width
        self.text_projection = ResizeMLP(args.thinker_hidden_size, args.text.intermediate_size, hidden)
        self.hidden_projection = ResizeMLP(args.thinker_hidden_size, args.text.intermediate_size, hidden)
        self.codec_head = Linear(hidden, args.text.vocab_size, bias=False)
        self.code_predictor = CodePredictor(args.code_predictor, hidden)

    @property
    def layers(self):
        return self.model.layers

    def codec_embed(self, ids: mx.array) -> mx.array:
        return self.model.codec_embedding(ids)

    def hidden(self, embeddings: mx.array, cache=None, position_ids=None) -> mx.array:
        """(B, L, hidden) embeddings -> final-norm hidden states (B, L, hidden)."""
        return self.model(cache=cache, input_embeddings=embeddings)

    def logits(self, h: mx.array) -> mx.array:
        return self.codec_head(h)

    def __call__(self, embeddings: mx.array, cache=None) -> mx.array:
        return self.logits(self.hidden(embeddings, cache))
