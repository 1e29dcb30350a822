"""Gated DeltaNet linear attention, the token mixer of three in four layers of Qwen3-Next and Qwen3.5.

Per token, the layer projects the hidden state to queries and keys (`linear_num_key_heads` heads of
`linear_key_head_dim`), values and an output gate z (`linear_num_value_heads` heads of
`linear_value_head_dim`), and two per-value-head scalars: b (the write strength, beta = sigmoid(b))
and a (the decay, g = -exp(A_log) * softplus(a + dt_bias), a log factor <= 0). q, k and v pass through
a short causal depthwise convolution (`linear_conv_kernel_dim` taps, SiLU) whose last taps are the
layer's conv state; then the gated delta rule (kernels_metal.gated_delta) updates a fixed-size
recurrent state per value head and reads it with q. The result goes through an RMSNorm gated by
SiLU(z) and the output projection.

Qwen3-Next packs the projections per key head (`in_proj_qkvz`: for each key head its q, k, and the
values and gates of the value heads it serves; `in_proj_ba` likewise), Qwen3.5 keeps them apart
(`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`). The conv weight is kept in MLX's layout
(channels, taps, 1), as MLX conversions store it; Hugging Face's (channels, 1, taps) is moved at load.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import mlx.core as mx
import mlx.nn as nn

import kernels_metal as K

from ..errors import MetalgenError
from .layers import Linear, fuse_parts, split_last

LAYOUTS = ("qkvz", "split")  # Qwen3-Next's per-key-head packing, Qwen3.5's separate projections


@dataclasses.dataclass(frozen=True)
class LinearAttnSpec:
    """The shape of a stack's Gated DeltaNet layers."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    layout: str  # one of LAYOUTS

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def check(self) -> None:
        """One line on a head layout the layer cannot take."""
        hk, hv = self.num_key_heads, self.num_value_heads
        if min(hk, hv, self.key_head_dim, self.value_head_dim) < 1 or hv % hk:
            raise MetalgenError(
                f"config.json: linear_num_value_heads {hv} must be a positive multiple of "
                f"linear_num_key_heads {hk} (each key head serves a whole group of value heads)")
        if self.conv_kernel < 1:
            raise MetalgenError(f"config.json: linear_conv_kernel_dim must be >= 1, got {self.conv_kernel}")
        if self.layout not in LAYOUTS:  # pragma: no cover - set by the model files
            raise ValueError(self.layout)


