"""Qwen3-Omni's audio encoder (the thinker's `audio_tower`): 128-bin log-mel frames -> audio tokens.

    features (128, T) -> chunks of 2 * n_window frames (the last one shorter; padded with zeros to
    the longest chunk) -> 3 x (3x3 stride-2 conv2d + GELU) over (mel, time) -> flatten (channels,
    mel) -> conv_out -> + sinusoidal positions, restarting at 0 in every chunk -> the valid frames
    of every chunk, in order -> encoder layers (pre-norm; attention within windows of
    n_window_infer frames' worth of tokens) -> ln_post -> proj1 -> GELU -> proj2 -> (tokens, output_dim)

One clip per call, computed as transformers' `Qwen3OmniMoeAudioEncoder.forward` computes it for
a batch of one. Attributes follow the checkpoint keys under `thinker.audio_tower.`; the conv2d
weights arrive in PyTorch's layout and `sanitize_audio_weights` converts them to MLX's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...errors import MetalgenError
from ..base import BaseModelArgs
from ..layers import Linear

_CONVS = ("conv2d1", "conv2d2", "conv2d3")
# chunks (2 * n_window frames each) per convolution call; see AudioEncoder.__call__
_CONV_GROUP = 128


@dataclasses.dataclass
class AudioEncoderArgs(BaseModelArgs):
    """`thinker_config.audio_config` (Qwen3OmniMoeAudioEncoderConfig's field names and defaults)."""

    num_mel_bins: int = 128
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    d_model: int = 1280
    max_source_positions: int = 1500
    n_window: int = 50
    n_window_infer: int = 800
    conv_chunksize: int = 500
    output_dim: int = 3584
    downsample_hidden_size: int = 480
    activation_function: str = "gelu"
    # read by transformers into an `embed_scale` that its forward never applies; kept for the record
    scale_embedding: bool = False


def _halve(length: int) -> int:
    """Output length of a kernel-3, stride-2, padding-1 convolution; 0 stays 0."""
    return (length - 1) // 2 + 1 if length > 0 else 0


def _after_convs(length: int) -> int:
    return _halve(_halve(_halve(length)))


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's fixed position table (length, channels): sines of the first half of the channels
    then cosines, at timescales geometric from 1 to max_timescale."""
    half = channels // 2
    inv = np.exp(-(math.log(max_timescale) / (half - 1)) * np.arange(half, dtype=np.float64))
    t = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


class AudioAttention(nn.Module):
    """Bidirectional multi-head attention with biased projections (Whisper's), run independently
    within consecutive windows of the token sequence."""

    def __init__(self, dims: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = Linear(dims, dims, bias=True)
        self.k_proj = Linear(dims, dims, bias=True)
        self.v_proj = Linear(dims, dims, bias=True)
        self.out_proj = Linear(dims, dims, bias=True)

    def __call__(self, x: mx.array, window: int) -> mx.array:
        # x: (S, D). The windows are [0, w), [w, 2w), ... and a shorter last one: the full ones go
        # through one batched attention call, the remainder through a second.
        S, D = x.shape
        H = self.heads
        hd = D // H
        scale = hd**-0.5
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        full, rest = divmod(S, window)
        outs = []
        if full:
            def windows(t):  # (full * w, D) -> (full, H, w, hd)
                return t[: full * window].reshape(full, window, H, hd).transpose(0, 2, 1, 3)

            o = mx.fast.scaled_dot_product_attention(windows(q), windows(k), windows(v), scale=scale)
            outs.append(o.transpose(0, 2, 1, 3).reshape(full * window, D))
        if rest:
            def tail(t):  # (rest, D) -> (1, H, rest, hd)
                return t[full * window :].reshape(1, rest, H, hd).transpose(0, 2, 1, 3)

            o = mx.fast.scaled_dot_product_attention(tail(q), tail(k), tail(v), scale=scale)
            outs.append(o.transpose(0, 2, 1, 3).reshape(rest, D))
        o = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)
        return self.out_proj(o)


class AudioEncoderLayer(nn.Module):
    """Pre-norm transformer layer: x + attn(LN(x)), then x + fc2(GELU(fc1(LN(x))))."""

    def __init__(self, args: AudioEncoderArgs):
        super().__init__()
        d = args.d_model
        self.self_attn = AudioAttention(d, args.encoder_attention_heads)
        # torch.nn.LayerNorm's default eps, which the reference leaves in place
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = Linear(d, args.encoder_ffn_dim, bias=True)
        self.fc2 = Linear(args.encoder_ffn_dim, d, bias=True)
        self.final_layer_norm = nn.LayerNorm(d, eps=1e-5)

    def __call__(self, x: mx.array, window: int) -> mx.array:
        x = x + self.self_attn(self.self_attn_layer_norm(x), window)
        return x + self.fc2(nn.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    """The thinker's audio tower. `encoder(features)` with features (num_mel_bins, frames) of one
    clip (metalgen.omni.features.log_mel) -> (tokens, output_dim), tokens =
    metalgen.omni.features.audio_token_count(frames, n_window)."""

    def __init__(self, args: AudioEncoderArgs):
        super().__init__()
        if args.activation_function != "gelu":
            raise MetalgenError(
                f"Qwen3-Omni audio encoder activation '{args.activation_function}' is not supported (only gelu)"
            )
        if args.d_model % args.encoder_attention_heads:
            raise MetalgenError(
                f"audio encoder d_model {args.d_model} is not a multiple of its {args.encoder_attention_heads} heads"
            )
        if args.n_window <= 0 or args.n_window_infer < 2 * args.n_window:
            raise MetalgenError(
                f"audio encoder needs n_window > 0 and n_window_infer >= 2 * n_window "
                f"(got {args.n_window}, {args.n_window_infer})"
            )
        self.args = args
        c = args.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, c, 3, stride=2, padding=1)
        self.conv2d2 = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.conv2d3 = nn.Conv2d(c, c, 3, stride=2, padding=1)
        mel_after = _after_convs(args.num_mel_bins)  # the mel axis is halved three times too
        self.conv_out = Linear(c * mel_after, args.d_model, bias=False)
        self.layers = [AudioEncoderLayer(args) for _ in range(args.encoder_layers)]
        self.ln_post = nn.LayerNorm(args.d_model, eps=1e-5)
        self.proj1 = Linear(args.d_model, args.d_model, bias=True)
        self.proj2 = Linear(args.d_model, args.output_dim, bias=True)

    def _check(self, features) -> mx.array:
        shape = tuple(features.shape)
        mels = self.args.num_mel_bins
        if len(shape) != 2 or shape[0] != mels:
            raise MetalgenError(f"audio features must be ({mels}, frames) for one clip, got shape {shape}")
        if shape[1] == 0:
            raise MetalgenError("audio features hold no frames (the clip is shorter than 10 ms)")
        return features if isinstance(features, mx.array) else mx.array(features)

    def __call__(self, features) -> mx.array:
        x = self._check(features).astype(self.conv2d1.weight.dtype)
        mels, frames = x.shape
        a = self.args
        chunk = 2 * a.n_window
        full, rest = divmod(frames, chunk)
        n_chunks = full + (1 if rest else 0)
        # Every chunk is padded to the longest one, as the reference batches them: chunk frames
        # when there is a full chunk, else the clip's own length. The zeros matter: the padded
        # columns' conv outputs (GELU of the biases) feed the last valid outputs of the next conv.
        width = chunk if full else rest
        x = mx.pad(x, [(0, 0), (0, n_chunks * width - frames)])
        # (mels, n_chunks * width) -> (n_chunks, mels, width, 1): NHWC with H = mel, W = time
        x = x.reshape(mels, n_chunks, width).transpose(1, 0, 2)[..., None]

        # The chunks are independent, so they go through the convolutions a group at a time, which
        # bounds memory (the reference splits by conv_chunksize for the same reason). Groups are
        # smaller than conv_chunksize's 500: MLX's CUDA conv2d ran out of memory on an 80 GB H100 at
        # 300 chunks of the published width (conv2d2), and was fine at 256.
        group = max(1, min(a.conv_chunksize, _CONV_GROUP))
        t = _after_convs(width)
        if t > a.max_source_positions:
            raise MetalgenError(f"audio chunk of {t} tokens exceeds max_source_positions {a.max_source_positions}")
        positions = mx.array(sinusoids(t, a.d_model))  # (t, D): restarting at 0 in every chunk
        # A long clip is evaluated as it goes, one step (a conv group, later an encoder layer)
        # queued behind the running one, as DecoderModel's layer_by_layer does: a single graph
        # would keep every step's temporaries alive until the device reaches them.
        stepwise = n_chunks > group
        queued = None

        def step(arr: mx.array) -> None:
            nonlocal queued
            mx.async_eval(arr)
            if queued is not None:
                mx.eval(queued)
            queued = arr

        parts = []
        for start in range(0, n_chunks, group):
            h = x[start : start + group]
            for conv in (self.conv2d1, self.conv2d2, self.conv2d3):
                h = nn.gelu(conv(h))
            # (g, mel', t, C) -> (g, t, C * mel'): channels outer, mel inner, as the reference
            # flattens its (C, mel') per time step
            g, f, _, c = h.shape
            h = self.conv_out(h.transpose(0, 2, 3, 1).reshape(g, t, c * f))  # (g, t, D)
            parts.append(h + positions.astype(h.dtype))
            if stepwise:
                step(parts[-1])
        h = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)  # (n_chunks, t, D)

        # the valid tokens: every time' of the full chunks, the first _after_convs(rest) of a short
        # last chunk (only it can be short; when it is the only chunk, all of it is valid)
        n, D = h.shape[0], h.shape[-1]
        if rest and full:
            h = mx.concatenate([h[:full].reshape(full * t, D), h[full, : _after_convs(rest)]], axis=0)
        else:
            h = h.reshape(n * t, D)  # (tokens, D)

        # attention windows: n_window_infer // chunk chunks' worth of tokens (the longest chunk's count)
        window = t * (a.n_window_infer // chunk)
        for layer in self.layers:
            h = layer(h, window)
            if stepwise:
                step(h)
        h = self.proj1(self.ln_post(h))
        return self.proj2(nn.gelu(h))


def sanitize_audio_weights(weights: Dict[str, object], prefix: str = "thinker.audio_tower.") -> Dict[str, object]:
    """A copy of the checkpoint dict `weights` with the audio encoder's tensors under `prefix`
    made loadable: the conv2d weights from PyTorch's (out, in, kh, kw) to MLX's (out, kh, kw, in)
    and the sinusoidal position buffer (recomputed here, never loaded) dropped. Other keys are
    passed through untouched. Works on numpy or MLX arrays.

    Safe to apply twice: the layout is read from conv2d1, whose single input channel tells the two
    apart ((C, 1, 3, 3) is PyTorch's, (C, 3, 3, 1) MLX's); without conv2d1 each weight is judged
    by its own shape, PyTorch's assumed where the shape cannot tell (3 input channels)."""
    out = dict(weights)
    for key in [k for k in out if k.startswith(prefix + "positional_embedding.")]:
        del out[key]
    first = out.get(prefix + "conv2d1.weight")
    torch_layout: Optional[bool] = None
    if first is not None and len(first.shape) == 4:
        torch_layout = first.shape[1] == 1 and first.shape[3] != 1
    for name in _CONVS:
        key = f"{prefix}{name}.weight"
        w = out.get(key)
        if w is None or len(w.shape) != 4:
            continue
        convert = torch_layout
        if convert is None:
            convert = not (tuple(w.shape[1:3]) == (3, 3) and tuple(w.shape[2:]) != (3, 3))
        if convert:
            out[key] = w.transpose(0, 2, 3, 1)
    return out
