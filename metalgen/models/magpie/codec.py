"""NanoCodec in MLX: Magpie's codes (B, 8, T) <-> waveform (B, T * samples_per_frame).

NeMo's `AudioCodecModel.decode` (nemo/collections/tts/models/audio_codec.py) is
`dequantize` (GroupFiniteScalarQuantizer.decode) then `audio_decoder` (CausalHiFiGANDecoder,
nemo/collections/tts/modules/audio_codec_modules.py):

    codes (B, G, T) -> FSQ digits per group -> latent (B, T, G * D)
    -> pre_conv (causal conv, k=7)
    -> per up-sample rate r: activation, grouped causal transposed conv (k=2r, stride r, channels
       halved), res layer (the mean of one HiFiGANResBlock per kernel size, each a chain of
       residual blocks over the dilations)
    -> activation -> post_conv (causal conv to 1 channel) -> tanh or clamp

`AudioCodecModel.encode`, needed only for reference-audio cloning, is the mirror image: the clip
zero-padded to whole frames -> `audio_encoder` (HiFiGANEncoder, non-causal with symmetric padding
of a configurable mode, as in the published nanocodec; or CausalHiFiGANEncoder) -> the FSQ's
compress-and-round per group -> codes.

Layout is MLX's (B, T, C) throughout. Module attributes follow the checkpoint keys under
`audio_decoder.` and `audio_encoder.`; `sanitize` folds the weight-norm parametrizations, converts
PyTorch's conv layouts and drops the discriminator and quantizer buffers (those are checked against
the config: the FSQ has no learned weights). Reading the `.nemo` lives in
metalgen/magpie/codec_file.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Dict, List, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...errors import MetalgenError
from ..qwen3_tts.speech_decoder import CausalConv, conv1d_gemm, conv_transpose1d_gemm

_ACTIVATIONS = ("lrelu", "elu", "snake", "half_snake")
_OUTPUT_ACTIVATIONS = ("tanh", "clamp")
# torch.nn.Conv1d's padding modes, which HiFiGANEncoder's symmetric padding may use.
_PAD_MODES = ("zeros", "reflect", "replicate", "circular")
_ENCODERS = ("HiFiGANEncoder", "CausalHiFiGANEncoder")
# torch.nn.LeakyReLU's default slope, which CodecActivation and HalfSnake use.
_LRELU_SLOPE = 0.01


@dataclass
class NanoCodecEncoderArgs:
    """The codec config's `audio_encoder` (HiFiGANEncoder or CausalHiFiGANEncoder); the defaults are
    those classes' own, used where the config leaves a field out."""

    causal: bool
    encoded_dim: int
    down_sample_rates: List[int] = field(default_factory=lambda: [2, 2, 8, 8])
    base_channels: int = 32
    in_kernel_size: int = 7
    out_kernel_size: int = 7
    resblock_kernel_sizes: List[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: List[int] = field(default_factory=lambda: [1, 3, 5])
    activation: str = "lrelu"
    # HiFiGANEncoder's default. The causal encoder pads with zeros whatever this says: its pad_mode
    # only reaches nn.Conv1d's own padding, which it leaves at 0.
    pad_mode: str = "reflect"

    @classmethod
    def from_config(cls, enc: dict) -> "NanoCodecEncoderArgs":
        target = str(enc.get("_target_", "")).rsplit(".", 1)[-1]
        if target not in _ENCODERS:
            raise MetalgenError(f"unsupported codec encoder '{target or 'none'}' ({' or '.join(_ENCODERS)} only)")
        if "encoded_dim" not in enc:
            raise MetalgenError("the codec's audio_encoder config lacks encoded_dim")
        args = cls(causal=target == "CausalHiFiGANEncoder", encoded_dim=int(enc["encoded_dim"]))
        for name in ("base_channels", "in_kernel_size", "out_kernel_size"):
            if name in enc:
                setattr(args, name, int(enc[name]))
        for name in ("down_sample_rates", "resblock_kernel_sizes", "resblock_dilation_sizes"):
            if name in enc:
                setattr(args, name, [int(v) for v in enc[name]])
        for name in ("activation", "pad_mode"):
            if name in enc:
                setattr(args, name, str(enc[name]).lower())
        if args.activation not in _ACTIVATIONS:
            raise MetalgenError(f"unsupported codec encoder activation '{args.activation}'")
        if args.pad_mode not in _PAD_MODES:
            raise MetalgenError(f"unsupported codec encoder pad_mode '{args.pad_mode}' (one of {', '.join(_PAD_MODES)})")
        return args


@dataclass
class NanoCodecArgs:
    """The decoding side of a NeMo AudioCodecModel config (its `model_config.yaml`)."""

    sample_rate: int = 22050
    samples_per_frame: int = 1024
    num_groups: int = 8
    num_levels_per_group: List[int] = field(default_factory=lambda: [8, 7, 6, 6])
    input_dim: int = 32
    # The defaults below are CausalHiFiGANDecoder's own, used when the config leaves them out.
    up_sample_rates: List[int] = field(default_factory=lambda: [8, 8, 2, 2])
    base_channels: int = 512
    in_kernel_size: int = 7
    out_kernel_size: int = 3
    resblock_kernel_sizes: List[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: List[int] = field(default_factory=lambda: [1, 3, 5])
    activation: str = "lrelu"
    output_activation: str = "tanh"
    n_groups_equal_to_out_channels: bool = True
    fsq_eps: float = 1e-3  # FiniteScalarQuantizer's eps: the encode side scales by (1 - eps)
    # The encoder's config, or None with the reason in `encoder_error` (decoding needs no encoder).
    encoder: Optional[NanoCodecEncoderArgs] = None
    encoder_error: Optional[str] = None

    @property
    def num_codebooks(self) -> int:
        return self.num_groups

    @property
    def codebook_size(self) -> int:
        return math.prod(self.num_levels_per_group)

    @classmethod
    def from_config(cls, cfg: dict) -> "NanoCodecArgs":
        """From the codec's whole model config (as `read_nemo` returns it). Refuses quantizers,
        decoders and activations this module does not implement, with a one-line error."""
        vq = cfg.get("vector_quantizer") or {}
        dec = cfg.get("audio_decoder") or {}
        vq_target = str(vq.get("_target_", ""))
        dec_target = str(dec.get("_target_", ""))
        if not vq_target.endswith(".GroupFiniteScalarQuantizer"):
            raise MetalgenError(
                f"unsupported codec quantizer '{vq_target or 'none'}' (GroupFiniteScalarQuantizer only)"
            )
        if not dec_target.endswith(".CausalHiFiGANDecoder"):
            raise MetalgenError(f"unsupported codec decoder '{dec_target or 'none'}' (CausalHiFiGANDecoder only)")
        args = cls(
            sample_rate=int(cfg.get("sample_rate", cls.sample_rate)),
            samples_per_frame=int(cfg.get("samples_per_frame", cls.samples_per_frame)),
            num_groups=int(vq["num_groups"]),
            num_levels_per_group=[int(v) for v in vq["num_levels_per_group"]],
        )
        for name in ("input_dim", "base_channels", "in_kernel_size", "out_kernel_size"):
            if name in dec:
                setattr(args, name, int(dec[name]))
        for name in ("up_sample_rates", "resblock_kernel_sizes", "resblock_dilation_sizes"):
            if name in dec:
                setattr(args, name, [int(v) for v in dec[name]])
        for name in ("activation", "output_activation"):
            if name in dec:
                setattr(args, name, str(dec[name]).lower())
        if "n_groups_equal_to_out_channels" in dec:
            args.n_groups_equal_to_out_channels = bool(dec["n_groups_equal_to_out_channels"])
        # `pad_mode` only reaches nn.Conv1d's own padding, which CausalConv1dNorm leaves at 0 (it
        # pads with zeros itself), so it changes nothing and is not read.
        if args.activation not in _ACTIVATIONS:
            raise MetalgenError(f"unsupported codec activation '{args.activation}' (one of {', '.join(_ACTIVATIONS)})")
        if args.output_activation not in _OUTPUT_ACTIVATIONS:
            raise MetalgenError(f"unsupported codec output activation '{args.output_activation}'")
        latent = args.num_groups * len(args.num_levels_per_group)
        if latent != args.input_dim:
            raise MetalgenError(f"codec quantizer gives {latent} latent dims but the decoder takes {args.input_dim}")
        if "eps" in vq:
            args.fsq_eps = float(vq["eps"])
        # An unsupported encoder only matters for cloning, so it is recorded, not raised here.
        try:
            args.encoder = NanoCodecEncoderArgs.from_config(cfg.get("audio_encoder") or {})
            if args.encoder.encoded_dim != latent:
                raise MetalgenError(f"codec encoder gives {args.encoder.encoded_dim} dims but the quantizer takes {latent}")
            if math.prod(args.encoder.down_sample_rates) != args.samples_per_frame:
                raise MetalgenError(
                    f"codec encoder down-samples by {math.prod(args.encoder.down_sample_rates)}, "
                    f"not samples_per_frame {args.samples_per_frame}"
                )
        except MetalgenError as e:
            args.encoder, args.encoder_error = None, str(e)
        return args


@partial(mx.compile, shapeless=True)
def snake(x: mx.array, alpha: mx.array) -> mx.array:
    """x + sin(alpha x)^2 / (alpha + 1e-9), with the raw alpha (NeMo's Snake; no exp, unlike
    Qwen's SnakeBeta). Compiled into one kernel over the decoder's largest activations."""
    return x + (1.0 / (alpha + 1e-9)) * mx.square(mx.sin(alpha * x))


class Snake(nn.Module):
    """NeMo's Snake: one raw alpha per channel (checkpoint (1, C, 1), stored flat)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = mx.ones((channels,))

    def __call__(self, x: mx.array) -> mx.array:
        return snake(x, self.alpha)


@partial(mx.compile, shapeless=True)
def half_snake(x: mx.array, alpha: mx.array, on: mx.array) -> mx.array:
    """Snake (`snake`'s formula) where `on` (C,) is true, LeakyReLU(0.01) elsewhere; alpha (C,) is
    read only where `on`. One kernel, where slicing the halves and joining them again took four."""
    s = x + (1.0 / (alpha + 1e-9)) * mx.square(mx.sin(alpha * x))
    return mx.where(on, s, mx.maximum(_LRELU_SLOPE * x, x))


class HalfSnake(nn.Module):
    """Snake on the first channels // 2 channels, LeakyReLU(0.01) on the rest."""

    def __init__(self, channels: int):
        super().__init__()
        self.snake_channels = channels // 2
        self.snake_act = Snake(self.snake_channels)
        # underscored: not a parameter; which channels take the snake. Made from host data, so it is
        # never a pending computation bound to the stream of the thread that built the model.
        self._on = mx.array(np.arange(channels) < self.snake_channels)

    def __call__(self, x: mx.array) -> mx.array:
        alpha = mx.pad(self.snake_act.alpha, [(0, self._on.shape[0] - self.snake_channels)], constant_values=1.0)
        return half_snake(x, alpha, self._on)


class CodecActivation(nn.Module):
    """NeMo's CodecActivation: the parameterized kinds sit under `.activation` as in the
    checkpoint (`activation.alpha`, `activation.snake_act.alpha`); lrelu and elu have none."""

    def __init__(self, kind: str, channels: int):
        super().__init__()
        self.kind = kind
        if kind == "snake":
            self.activation = Snake(channels)
        elif kind == "half_snake":
            self.activation = HalfSnake(channels)

    def __call__(self, x: mx.array) -> mx.array:
        if self.kind == "lrelu":
            return nn.leaky_relu(x, _LRELU_SLOPE)
        if self.kind == "elu":
            return nn.elu(x)
        return self.activation(x)


class _Weights(nn.Module):
    """A conv's weight and bias, under the `conv.` name the checkpoint gives them."""

    def __init__(self, weight_shape, channels: int):
        super().__init__()
        self.weight = mx.zeros(weight_shape)
        self.bias = mx.zeros((channels,))


def grouped_conv_transpose1d(x: mx.array, weight: mx.array, bias, stride: int) -> mx.array:
    """ConvTranspose1d without padding, any group count: (B, T, Cin) -> (B, (T-1)*stride + k, Cout).

    `weight` is (Cout, k, Cin / groups), MLX's grouped layout. Ungrouped, it is the existing
    GEMM form. Grouped (NanoCodec: one output channel per group of two inputs), a GEMM per group
    would be a 2-wide product, so each group's taps are a broadcast multiply and sum instead, then
    the k taps are overlap-added stride by stride."""
    cout, k, cin_g = weight.shape
    B, T, cin = x.shape
    groups = cin // cin_g
    if groups == 1:
        return conv_transpose1d_gemm(x, weight, bias, stride)
    cout_g = cout // groups
    # y[b, t, g, o, p] = sum_i x[b, t, g, i] * w[g, o, p, i]
    y = (x.reshape(B, T, groups, 1, 1, cin_g) * weight.reshape(groups, cout_g, k, cin_g)).sum(-1)
    m = -(-k // stride)
    y = y.reshape(B, T, cout, k)
    if m * stride != k:
        y = mx.pad(y, [(0, 0), (0, 0), (0, 0), (0, m * stride - k)])
    # (B, T, m, stride, Cout): tap block i of frame t lands at output frame t + i.
    y = y.reshape(B, T, cout, m, stride).transpose(0, 1, 3, 4, 2)
    out = None
    for i in range(m):
        part = mx.pad(y[:, :, i], [(0, 0), (i, m - 1 - i), (0, 0), (0, 0)])
        out = part if out is None else out + part
    out = out.reshape(B, (T + m - 1) * stride, cout)[:, : (T - 1) * stride + k]
    return out if bias is None else out + bias


class CausalConvTranspose1dNorm(nn.Module):
    """Transposed conv with all (k - stride) overhanging samples cut on the right (NeMo's
    trim_right_ratio 1): T frames -> T * stride samples, and no output depends on a later frame."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, groups: int):
        super().__init__()
        self.conv = _Weights((cout, kernel, cin // groups), cout)
        self.stride = stride

    def __call__(self, x: mx.array) -> mx.array:
        y = grouped_conv_transpose1d(x, self.conv.weight, self.conv.bias, self.stride)
        return y[:, : x.shape[1] * self.stride]


def _pad_time(x: mx.array, pad: int, mode: str) -> mx.array:
    """`pad` frames on both sides of (B, T, C) as torch.nn.Conv1d's padding_mode does it."""
    if pad == 0:
        return x
    if mode == "zeros":
        return mx.pad(x, [(0, 0), (pad, pad), (0, 0)])
    if mode == "replicate":
        return mx.pad(x, [(0, 0), (pad, pad), (0, 0)], mode="edge")
    if mode == "circular":
        return mx.concatenate([x[:, -pad:], x, x[:, :pad]], axis=1)
    # reflect: the edge sample is not repeated, so torch needs more frames than the padding
    if pad >= x.shape[1]:
        raise MetalgenError(f"the clip is too short for the codec encoder ({x.shape[1]} frames at a reflect pad of {pad})")
    return mx.concatenate([x[:, 1 : pad + 1][:, ::-1], x, x[:, -pad - 1 : -1][:, ::-1]], axis=1)


class SymmetricConv(nn.Module):
    """NeMo's Conv1dNorm: a Conv1d padded on both sides (`padding` frames, default half the
    dilated kernel) in a torch padding mode. Weight (out, k, in) under `conv.`, as the checkpoint."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1,
                 padding: Optional[int] = None, pad_mode: str = "reflect"):
        super().__init__()
        self.conv = _Weights((cout, kernel, cin), cout)
        self.stride, self.dilation, self.pad_mode = stride, dilation, pad_mode
        # Conv1dNorm replaces a padding of 0 (or None) by get_padding, so 0 is never kept.
        self.padding = padding if padding else (kernel * dilation - dilation) // 2

    def __call__(self, x: mx.array) -> mx.array:
        x = _pad_time(x, self.padding, self.pad_mode)
        return conv1d_gemm(x, self.conv.weight, self.conv.bias, self.dilation, self.stride)


def _conv(cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, causal: bool = True,
          pad_mode: str = "zeros", padding: Optional[int] = None) -> nn.Module:
    """CausalConv1dNorm (zeros on the left) or Conv1dNorm (symmetric, `pad_mode`)."""
    if causal:
        return CausalConv(cin, cout, kernel, dilation=dilation, stride=stride)
    return SymmetricConv(cin, cout, kernel, stride, dilation, padding, pad_mode)


class ResidualBlock(nn.Module):
    """x + skip_conv(act(input_conv(act(x)))); only input_conv is dilated. Causal in the decoder
    and the causal encoder, symmetric in HiFiGANEncoder."""

    def __init__(self, channels: int, kernel: int, dilation: int, activation: str, causal: bool = True,
                 pad_mode: str = "zeros"):
        super().__init__()
        self.input_activation = CodecActivation(activation, channels)
        self.input_conv = _conv(channels, channels, kernel, dilation, causal=causal, pad_mode=pad_mode)
        self.skip_activation = CodecActivation(activation, channels)
        self.skip_conv = _conv(channels, channels, kernel, causal=causal, pad_mode=pad_mode)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.input_conv(self.input_activation(x))
        return x + self.skip_conv(self.skip_activation(h))


class HiFiGANResBlock(nn.Module):
    """One kernel size: residual blocks chained over the dilations."""

    def __init__(self, channels: int, kernel: int, dilations: List[int], activation: str, **conv):
        super().__init__()
        self.res_blocks = [ResidualBlock(channels, kernel, d, activation, **conv) for d in dilations]

    def __call__(self, x: mx.array) -> mx.array:
        for block in self.res_blocks:
            x = block(x)
        return x


class HiFiGANResLayer(nn.Module):
    """The mean of one HiFiGANResBlock per kernel size, all fed the same input."""

    def __init__(self, channels: int, kernels: List[int], dilations: List[int], activation: str, **conv):
        super().__init__()
        self.res_blocks = [HiFiGANResBlock(channels, k, dilations, activation, **conv) for k in kernels]

    def __call__(self, x: mx.array) -> mx.array:
        out = None
        for block in self.res_blocks:
            y = block(x)
            out = y if out is None else out + y
        return out / len(self.res_blocks)


class HiFiGANEncoder(nn.Module):
    """waveform (B, N, 1), N a multiple of prod(down_sample_rates) -> latent (B, N / prod, encoded_dim).

    NeMo's HiFiGANEncoder (symmetric padding in `pad_mode`) and CausalHiFiGANEncoder (zeros on the
    left) share this structure: pre_conv, then per rate r a res layer, an activation and a conv
    (k = 2r, stride r) doubling the channels, then an activation and post_conv."""

    def __init__(self, a: NanoCodecEncoderArgs):
        super().__init__()
        conv = dict(causal=a.causal, pad_mode=a.pad_mode)
        self.pre_conv = _conv(1, a.base_channels, a.in_kernel_size, **conv)
        self.res_layers, self.activations, self.down_sample_conv_layers = [], [], []
        channels = a.base_channels
        for rate in a.down_sample_rates:
            self.res_layers.append(
                HiFiGANResLayer(channels, a.resblock_kernel_sizes, a.resblock_dilation_sizes, a.activation, **conv)
            )
            self.activations.append(CodecActivation(a.activation, channels))
            # HiFiGANEncoder pads (k - stride + 1) // 2 per side: N frames -> N / rate.
            self.down_sample_conv_layers.append(
                _conv(channels, 2 * channels, 2 * rate, stride=rate, padding=(rate + 1) // 2, **conv)
            )
            channels *= 2
        self.post_activation = CodecActivation(a.activation, channels)
        self.post_conv = _conv(channels, a.encoded_dim, a.out_kernel_size, **conv)

    def __call__(self, audio: mx.array) -> mx.array:
        x = self.pre_conv(audio)
        for res, act, down in zip(self.res_layers, self.activations, self.down_sample_conv_layers):
            x = down(act(res(x)))
        return self.post_conv(self.post_activation(x))


class CausalHiFiGANDecoder(nn.Module):
    """latent (B, T, input_dim) -> waveform (B, T * prod(up_sample_rates))."""

    def __init__(self, args: NanoCodecArgs):
        super().__init__()
        self.pre_conv = CausalConv(args.input_dim, args.base_channels, args.in_kernel_size)
        self.activations = []
        self.up_sample_conv_layers = []
        self.res_layers = []
        channels = args.base_channels
        for rate in args.up_sample_rates:
            out = channels // 2
            groups = out if args.n_groups_equal_to_out_channels else 1
            self.activations.append(CodecActivation(args.activation, channels))
            self.up_sample_conv_layers.append(CausalConvTranspose1dNorm(channels, out, 2 * rate, rate, groups))
            self.res_layers.append(
                HiFiGANResLayer(out, args.resblock_kernel_sizes, args.resblock_dilation_sizes, args.activation)
            )
            channels = out
        self.post_activation = CodecActivation(args.activation, channels)
        self.post_conv = CausalConv(channels, 1, args.out_kernel_size)
        self.output_activation = args.output_activation

    def __call__(self, latent: mx.array) -> mx.array:
        x = self.pre_conv(latent)
        for act, up, res in zip(self.activations, self.up_sample_conv_layers, self.res_layers):
            x = res(up(act(x)))
        x = self.post_conv(self.post_activation(x))[..., 0]
        return mx.tanh(x) if self.output_activation == "tanh" else mx.clip(x, -1.0, 1.0)


class NanoCodec(nn.Module):
    """NanoCodec: FSQ dequantization and the causal HiFi-GAN decoder, plus (with `encoder`) the
    HiFi-GAN encoder and the FSQ's quantization for reference-audio cloning."""

    def __init__(self, args: NanoCodecArgs, encoder: bool = False):
        super().__init__()
        self.args = args
        self.audio_decoder = CausalHiFiGANDecoder(args)
        levels = args.num_levels_per_group
        # Underscored: kept out of parameters(). The digit of level d is (code // base_d) % L_d.
        self._levels = mx.array(levels, dtype=mx.int32)
        self._base = mx.array(np.cumprod([1] + levels[:-1]), dtype=mx.int32)
        if encoder:
            self.add_encoder()

    @property
    def has_encoder(self) -> bool:
        return "audio_encoder" in self

    def add_encoder(self) -> None:
        """Build the encoder's modules (their weights still to be loaded), or raise why it cannot be."""
        if self.args.encoder is None:
            raise MetalgenError(f"this codec cannot encode audio: {self.args.encoder_error}")
        self.audio_encoder = HiFiGANEncoder(self.args.encoder)
        # FiniteScalarQuantizer.compress, per latent dim of a group, in float32 as NeMo computes it:
        # y = scale * tanh(x + shift) - offset, rounded; scale = (L - 1) / 2 * (1 - eps), offset 0.5
        # for an even L (so that L values round apart), shift = tan(offset / scale).
        L = np.array(self.args.num_levels_per_group, dtype=np.float32)
        scale = (L - np.float32(1)) / np.float32(2) * np.float32(1.0 - self.args.fsq_eps)
        offset = np.where(np.array(self.args.num_levels_per_group) % 2 == 0, 0.5, 0.0).astype(np.float32)
        self._fsq_scale = mx.array(scale)
        self._fsq_offset = mx.array(offset)
        self._fsq_shift = mx.array(np.tan(offset / scale).astype(np.float32))

    def _latent(self, codes: mx.array) -> mx.array:
        """codes (B, G, T) -> latent (B, T, G * D), group g in dims [g*D, (g+1)*D)."""
        if codes.ndim != 3 or codes.shape[1] != self.args.num_codebooks:
            raise MetalgenError(
                f"codec codes must be (batch, {self.args.num_codebooks}, frames), got {tuple(codes.shape)}"
            )
        B, G, T = codes.shape
        # NeMo's arithmetic, not a table lookup: it is as cheap, and gives what NeMo gives even
        # for an out-of-range code instead of an out-of-bounds read.
        digits = (codes.astype(mx.int32)[..., None] // self._base) % self._levels  # (B, G, T, D)
        half = self._levels // 2
        values = (digits - half).astype(mx.float32) / half.astype(mx.float32)
        return values.transpose(0, 2, 1, 3).reshape(B, T, G * len(self.args.num_levels_per_group))

    def dequantize(self, codes: mx.array) -> mx.array:
        """codes (B, G, T) int -> latent (B, G * D, T) float32, NeMo's layout and values."""
        return self._latent(codes).transpose(0, 2, 1)

    def decode(self, codes: mx.array) -> mx.array:
        """codes (B, G, T) int -> waveform (B, T * samples_per_frame) float32 in [-1, 1]."""
        return self.audio_decoder(self._latent(codes))

    def __call__(self, codes: mx.array) -> mx.array:
        return self.decode(codes)

    # ----------------------------------------------------------------------------- encoding

    def _require_encoder(self):
        if not self.has_encoder:
            raise MetalgenError("this codec was loaded without its encoder (load_codec(..., encoder=True))")

    def encode_latent(self, wav: mx.array) -> mx.array:
        """waveform (B, N) at the codec's rate -> encoder output (B, ceil(N / spf), G * D): the clip
        zero-padded at the end to whole frames, as AudioCodecModel.encode_audio does."""
        self._require_encoder()
        spf = self.args.samples_per_frame
        B, N = wav.shape
        frames = -(-N // spf)
        if frames * spf != N:
            wav = mx.pad(wav, [(0, 0), (0, frames * spf - N)])
        return self.audio_encoder(wav.astype(mx.float32)[..., None])  # (B, frames, G * D)

    def quantize(self, latent: mx.array) -> mx.array:
        """Encoder output (B, T, G * D) -> codes (B, G, T) int32: each group's D dims compressed,
        rounded half to even (torch.round) and read as digits of the mixed-radix code."""
        self._require_encoder()
        B, T, _ = latent.shape
        G, D = self.args.num_groups, len(self.args.num_levels_per_group)
        x = latent.astype(mx.float32).reshape(B, T, G, D)  # group g = dims [g*D, (g+1)*D)
        y = self._fsq_scale * mx.tanh(x + self._fsq_shift) - self._fsq_offset
        # round(y) lies in [-L//2, L - 1 - L//2]; NeMo's float route (/ half, * half + half) is exact here.
        digits = mx.round(y).astype(mx.int32) + self._levels // 2
        codes = (digits * self._base).sum(axis=-1)  # (B, T, G)
        return codes.transpose(0, 2, 1)

    def encode(self, wav: mx.array) -> mx.array:
        """waveform (B, N) float at the codec's sample rate -> codes (B, G, ceil(N / samples_per_frame))
        int32, AudioCodecModel.encode."""
        return self.quantize(self.encode_latent(wav))


def _fold_weight_norm(weights: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """W = g * v / ||v||, the norm over every axis but 0, for both of torch's spellings:
    `parametrizations.weight.original0/1` (torch.nn.utils.parametrizations.weight_norm) and
    `weight_g` / `weight_v` (the older torch.nn.utils.weight_norm)."""
    out = {}
    pairs = {}
    for key, value in weights.items():
        for g_suffix, v_suffix in ((".parametrizations.weight.original0", ".parametrizations.weight.original1"),
                                   (".weight_g", ".weight_v")):
            if key.endswith(g_suffix):
                pairs.setdefault(key[: -len(g_suffix)], {})["g"] = (key, value)
                break
            if key.endswith(v_suffix):
                pairs.setdefault(key[: -len(v_suffix)], {})["v"] = (key, value)
                break
        else:
            out[key] = value
    for prefix, pair in pairs.items():
        if set(pair) != {"g", "v"}:
            (key, _), = pair.values()
            raise MetalgenError(f"weight-norm tensor '{key}' has no partner")
        g = np.asarray(pair["g"][1], np.float32)
        v = np.asarray(pair["v"][1], np.float32)
        norm = np.sqrt(np.square(v).sum(axis=tuple(range(1, v.ndim)), keepdims=True))
        out[prefix + ".weight"] = v * (g / norm)
    return out


def sanitize(args: NanoCodecArgs, weights: Dict[str, np.ndarray], source: str, decoder: bool = True,
             encoder: bool = False) -> Dict[str, mx.array]:
    """A codec checkpoint's state dict -> NanoCodec's parameters: the decoder's tensors (`decoder`)
    and the encoder's (`encoder`), weight norm folded, convs in MLX layout, activations' alpha
    (1, C, 1) flattened. The quantizer's buffers must agree with the config."""
    levels = np.array(args.num_levels_per_group)
    base = np.cumprod([1] + args.num_levels_per_group[:-1])
    for g in range(args.num_groups):
        for name, want in (("num_levels", levels), ("dim_base_index", base)):
            key = f"vector_quantizer.fsqs.{g}.{name}"
            if key in weights and not np.array_equal(np.asarray(weights[key]).reshape(-1), want):
                raise MetalgenError(f"tensor '{key}' in {source} disagrees with the config's levels {list(levels)}")
    prefixes = tuple(p for p, on in (("audio_decoder.", decoder), ("audio_encoder.", encoder)) if on)
    kept = {k: v for k, v in weights.items() if k.startswith(prefixes)}
    out = {}
    for key, value in _fold_weight_norm(kept).items():
        value = np.asarray(value, np.float32)
        if key.endswith(".alpha"):
            value = value.reshape(-1)
        elif value.ndim == 3 and ".up_sample_conv_layers." in key:
            # torch ConvTranspose1d (Cin, Cout/groups, k) -> (Cout, k, Cin/groups): input channel
            # g*ci + i and output o of group g become output g*co + o, input i.
            cin, cout_g, k = value.shape
            groups = cin // 2 if args.n_groups_equal_to_out_channels else 1  # CausalHiFiGANDecoder's rule
            value = value.reshape(groups, cin // groups, cout_g, k).transpose(0, 2, 3, 1)
            value = value.reshape(groups * cout_g, k, cin // groups)
        elif value.ndim == 3:
            value = value.transpose(0, 2, 1)  # torch Conv1d (out, in, k) -> (out, k, in), both halves
        out[key] = mx.array(value)
    return out
