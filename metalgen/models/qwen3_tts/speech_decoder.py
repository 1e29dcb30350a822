"""The 12 Hz speech tokenizer's decoder: 16 codebooks per 80 ms frame -> 24 kHz waveform.

    codes (B, T, 16) -> split residual VQ lookup (codebook 0 | codebooks 1..15) -> causal conv
    -> sliding-window transformer (metalgen's decoder Attention/MLP, layer scales) ->
    2 x (transposed conv upsample + ConvNeXt block) -> causal conv -> 4 x (SnakeBeta,
    transposed conv, 3 dilated residual units) -> SnakeBeta -> causal conv -> clamp [-1, 1]

Layout is MLX's (B, T, C) throughout; checkpoint conv weights are PyTorch's and `sanitize`
transposes them. Attributes follow the checkpoint keys under `decoder.`.

Qwen3-Omni's Code2Wav (models/qwen3_omni/code2wav.py) is the same vocoder behind a different
code embedding and a transformer without projections; it builds on the pieces here
(`upsample_stack`, `waveform_stack`, `run_waveform`, `PreTransformer(projections=False)`,
`StreamingDecoder`, `decode_chunked`).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Dict, Iterator, List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..decoder import MLP, Attention
from ..layers import Linear, RMSNorm
from ..rope import RoPE
from .config import SpeechDecoderArgs


def conv1d_gemm(x: mx.array, weight: mx.array, bias, dilation: int = 1, stride: int = 1) -> mx.array:
    """An ungrouped conv1d (no padding) as one matrix product: the k dilated shifts of x side by
    side (B, T', k * Cin) times the weight (Cout, k, Cin) flattened. MLX's CPU conv1d is ~50x
    slower than its GEMM at the speech decoder's shapes, and this form is exact. The shifts are one
    strided view of x, gathered by one copy (k slices and a concatenation were k + 1 launches: on a
    GPU the codecs' decodes are bound by their count of launches)."""
    cout, k, cin = weight.shape
    B, T, _ = x.shape
    length = T - (k - 1) * dilation
    out_len = (length - 1) // stride + 1
    if k == 1:
        cols = x[:, : (out_len - 1) * stride + 1 : stride] if stride > 1 else x
    else:
        # cols[b, t, j, c] = x[b, t * stride + j * dilation, c] (as_strided reads x as row-contiguous)
        view = mx.as_strided(x, (B, out_len, k, cin), (T * cin, stride * cin, dilation * cin, 1))
        cols = view.reshape(B, out_len, k * cin)
    w = weight.reshape(cout, k * cin)
    y = cols @ w.T if bias is None else mx.addmm(bias, cols, w.T)
    return y


def conv_transpose1d_gemm(x: mx.array, weight: mx.array, bias, stride: int) -> mx.array:
    """ConvTranspose1d (no padding) for kernel = m * stride as one matrix product and an
    overlap-add of m shifted copies: output length (T - 1) * stride + kernel."""
    cout, k, cin = weight.shape
    B, T, _ = x.shape
    if k % stride:
        y = mx.conv_transpose1d(x, weight, stride=stride)
        return y if bias is None else y + bias
    m = k // stride
    # (B, T, Cin) @ (Cin, k * Cout) -> (B, T, m, stride, Cout)
    y = (x @ weight.transpose(2, 1, 0).reshape(cin, k * cout)).reshape(B, T, m, stride, cout)
    out = None
    for i in range(m):
        part = mx.pad(y[:, :, i], [(0, 0), (i, m - 1 - i), (0, 0), (0, 0)])
        out = part if out is None else out + part
    out = out.reshape(B, (T + m - 1) * stride, cout)
    return out if bias is None else out + bias


class CausalConv(nn.Module):
    """Conv1d padded on the left by (effective kernel - stride), plus what the last frame needs."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.effective = (kernel - 1) * dilation + 1
        self.padding = self.effective - stride

    def __call__(self, x: mx.array) -> mx.array:
        # x: (B, T, C)
        length = x.shape[1]
        frames = (length - self.effective + self.padding) / self.stride + 1
        extra = (math.ceil(frames) - 1) * self.stride + (self.effective - self.padding) - length
        x = mx.pad(x, [(0, 0), (self.padding, int(extra)), (0, 0)])
        conv = self.conv
        if conv.groups != 1:
            return conv(x)
        return conv1d_gemm(x, conv.weight, conv.get("bias"), conv.dilation, self.stride)


class CausalTransConv(nn.Module):
    """ConvTranspose1d with the (kernel - stride) trailing samples cut: T frames -> T * stride.

    With `trim_start`, as many leading samples are cut too: T -> (T - 1) * stride. That is how
    Qwen3-Omni's Code2Wav was trained (its reference cuts both ends), so its waveform comes out
    shorter than frames * upsample and starts that many samples late."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, trim_start: bool = False):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.stride = stride
        self.trim = kernel - stride
        self.start = self.trim if trim_start else 0

    def __call__(self, x: mx.array) -> mx.array:
        y = conv_transpose1d_gemm(x, self.conv.weight, self.conv.get("bias"), self.stride)
        return y[:, self.start : y.shape[1] - self.trim] if self.trim > 0 else y


@partial(mx.compile, shapeless=True)
def snake_beta(x: mx.array, alpha: mx.array, beta: mx.array) -> mx.array:
    """x + sin^2(x * e^alpha) / (e^beta + 1e-9). Compiled: one fused kernel instead of six
    elementwise passes over the decoder's largest activations (measured on the H200:
    benchmarks/tts_decoder_probe.py)."""
    return x + (1.0 / (mx.exp(beta) + 1e-9)) * mx.square(mx.sin(x * mx.exp(alpha)))


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / (e^beta + 1e-9), per channel."""

    def __init__(self, dims: int):
        super().__init__()
        self.alpha = mx.zeros((dims,))
        self.beta = mx.zeros((dims,))

    def __call__(self, x: mx.array) -> mx.array:
        return snake_beta(x, self.alpha, self.beta)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = Linear(dim, 4 * dim)
        self.pwconv2 = Linear(4 * dim, dim)
        self.gamma = mx.ones((dim,))

    def __call__(self, x: mx.array) -> mx.array:
        h = self.pwconv2(nn.gelu(self.pwconv1(self.norm(self.dwconv(x)))))
        return x + self.gamma * h


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def __call__(self, x: mx.array) -> mx.array:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int, trim_start: bool = False):
        super().__init__()
        self.block = [SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate, trim_start)]
        self.block += [ResidualUnit(cout, d) for d in (1, 3, 9)]

    def __call__(self, x: mx.array) -> mx.array:
        for layer in self.block:
            x = layer(x)
        return x


class Codebook(nn.Module):
    def __init__(self, dim: int, size: int):
        super().__init__()
        self.cluster_usage = mx.ones((size,))
        self.embedding_sum = mx.zeros((size, dim))

    def table(self) -> mx.array:
        return self.embedding_sum / mx.maximum(self.cluster_usage, 1e-5)[:, None]


class VQLayer(nn.Module):
    """Checkpoint key `..._codebook.*`; MLX modules hide attributes that start with an
    underscore, so it lives here as `codebook` (renamed in `sanitize`)."""

    def __init__(self, dim: int, size: int):
        super().__init__()
        self.codebook = Codebook(dim, size)


class VQ(nn.Module):
    def __init__(self, n: int, dim: int, size: int):
        super().__init__()
        self.layers = [VQLayer(dim, size) for _ in range(n)]


class ResidualVQ(nn.Module):
    """Sum of per-codebook lookups, then a 1x1 conv out (the 1x1 conv in serves the encoder)."""

    def __init__(self, n: int, dim: int, io_dim: int, size: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = VQ(n, dim, size)

    def decode(self, codes: mx.array) -> mx.array:
        # codes: (B, T, n) -> (B, T, io_dim)
        total = None
        for i, layer in enumerate(self.vq.layers):
            q = mx.take(layer.codebook.table(), codes[..., i], axis=0)
            total = q if total is None else total + q
        return self.output_proj(total)


class SplitResidualVQ(nn.Module):
    def __init__(self, args: SpeechDecoderArgs):
        super().__init__()
        dim = args.codebook_dim // 2
        self.rvq_first = ResidualVQ(1, dim, args.codebook_dim, args.codebook_size)
        self.rvq_rest = ResidualVQ(args.num_quantizers - 1, dim, args.codebook_dim, args.codebook_size)

    def decode(self, codes: mx.array) -> mx.array:
        return self.rvq_first.decode(codes[..., :1]) + self.rvq_rest.decode(codes[..., 1:])


class LayerScale(nn.Module):
    def __init__(self, dims: int):
        super().__init__()
        self.scale = mx.full((dims,), 0.01)

    def __call__(self, x: mx.array) -> mx.array:
        return self.scale * x


class TransformerLayer(nn.Module):
    """Pre-norm block of the shared decoder's Attention and MLP, each scaled before the residual."""

    def __init__(self, spec, rope):
        super().__init__()
        self.self_attn = Attention(spec, rope)
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(spec.hidden_size)
        self.mlp_layer_scale = LayerScale(spec.hidden_size)

    def __call__(self, x: mx.array, mask) -> mx.array:
        h = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), mask))
        return h + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(h)))


