"""Qwen3-Omni's Code2Wav (`code2wav.*`): 16 codebooks per 80 ms frame -> 24 kHz waveform.

    codes (B, T, Q) -> one flat embedding table, codebook q's codes offset by q * codebook_size,
    averaged over the Q codebooks -> sliding-window causal transformer (layer scales, RoPE, no
    projections) -> 2 x (transposed conv upsample + ConvNeXt block) -> causal conv -> 4 x
    (SnakeBeta, transposed conv, 3 dilated residual units) -> SnakeBeta -> causal conv -> clamp

Everything after the embedding is the Qwen3-TTS speech decoder's code
(models/qwen3_tts/speech_decoder.py) with one difference the checkpoint was trained with: the
decoder blocks' transposed convs cut (kernel - stride) samples at the start as well as at the
end. The waveform therefore has `total_upsample * T - start_trim` samples (555 fewer than
1920 a frame at the published rates), and reads like the causal one with its first 555
samples gone. Attributes follow the checkpoint keys under `code2wav.`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Dict, Mapping, Optional

import mlx.core as mx
import mlx.nn as nn

from ...errors import MetalgenError
from ..decoder import DecoderSpec, spec_from_args
from ..qwen3_tts.config import SpeechDecoderArgs
from ..qwen3_tts.speech_decoder import (
    PreTransformer,
    StreamingDecoder,
    decode_chunked,
    run_waveform,
    torch_conv_to_mlx,
    upsample_stack,
    waveform_stack,
)


@dataclasses.dataclass
class Code2WavArgs(SpeechDecoderArgs):
    """config.json -> `code2wav_config` (Hugging Face's Qwen3OmniMoeCode2WavConfig names): the fields
    and defaults of Qwen3-TTS's speech decoder, whose pieces Code2Wav is built from; its
    `codebook_dim` and `latent_dim` go unused (no split quantizer, no projections).

    RoPE comes from `rope_parameters` (what transformers 5 writes) or the older `rope_theta`;
    `layer_scale_initial_scale` only initializes weights that loading replaces."""

    rope_parameters: Optional[Dict[str, Any]] = None
    layer_scale_initial_scale: float = 0.01

    def to_spec(self) -> DecoderSpec:
        """The pre-transformer's shape as the shared decoder's DecoderSpec."""
        if self.attention_bias:
            # the shared Attention has q/k/v biases but no o_proj bias, which the reference adds too
            raise MetalgenError("Code2Wav configs with attention_bias=true are not supported")
        if self.hidden_act != "silu":
            raise MetalgenError(f"Code2Wav activation '{self.hidden_act}' is not supported (only silu)")
        return spec_from_args(self, vocab_size=0)

    @property
    def start_trim(self) -> int:
        """Samples the waveform lacks against T * total_upsample: decoder block i cuts its rate
        r_i at its start, which every later block multiplies by its own rate (555 for 8, 5, 4, 3;
        the upsampling ratios' transposed convs have kernel = stride and cut nothing)."""
        rates = [int(r) for r in self.upsample_rates]
        total = 0
        for i, rate in enumerate(rates):
            later = 1
            for r in rates[i + 1 :]:
                later *= r
            total += rate * later
        return total


class Code2Wav(nn.Module):
    """`code2wav.*` of a Qwen3-Omni checkpoint: codes (B, T, Q) -> waveform (B, samples).

    Call it for a whole utterance, `chunked` for the reference's chunked decode, `stream` to
    decode while frames are still being generated."""

    def __init__(self, args: Code2WavArgs):
        super().__init__()
        self.args = args
        self.total_upsample = args.total_upsample
        self.start_trim = args.start_trim
        self.code_embedding = nn.Embedding(args.codebook_size * args.num_quantizers, args.hidden_size)
        self.pre_transformer = PreTransformer(args, projections=False)
        self.upsample = upsample_stack(args.hidden_size, args.upsampling_ratios)
        self.decoder = waveform_stack(args.hidden_size, args.decoder_dim, args.upsample_rates, trim_start=True)

    def embed(self, codes: mx.array) -> mx.array:
        """codes (B, T, Q) -> (B, T, hidden): the mean of the Q codebooks' embeddings. Codes are
        not range-checked (that would cost a device sync): one outside [0, codebook_size) reads
        another codebook's row."""
        q = self.args.num_quantizers
        if codes.ndim != 3 or codes.shape[-1] != q:
            raise ValueError(f"Code2Wav expects codes (batch, frames, {q} codebooks), got shape {tuple(codes.shape)}")
        offsets = mx.arange(q, dtype=mx.int32) * self.args.codebook_size
        return mx.mean(self.code_embedding(codes.astype(mx.int32) + offsets), axis=2)

    def __call__(self, codes: mx.array) -> mx.array:
        """codes (B, T, Q) int -> float32 waveform (B, T * total_upsample - start_trim) in [-1, 1]."""
        h = self.pre_transformer(self.embed(codes))
        return run_waveform(h, self.upsample, self.decoder).astype(mx.float32)

    def chunked(self, codes: mx.array, chunk: int = 300, left_context: int = 25, gapless: bool = False) -> mx.array:
        """Decode `chunk` frames at a time, each after up to `left_context` earlier frames whose
        samples are dropped. By default exactly transformers' `chunked_decode`, which loses
        `start_trim` samples at every chunk boundary (each chunk's output starts late);
        `gapless` keeps them from the context part (so left_context must be >= 1), and the
        result has the whole-utterance decode's length and, given enough context, its samples."""
        return decode_chunked(self, codes, chunk, left_context, self.start_trim if gapless else 0)

    def stream(self, first_chunk: Optional[int] = None, chunk: int = 300, left_context: int = 25,
               gapless: bool = False) -> StreamingDecoder:
        """A StreamingDecoder: `push` frames (B, n, Q), get waveform pieces; `flush` at the end.
        Without `first_chunk` its pieces concatenate to `chunked(all_codes, chunk,
        left_context, gapless)`; with it the first piece comes after `first_chunk` frames and
        later pieces double up to `chunk`."""
        return StreamingDecoder(self, chunk, left_context, first_chunk, overlap=self.start_trim if gapless else 0)


def _drop(shape, *dims) -> int:
    """The dimension of a 3-D conv weight that is left after taking out `dims` (the channel
    counts): the kernel size, in either layout."""
    rest = Counter(int(d) for d in shape)
    for d in dims:
        if rest[d] == 0:
            raise MetalgenError(f"Code2Wav conv weight of shape {tuple(shape)} has no dimension {d}")
        rest[d] -= 1
    (kernel,) = rest.elements()
    return kernel


def _conv_shapes(weights: Mapping[str, mx.array], prefix: str) -> Code2WavArgs:
    """The Code2WavArgs fields that shape the convs, read off the weights in either layout (a
    PyTorch conv is (out, in, k), transposed (in, out, k); MLX's are (out, k, in)): the
    channel counts are known, so whatever dimension is left over is the kernel."""
    hidden = int(weights[f"{prefix}code_embedding.weight"].shape[1])
    decoder_dim = int(weights[f"{prefix}decoder.0.conv.weight"].shape[0])  # out comes first in both
    ratios = []
    while f"{prefix}upsample.{len(ratios)}.0.conv.weight" in weights:
        ratios.append(_drop(weights[f"{prefix}upsample.{len(ratios)}.0.conv.weight"].shape, hidden, hidden))
    rates = []
    while f"{prefix}decoder.{len(rates) + 1}.block.1.conv.weight" in weights:
        cin = decoder_dim // 2 ** len(rates)
        kernel = _drop(weights[f"{prefix}decoder.{len(rates) + 1}.block.1.conv.weight"].shape, cin, cin // 2)
        rates.append(kernel // 2)  # a decoder block's transposed conv has kernel 2 * rate
    return Code2WavArgs(hidden_size=hidden, decoder_dim=decoder_dim, upsample_rates=tuple(rates),
                        upsampling_ratios=tuple(ratios))


def sanitize_code2wav_weights(weights: Dict[str, mx.array], prefix: str = "code2wav.",
                              args: Optional[Code2WavArgs] = None) -> Dict[str, mx.array]:
    """Checkpoint tensors -> Code2Wav's layout: the conv weights under `prefix` transposed from
    PyTorch's layout (left alone if the checkpoint is already MLX's). Takes and returns the
    whole checkpoint dict; keys outside `prefix` pass through untouched, and transformers'
    rotary `inv_freq` buffers under it are dropped. The conv shapes come from `args` if given,
    else from the weights themselves."""
    out = {k: v for k, v in weights.items() if not (k.startswith(prefix) and k.endswith("rotary_emb.inv_freq"))}
    if f"{prefix}decoder.0.conv.weight" not in out:
        return out
    args = _conv_shapes(out, prefix) if args is None else args
    # only the convs matter here: no transformer layers, and a one-position RoPE table
    args = dataclasses.replace(args, num_hidden_layers=0, max_position_embeddings=1)
    # MLX arrays are lazy: the skeleton's random weights are never computed, only their shapes read
    return torch_conv_to_mlx(Code2Wav(args), out, prefix)
