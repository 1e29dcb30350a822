"""The 12 Hz speech tokenizer's encoder (a Mimi model without its decoder): a 24 kHz clip ->
16 codebooks per 80 ms frame. The Base model clones a voice in context from these codes.

    SEANet conv encoder (causal convs, ELU, residual blocks, strided downsampling) ->
    causal transformer (metalgen's decoder Attention, LayerNorm, GELU MLP, layer scales) ->
    strided conv to the frame rate -> split residual VQ (nearest codeword, residual by residual)

Attributes follow the checkpoint keys under `encoder.` in speech_tokenizer/model.safetensors.
"""

from __future__ import annotations

import math
from typing import Any, Dict

import mlx.core as mx
import mlx.nn as nn

from ..decoder import Attention, DecoderSpec
from ..layers import Linear
from ..rope import RopeConfig, RoPE
from .speech_decoder import conv1d_gemm, torch_conv_to_mlx

MIMI_DEFAULTS = dict(
    sampling_rate=24000, frame_rate=12.5, audio_channels=1, hidden_size=512, num_filters=64,
    num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], kernel_size=7, last_kernel_size=3,
    residual_kernel_size=3, dilation_growth_rate=2, use_causal_conv=True, pad_mode="constant",
    compress=2, codebook_size=2048, codebook_dim=256, num_quantizers=32, use_conv_shortcut=False,
    vector_quantization_hidden_dimension=256, num_semantic_quantizers=1, num_hidden_layers=8,
    intermediate_size=2048, num_attention_heads=8, num_key_value_heads=8, head_dim=None,
    hidden_act="gelu", max_position_embeddings=8000, rope_theta=10000.0, norm_eps=1e-5,
    attention_bias=False,
)


class ELU(nn.Module):
    def __call__(self, x):
        return nn.elu(x)


class MimiConv(nn.Module):
    """Causal conv: left pad (effective kernel - stride), right pad what the last frame needs;
    zeros, or the edge value for 'replicate'."""

    def __init__(self, cin, cout, kernel, stride=1, dilation=1, bias=True, pad_mode="constant"):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.effective = (kernel - 1) * dilation + 1
        self.padding = self.effective - stride
        self.pad_mode = pad_mode

    def __call__(self, x):
        length = x.shape[1]
        frames = math.ceil((length - self.effective + self.padding) / self.stride + 1) - 1
        extra = frames * self.stride + self.effective - self.padding - length
        if self.pad_mode == "replicate":
            parts = [mx.repeat(x[:, :1], self.padding, 1)] if self.padding else []
            parts.append(x)
            if extra > 0:
                parts.append(mx.repeat(x[:, -1:], extra, 1))
            x = mx.concatenate(parts, axis=1)
        else:
            x = mx.pad(x, [(0, 0), (self.padding, max(int(extra), 0)), (0, 0)])
        return conv1d_gemm(x, self.conv.weight, self.conv.get("bias"), self.conv.dilation, self.stride)


class ResnetBlock(nn.Module):
    def __init__(self, c, dim, dilations):
        super().__init__()
        hidden = dim // c["compress"]
        kernels = (c["residual_kernel_size"], 1)
        self.block = []
        for i, (k, d) in enumerate(zip(kernels, dilations)):
            cin = dim if i == 0 else hidden
            cout = dim if i == len(kernels) - 1 else hidden
            self.block += [ELU(), MimiConv(cin, cout, k, dilation=d, pad_mode=c["pad_mode"])]
        if c["use_conv_shortcut"]:
            self.shortcut = MimiConv(dim, dim, 1, pad_mode=c["pad_mode"])

    def __call__(self, x):
        h = x
        for layer in self.block:
            h = layer(h)
        return (self.shortcut(x) if "shortcut" in self else x) + h


class SEANetEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        nf = c["num_filters"]
        layers = [MimiConv(c["audio_channels"], nf, c["kernel_size"], pad_mode=c["pad_mode"])]
        scale = 1
        for ratio in reversed(c["upsampling_ratios"]):
            dim = scale * nf
            for j in range(c["num_residual_layers"]):
                layers.append(ResnetBlock(c, dim, [c["dilation_growth_rate"] ** j, 1]))
            layers += [ELU(), MimiConv(dim, dim * 2, ratio * 2, stride=ratio, pad_mode=c["pad_mode"])]
            scale *= 2
        layers += [ELU(), MimiConv(scale * nf, c["hidden_size"], c["last_kernel_size"], pad_mode=c["pad_mode"])]
        self.layers = layers

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class MLP(nn.Module):
    def __init__(self, dims, hidden):
        super().__init__()
        self.fc1 = Linear(dims, hidden, bias=False)
        self.fc2 = Linear(hidden, dims, bias=False)

    def __call__(self, x):
        return self.fc2(nn.gelu(self.fc1(x)))