def sliding_window_mask(length: int, window: int) -> mx.array:
    """(L, L) bool: query i sees keys j with i - window < j <= i."""
    i = mx.arange(length)[:, None]
    j = mx.arange(length)[None, :]
    return (j <= i) & (j > i - window)


class PreTransformer(nn.Module):
    """Sliding-window causal transformer over the frames. `args` needs `to_spec()`,
    `sliding_window`, `hidden_size`, `rms_norm_eps` and, with projections, `latent_dim`: the
    speech tokenizer maps latent_dim <-> hidden_size around the layers; Code2Wav
    (projections=False) works at hidden_size throughout."""

    def __init__(self, args, projections: bool = True):
        super().__init__()
        spec = args.to_spec()
        rope = RoPE(spec.rope, spec.head_dim, spec.max_position_embeddings)
        self.window = int(args.sliding_window)
        if projections:
            self.input_proj = Linear(args.latent_dim, args.hidden_size)
        self.layers = [TransformerLayer(spec, rope) for _ in range(spec.num_hidden_layers)]
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        if projections:
            self.output_proj = Linear(args.hidden_size, args.latent_dim)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.input_proj(x) if "input_proj" in self else x
        mask = sliding_window_mask(h.shape[1], self.window)
        for layer in self.layers:
            h = layer(h, mask)
        h = self.norm(h)
        return self.output_proj(h) if "output_proj" in self else h