class GatedRMSNorm(nn.Module):
    """RMSNorm of each value head's output (a plain scale, not 1 + weight), times SiLU(gate) in float32."""

    def __init__(self, dims: int, eps: float):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def __call__(self, x: mx.array, gate: mx.array) -> mx.array:
        y = K.rms_norm(x, self.weight, self.eps)
        return (y.astype(mx.float32) * nn.silu(gate.astype(mx.float32))).astype(x.dtype)


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet layer; `cache` is a cache.LinearAttnCache (conv and recurrent state), or its
    batched forms (metalgen.batch_cache.BatchLinearCache, metalgen.paged_cache.LinearRowStates)."""

    def __init__(self, hidden_size: int, spec: LinearAttnSpec, eps: float):
        super().__init__()
        self.spec = spec
        s = spec
        if s.layout == "qkvz":
            self.in_proj_qkvz = Linear(hidden_size, 2 * s.key_dim + 2 * s.value_dim, bias=False)
            self.in_proj_ba = Linear(hidden_size, 2 * s.num_value_heads, bias=False)
        else:
            self.in_proj_qkv = Linear(hidden_size, s.conv_dim, bias=False)
            self.in_proj_z = Linear(hidden_size, s.value_dim, bias=False)
            self.in_proj_b = Linear(hidden_size, s.num_value_heads, bias=False)
            self.in_proj_a = Linear(hidden_size, s.num_value_heads, bias=False)
        # depthwise: one filter of conv_kernel taps per channel, MLX layout (channels, taps, 1)
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.conv_kernel, groups=s.conv_dim, bias=False)
        self.dt_bias = mx.ones((s.num_value_heads,))
        self.A_log = mx.zeros((s.num_value_heads,))
        self.norm = GatedRMSNorm(s.value_head_dim, eps)
        self.out_proj = Linear(s.value_dim, hidden_size, bias=False)

    def _input_names(self) -> Tuple[str, ...]:
        """The checkpoint's input projections, in the order fuse_projections concatenates them."""
        if self.spec.layout == "split":
            return ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        return ("in_proj_qkvz", "in_proj_ba")

    def _input_sizes(self) -> Tuple[int, ...]:
        s = self.spec
        if s.layout == "split":
            return (s.conv_dim, s.value_dim, s.num_value_heads, s.num_value_heads)
        return (2 * s.key_dim + 2 * s.value_dim, 2 * s.num_value_heads)

    def fusions(self):
        """(fused name, the checkpoint's names, their output sizes) of fuse_projections."""
        return [("in_proj", self._input_names(), self._input_sizes())]

    def fuse_projections(self) -> None:
        """The input projections (all read the same x) as one `in_proj`, one matmul instead of two
        or four; unchanged where they cannot be fused (layers.fuse_linears)."""
        fuse_parts(self, "in_proj", self._input_names())

    def project(self, x: mx.array) -> Tuple[mx.array, mx.array, mx.array, mx.array]:
        """x (B, L, hidden) -> (mixed q|k|v (B, L, conv_dim), z (B, L, Hv, Dv), b (B, L, Hv), a (B, L, Hv))."""
        s = self.spec
        B, L, _ = x.shape
        if "in_proj" in self:
            outs = split_last(self.in_proj(x), self._input_sizes())
        else:
            outs = [self[n](x) for n in self._input_names()]
        if s.layout == "split":
            qkv, z, b, a = outs
            return qkv, z.reshape(B, L, s.num_value_heads, s.value_head_dim), b, a
        hk, r, dk, dv = s.num_key_heads, s.num_value_heads // s.num_key_heads, s.key_head_dim, s.value_head_dim
        # (B, L, Hk, [q Dk | k Dk | v r*Dv | z r*Dv]) per key head
        qkvz = outs[0].reshape(B, L, hk, 2 * dk + 2 * r * dv)
        q = qkvz[..., :dk].reshape(B, L, s.key_dim)
        k = qkvz[..., dk:2 * dk].reshape(B, L, s.key_dim)
        v = qkvz[..., 2 * dk:2 * dk + r * dv].reshape(B, L, s.value_dim)
        z = qkvz[..., 2 * dk + r * dv:].reshape(B, L, s.num_value_heads, dv)
        # (B, L, Hk, [b r | a r]) per key head -> (B, L, Hv) each
        ba = outs[1].reshape(B, L, hk, 2 * r)
        b = ba[..., :r].reshape(B, L, s.num_value_heads)
        a = ba[..., r:].reshape(B, L, s.num_value_heads)
        return mx.concatenate([q, k, v], axis=-1), z, b, a

    def _conv(self, mixed: mx.array, cache) -> mx.array:
        """The causal depthwise conv over the cached taps and the new tokens, then SiLU."""
        taps = self.spec.conv_kernel - 1
        B = mixed.shape[0]
        if cache is not None and cache.conv_state is not None:
            past = cache.conv_state.astype(mixed.dtype)
        else:  # no history: zeros, as the reference's left padding
            past = mx.zeros((B, taps, mixed.shape[-1]), mixed.dtype)
        window = mx.concatenate([past, mixed], axis=1)  # (B, taps + L, conv_dim)
        if cache is not None:
            cache.conv_state = window[:, window.shape[1] - taps:, :] if taps else window[:, :0, :]
        out = mx.conv1d(window, self.conv1d.weight.astype(mixed.dtype), groups=mixed.shape[-1])
        return nn.silu(out)

    def step(self, mixed: mx.array, b: mx.array, a: mx.array, cache) -> mx.array:
        """One token with a cache: the conv, its state, the gates and the delta rule in one call
        (one kernel on a GPU); the first token of a fresh cache starts from zero states."""
        s = self.spec
        B = mixed.shape[0]
        conv_state = cache.conv_state
        if conv_state is None:
            conv_state = mx.zeros((B, s.conv_kernel - 1, s.conv_dim), mixed.dtype)
        state = cache.recurrent
        if state is None:
            state = mx.zeros((B, s.num_value_heads, s.key_head_dim, s.value_head_dim), mx.float32)
        o, cache.conv_state, cache.recurrent = K.gated_delta_conv_step(
            mixed, conv_state, self.conv1d.weight, a, b, self.A_log, self.dt_bias, state)
        cache.offset += 1
        return o  # (B, 1, Hv, Dv)

    def output(self, o: mx.array, z: mx.array) -> mx.array:
        """The delta rule's output o (B, L, Hv, Dv), normed and gated by z, through out_proj -> (B, L, hidden)."""
        B, L = o.shape[:2]
        return self.out_proj(self.norm(o, z).reshape(B, L, self.spec.value_dim))

    def __call__(self, x: mx.array, mask=None, cache=None) -> mx.array:
        s = self.spec
        B, L, _ = x.shape
        mixed, z, b, a = self.project(x)
        real = cache.real_columns(L) if hasattr(cache, "real_columns") else None
        if real is not None:
            # rows prefilled together (metalgen.batch_cache.BatchLinearCache): zeros at a row's left padding
            # leave its states as a fresh sequence's
            mixed = mixed * real[..., None].astype(mixed.dtype)
        if L == 1 and cache is not None and s.conv_kernel > 1:
            return self.output(self.step(mixed, b, a, cache), z)
        mixed = self._conv(mixed, cache)
        q = mixed[..., :s.key_dim].reshape(B, L, s.num_key_heads, s.key_head_dim)
        k = mixed[..., s.key_dim:2 * s.key_dim].reshape(B, L, s.num_key_heads, s.key_head_dim)
        v = mixed[..., 2 * s.key_dim:].reshape(B, L, s.num_value_heads, s.value_head_dim)
        beta = mx.sigmoid(b.astype(mx.float32))
        g = -mx.exp(self.A_log.astype(mx.float32)) * nn.softplus(a.astype(mx.float32)
                                                                  + self.dt_bias.astype(mx.float32))
        o, state = K.gated_delta(q, k, v, g, beta, cache.recurrent if cache is not None else None)
        # o: (B, L, Hv, Dv)
        if cache is not None:
            cache.recurrent = state
            cache.offset += L
        return self.output(o, z)
