"""The Qwen3-TTS talker and its code predictor, on the shared Qwen decoder (models/decoder.py).

Module attributes follow the checkpoint keys under `talker.`:

    talker.model.{layers,norm}            the Qwen3 decoder stack (M-RoPE), fed embeddings
    talker.model.codec_embedding          codec vocabulary (3072) -> hidden
    talker.model.text_embedding           text vocabulary -> text_hidden_size
    talker.text_projection.linear_fc{1,2} text_hidden -> hidden (SiLU MLP with biases)
    talker.codec_head                     hidden -> codec logits (codebook 0 and control ids)
    talker.code_predictor.model.{layers,norm,codec_embedding.N}   5-layer Qwen3 stack (plain RoPE)
    talker.code_predictor.lm_head.N       one head per codebook 1..15
    talker.code_predictor.small_to_mtp_projection   talker hidden -> predictor hidden (if they differ)

Models return logits or hidden states; sampling, prompts and caches live in metalgen.tts.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import mlx.nn as nn

import kernels_metal as K

from ..decoder import DecoderModel
from ..layers import Linear
from .config import CodePredictorArgs, TalkerArgs


class MRoPE:
    """Multimodal RoPE through `kernels_metal.mrope`: three position ids per token (temporal,
    height, width), each frequency driven by the axis `mrope_section` gives it (interleaved or
    in chunks, as the config declares). With no explicit ids, all three axes take the text
    positions offset .. offset + L - 1."""

    def __init__(self, rope_config, dims: int, max_position_embeddings: int):
        if not rope_config.mrope_section:
            raise ValueError("MRoPE needs an mrope_section")
        inv_freq, scale = rope_config.inv_freq(dims, max_position_embeddings)
        self.dims = dims
        self.section = tuple(int(s) for s in rope_config.mrope_section)
        self.interleaved = bool(rope_config.mrope_interleaved)
        self.table = K.rope_table(inv_freq, max_position_embeddings, attention_scale=scale)

    @staticmethod
    def text_positions(offset: int, length: int, batch: int = 1) -> mx.array:
        """(3, B, L) ids for text-only input: the three axes equal."""
        pos = mx.arange(offset, offset + length, dtype=mx.int32)
        return mx.broadcast_to(pos[None, None, :], (3, batch, length))

    def __call__(self, x: mx.array, offset: int = 0, position_ids: Optional[mx.array] = None):
        # x: (B, H, L, D)
        if position_ids is None:
            position_ids = self.text_positions(offset, x.shape[2], x.shape[0])
        return K.mrope(x, self.table, position_ids, self.section, self.interleaved)


class TalkerModel(DecoderModel):
    """`talker.model`: the Qwen3 stack with M-RoPE, plus the codec and text embeddings."""

    def __init__(self, args: TalkerArgs):
        spec = args.to_spec()
        if sum(int(s) for s in args.mrope_section) * 2 != spec.head_dim:
            raise ValueError(
                f"mrope_section {list(args.mrope_section)} must sum to head_dim / 2 = {spec.head_dim // 2}"
            )
        rope = MRoPE(spec.rope, spec.head_dim, spec.max_position_embeddings)
        super().__init__(spec, rope=rope, embed_tokens=False)
        self.codec_embedding = nn.Embedding(args.vocab_size, args.hidden_size)
        self.text_embedding = nn.Embedding(args.text_vocab_size, args.text_hidden_size)


class ResizeMLP(nn.Module):
    """`talker.text_projection`: fc2(silu(fc1(x))), both with biases."""

    def __init__(self, dims: int, hidden: int, out: int):
        super().__init__()
        self.linear_fc1 = Linear(dims, hidden, bias=True)
        self.linear_fc2 = Linear(hidden, out, bias=True)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_fc2(nn.silu(self.linear_fc1(x)))


class CodePredictorModel(DecoderModel):
    """`talker.code_predictor.model`: a small Qwen3 stack (plain RoPE) and one embedding per
    codebook 1..15, in the talker's hidden size."""

    def __init__(self, args: CodePredictorArgs, embedding_dim: int):
        super().__init__(args.to_spec(), embed_tokens=False)
        self.codec_embedding = [
            nn.Embedding(args.vocab_size, embedding_dim) for _ in range(args.num_code_groups - 1)
        ]


class CodePredictor(nn.Module):
    """Predicts codebooks 1..G-1 of a frame from the talker's last hidden state and codebook 0.

    Fed embeddings, never ids: step 0 takes [talker hidden, embed(code 0)] (2 positions) and
    reads head 0; step i >= 1 takes codec_embedding[i - 1](code i) and reads head i. Its KV
    cache is the caller's and is fresh for every frame."""

    def __init__(self, args: CodePredictorArgs, talker_hidden: int):
        super().__init__()
        self.args = args
        self.model = CodePredictorModel(args, talker_hidden)
        self.lm_head = [
            Linear(args.hidden_size, args.vocab_size, bias=False) for _ in range(args.num_code_groups - 1)
        ]
        if args.hidden_size != talker_hidden:
            self.small_to_mtp_projection = Linear(talker_hidden, args.hidden_size, bias=True)

    @property
    def layers(self):
        return self.model.layers

    def embed(self, codebook: int, codes: mx.array) -> mx.array:
        """Embedding (talker hidden size) of codes of codebook `codebook` (1..G-1)."""
        return self.model.codec_embedding[codebook - 1](codes)

    def __call__(self, embeddings: mx.array, step: int, cache=None) -> mx.array:
        """embeddings (B, L, talker_hidden) -> logits (B, vocab) of head `step` at the last position."""
        if "small_to_mtp_projection" in self:
            embeddings = self.small_to_mtp_projection(embeddings)
        h = self.model(cache=cache, input_embeddings=embeddings)
        return self.lm_head[step](h[:, -1, :])


class Talker(nn.Module):
    """`talker.*`: returns hidden states and codec logits; never samples."""

    def __init__(self, args: TalkerArgs):
        super().__init__()
        self.args = args
        self.model = TalkerModel(args)
        self.text_projection = ResizeMLP(args.text_hidden_size, args.text_hidden_size, args.hidden_size)
        self.codec_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        self.code_predictor = CodePredictor(args.code_predictor(), args.hidden_size)

    @property
    def layers(self):
        return self.model.layers

    def text_embed(self, ids: mx.array) -> mx.array:
        """Text token ids (..., L) -> projected embeddings (..., L, hidden)."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: mx.array) -> mx.array:
        return self.model.codec_embedding(ids)

    def hidden(self, embeddings: mx.array, cache=None, position_ids=None) -> mx.array:
        """(B, L, hidden) embeddings -> final-norm hidden states (B, L, hidden)."""
        return self.model(cache=cache, input_embeddings=embeddings, position_ids=position_ids)

    def logits(self, h: mx.array) -> mx.array:
        return self.codec_head(h)

    def __call__(self, embeddings: mx.array, cache=None, position_ids=None) -> mx.array:
        return self.logits(self.hidden(embeddings, cache, position_ids))