def upsample_stack(dim: int, ratios) -> List[list]:
    """Checkpoint keys `upsample.N.0` / `upsample.N.1`: per ratio f, a transposed conv by f
    (kernel f, so nothing to trim) and a ConvNeXt block."""
    return [[CausalTransConv(dim, dim, f, f), ConvNeXtBlock(dim)] for f in ratios]


def waveform_stack(in_dim: int, decoder_dim: int, rates, trim_start: bool = False) -> List[nn.Module]:
    """Checkpoint keys `decoder.N`: causal conv in_dim -> decoder_dim, one DecoderBlock per rate
    (channels halving each time), SnakeBeta, causal conv to one channel. `trim_start`: see
    CausalTransConv."""
    layers: List[nn.Module] = [CausalConv(in_dim, decoder_dim, 7)]
    for i, rate in enumerate(rates):
        layers.append(DecoderBlock(decoder_dim // 2**i, decoder_dim // 2 ** (i + 1), rate, trim_start))
    out_dim = decoder_dim // 2 ** len(rates)
    return layers + [SnakeBeta(out_dim), CausalConv(out_dim, 1, 7)]


def run_waveform(h: mx.array, upsample: List[list], decoder: List[nn.Module]) -> mx.array:
    """(B, T, C) frame features -> (B, samples) waveform in [-1, 1]."""
    for up, block in upsample:
        h = block(up(h))
    for layer in decoder:
        h = layer(h)
    return mx.clip(h[..., 0], -1.0, 1.0)


class SpeechDecoder(nn.Module):
    """`decoder.*` of speech_tokenizer/model.safetensors: codes (B, T, Q) -> waveform (B, T * upsample)."""

    def __init__(self, args: SpeechDecoderArgs):
        super().__init__()
        self.args = args
        self.total_upsample = args.total_upsample
        self.quantizer = SplitResidualVQ(args)
        self.pre_conv = CausalConv(args.codebook_dim, args.latent_dim, 3)
        self.pre_transformer = PreTransformer(args)
        self.upsample = upsample_stack(args.latent_dim, args.upsampling_ratios)
        self.decoder = waveform_stack(args.latent_dim, args.decoder_dim, args.upsample_rates)

    def __call__(self, codes: mx.array) -> mx.array:
        # codes: (B, T, Q) int
        if codes.shape[-1] != self.args.num_quantizers:
            raise ValueError(f"expected {self.args.num_quantizers} codebooks, got {codes.shape[-1]}")
        h = self.pre_conv(self.quantizer.decode(codes))
        h = self.pre_transformer(h)
        return run_waveform(h, self.upsample, self.decoder)

    def chunked(self, codes: mx.array, chunk: int = 300, left_context: int = 25) -> mx.array:
        """Decode `chunk` frames at a time, each with up to `left_context` earlier frames whose
        samples are dropped: the reference's chunked decode, and what streaming emits."""
        return decode_chunked(self, codes, chunk, left_context)


class StreamingDecoder:
    """Frames in, audio out: decodes every `chunk` new frames with `left_context` frames of
    history, so audio flows while the talker is still generating. With `first_chunk` set, the
    first piece is decoded after that many frames and each later piece doubles in size up to
    `chunk` (2, 4, 8, 12, 12, ...): a short wait for the first audio, few decodes after it.
    Without it the concatenated output equals `decoder.chunked(all_codes, chunk, left_context)`.
    `growth`: each piece after the first is this many times the one before (2: doubling), up to
    `chunk`.

    `decoder` is any model with `total_upsample` and `__call__(codes (B, T, Q)) -> (B, samples)`
    (SpeechDecoder, Qwen3-Omni's Code2Wav). `overlap`: samples to keep from before the
    context cut of every piece decoded with context; a decoder whose output starts that many
    samples late (Code2Wav's 555) would otherwise lose them at every piece boundary."""

    def __init__(self, decoder, chunk: int, left_context: int, first_chunk: Optional[int] = None,
                 overlap: int = 0, growth: int = 2):
        if chunk < 1 or left_context < 0 or (first_chunk is not None and first_chunk < 1) or overlap < 0:
            raise ValueError("chunk and first_chunk must be >= 1, left_context and overlap >= 0")
        if growth < 1:
            raise ValueError("growth must be >= 1")
        self.growth = growth
        self.decoder = decoder
        self.chunk = chunk
        self.left = left_context
        self.overlap = overlap
        self.next = min(first_chunk, chunk) if first_chunk else chunk  # frames in the next piece
        self.codes: Optional[mx.array] = None  # (B, T, Q)
        self.start = 0  # first frame not yet decoded

    def _decode(self, end: int) -> mx.array:
        ctx = min(self.left, self.start)
        wav = self.decoder(self.codes[:, self.start - ctx : end])
        self.start = end
        # the first piece has no context to cut, so an overlap can only come back after it
        return wav[:, max(ctx * self.decoder.total_upsample - self.overlap, 0) :]

    def push(self, codes: mx.array) -> Iterator[mx.array]:
        """Add frames (B, T, Q); yield waveform pieces (B, samples) for each full chunk."""
        self.codes = codes if self.codes is None else mx.concatenate([self.codes, codes], axis=1)
        while self.codes.shape[1] - self.start >= self.next:
            piece = self._decode(self.start + self.next)
            self.next = min(self.chunk, self.growth * self.next)
            yield piece

    def flush(self) -> Iterator[mx.array]:
        if self.codes is not None and self.codes.shape[1] > self.start:
            yield self._decode(self.codes.shape[1])


def decode_chunked(decoder, codes: mx.array, chunk: int, left_context: int, overlap: int = 0) -> mx.array:
    """`decoder` (see StreamingDecoder) over codes (B, T, Q) `chunk` frames at a time, each
    with up to `left_context` earlier frames whose samples are dropped -> (B, samples)."""
    stream = StreamingDecoder(decoder, chunk, left_context, overlap=overlap)
    pieces = list(stream.push(codes)) + list(stream.flush())
    return mx.concatenate(pieces, axis=-1) if pieces else mx.zeros((codes.shape[0], 0))


def torch_conv_to_mlx(model: nn.Module, weights: Dict[str, mx.array], prefix: str = "") -> Dict[str, mx.array]:
    """PyTorch conv weights -> MLX layout for every Conv1d / ConvTranspose1d under `model`.

    The published checkpoints are PyTorch's ((out, in, k); transposed convs (in, out, k)). A
    checkpoint already in MLX layout (out, k, in) is recognized as a whole, from the convs whose
    shape tells the layouts apart (a square one, e.g. (16, 8, 8), does not), and left alone."""
    convs = []
    for name, module in model.named_modules():
        key = f"{prefix}{name}.weight" if name else f"{prefix}weight"
        if key in weights and isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and weights[key].ndim == 3:
            convs.append((key, module))

    def torch_shape(key, module):
        o, k, i = module.weight.shape
        return (i, o, k) if isinstance(module, nn.ConvTranspose1d) else (o, i, k)

    mlx_votes = sum(
        1 for key, m in convs
        if tuple(weights[key].shape) == tuple(m.weight.shape) != torch_shape(key, m)
    )
    torch_votes = sum(
        1 for key, m in convs
        if tuple(weights[key].shape) == torch_shape(key, m) != tuple(m.weight.shape)
    )
    if mlx_votes > torch_votes:
        return dict(weights)
    out = dict(weights)
    for key, module in convs:
        w = out[key]
        if isinstance(module, nn.ConvTranspose1d):
            out[key] = w.transpose(1, 2, 0)  # (in, out, k) -> (out, k, in)
        else:
            out[key] = w.transpose(0, 2, 1)  # (out, in, k) -> (out, k, in)
    return out
