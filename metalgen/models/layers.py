"""Leaf layers whose arithmetic goes through `kernels_metal`, so each backend runs its variant.

Attributes keep the names of `mlx.nn`'s layers (`weight`, `bias`, `scales`, `biases`), which
are the names in Hugging Face and MLX-quantized checkpoints, so weights load strictly.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

import kernels_metal as K


class Linear(nn.Linear):
    """`y = x @ W.T + b` through the kernel library's GEMV/GEMM dispatch."""

    def __call__(self, x: mx.array) -> mx.array:
        return K.linear(x, self["weight"], self.get("bias"))

    def to_quantized(self, group_size: int = 64, bits: int = 4, mode: str = "affine", **_):
        if mode != "affine":
            raise ValueError(f"quantization mode '{mode}' is not supported (only affine)")
        return QuantizedLinear.from_linear(self, group_size, bits)


class QuantizedLinear(nn.QuantizedLinear):
    """An MLX affine-quantized linear layer (4 or 8 bits) through the kernel library."""

    def __call__(self, x: mx.array) -> mx.array:
        return K.quantized_linear(
            x,
            self["weight"],
            self["scales"],
            self.get("biases"),
            self.group_size,
            self.bits,
            bias=self.get("bias"),
        )


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale, computed in float32."""

    def __init__(self, dims: int, eps: float = 1e-6):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return K.rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, dims: int, hidden_dims: int):
        super().__init__()
        self.gate_proj = Linear(dims, hidden_dims, bias=False)
        self.up_proj = Linear(dims, hidden_dims, bias=False)
        self.down_proj = Linear(hidden_dims, dims, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))