class LayerScale(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.scale = mx.full((dims,), 0.01)

    def __call__(self, x):
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, c, spec, rope):
        super().__init__()
        self.self_attn = Attention(spec, rope)
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = nn.LayerNorm(c["hidden_size"], eps=c["norm_eps"])
        self.post_attention_layernorm = nn.LayerNorm(c["hidden_size"], eps=c["norm_eps"])
        self.self_attn_layer_scale = LayerScale(c["hidden_size"])
        self.mlp_layer_scale = LayerScale(c["hidden_size"])

    def __call__(self, x, mask):
        h = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), mask))
        return h + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(h)))


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        head_dim = c["head_dim"] or c["hidden_size"] // c["num_attention_heads"]
        spec = DecoderSpec(
            hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"],
            intermediate_size=c["intermediate_size"], num_attention_heads=c["num_attention_heads"],
            num_key_value_heads=c["num_key_value_heads"] or c["num_attention_heads"], head_dim=head_dim,
            vocab_size=0, rms_norm_eps=c["norm_eps"], max_position_embeddings=c["max_position_embeddings"],
            rope=RopeConfig(theta=float(c["rope_theta"])),
        )
        rope = RoPE(spec.rope, head_dim, spec.max_position_embeddings)
        self.layers = [TransformerLayer(c, spec, rope) for _ in range(spec.num_hidden_layers)]

    def __call__(self, x):
        # Causal over the whole clip (the reference's eager path ignores the sliding window).
        mask = "causal" if x.shape[1] > 1 else None
        for layer in self.layers:
            x = layer(x, mask)
        return x


class Codebook(nn.Module):
    def __init__(self, size, dim):
        super().__init__()
        self.embed_sum = mx.zeros((size, dim))
        self.cluster_usage = mx.ones((size,))

    def table(self):
        return self.embed_sum / mx.maximum(self.cluster_usage, 1e-5)[:, None]


class VQ(nn.Module):
    def __init__(self, size, dim):
        super().__init__()
        self.codebook = Codebook(size, dim)


class ResidualVQ(nn.Module):
    def __init__(self, c, n):
        super().__init__()
        vq_dim = c["vector_quantization_hidden_dimension"]
        self.layers = [VQ(c["codebook_size"], c["codebook_dim"]) for _ in range(n)]
        if vq_dim != c["hidden_size"]:
            self.input_proj = nn.Conv1d(c["hidden_size"], vq_dim, 1, bias=False)
            self.output_proj = nn.Conv1d(vq_dim, c["hidden_size"], 1, bias=False)

    def encode(self, x, n):
        # x (B, T, hidden) -> codes (B, T, n)
        if "input_proj" in self:
            x = self.input_proj(x)
        residual = x.astype(mx.float32)
        codes = []
        for layer in self.layers[:n]:
            table = layer.codebook.table().astype(mx.float32)
            # nearest codeword: argmin ||r - e||^2 = argmin (||e||^2 - 2 r.e)
            d = mx.sum(table * table, axis=-1) - 2.0 * (residual @ table.T)
            idx = mx.argmin(d, axis=-1)
            codes.append(idx)
            residual = residual - mx.take(table, idx, axis=0)
        return mx.stack(codes, axis=-1)


class SplitResidualVQ(nn.Module):
    def __init__(self, c):
        super().__init__()
        sem = c["num_semantic_quantizers"]
        self.semantic_residual_vector_quantizer = ResidualVQ(c, sem)
        self.acoustic_residual_vector_quantizer = ResidualVQ(c, c["num_quantizers"] - sem)
        self.n_semantic = sem

    def encode(self, x, n):
        codes = self.semantic_residual_vector_quantizer.encode(x, self.n_semantic)
        if n > self.n_semantic:
            rest = self.acoustic_residual_vector_quantizer.encode(x, n - self.n_semantic)
            codes = mx.concatenate([codes, rest], axis=-1)
        return codes


class SpeechEncoder(nn.Module):
    """`encoder.*`: waveform (B, samples) at 24 kHz -> codes (B, frames, valid_quantizers)."""

    def __init__(self, config: Dict[str, Any], valid_quantizers: int = 16, downsample_rate: int = 1920):
        super().__init__()
        c = dict(MIMI_DEFAULTS)
        c.update({k: v for k, v in config.items() if k in MIMI_DEFAULTS and v is not None})
        self.c = c
        self.valid = int(valid_quantizers)
        self.downsample_rate = int(downsample_rate)
        self.encoder = SEANetEncoder(c)
        self.encoder_transformer = Transformer(c)
        hop = 1
        for r in c["upsampling_ratios"]:
            hop *= int(r)
        encodec_rate = math.ceil(c["sampling_rate"] / hop)
        if c["frame_rate"] != encodec_rate:
            k = 2 * int(encodec_rate / c["frame_rate"])
            self.downsample = MimiConv(c["hidden_size"], c["hidden_size"], k, stride=2, bias=False,
                                       pad_mode="replicate")
        self.quantizer = SplitResidualVQ(c)

    def __call__(self, wav: mx.array) -> mx.array:
        h = self.encoder(wav[..., None])
        h = self.encoder_transformer(h)
        if "downsample" in self:
            h = self.downsample(h)
        codes = self.quantizer.encode(h, self.valid)
        frames = -(-wav.shape[-1] // self.downsample_rate)
        return codes[:, :frames].astype(mx.int32)

    def sanitize(self, weights: Dict[str, mx.array]) -> Dict[str, mx.array]:
        """Drop the Mimi decoder half and bookkeeping buffers, transpose conv weights."""
        keep = ("encoder.encoder.", "encoder.encoder_transformer.", "encoder.downsample.", "encoder.quantizer.")
        out = {}
        for k, v in weights.items():
            if k.startswith("encoder."):
                if not k.startswith(keep) or k.endswith(".initialized") or "rotary_emb" in k:
                    continue
                if k.startswith("encoder.quantizer.acoustic_residual_vector_quantizer.layers."):
                    if int(k.split(".")[4]) >= len(self.quantizer.acoustic_residual_vector_quantizer.layers):
                        continue
            out[k] = v
        return torch_conv_to_mlx(self, out, "encoder.")
