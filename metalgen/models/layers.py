"""Leaf layers whose arithmetic goes through `kernels_metal`, so each backend runs its variant.

Attributes keep the names of `mlx.nn`'s layers (`weight`, `bias`, `scales`, `biases`), which
are the names in Hugging Face and MLX-quantized checkpoints, so weights load strictly.
"""

from __future__ import annotations

from typing import Optional, Sequence

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


def fuse_linears(parts: Sequence[nn.Module]) -> Optional[nn.Module]:
    """One layer whose output is `parts`' outputs side by side (their rows concatenated), or None
    where the parts differ in kind, quantization or bias. MLX's affine quantization groups along
    the input axis, so quantized rows concatenate like float ones (weight, scales and biases alike).
    On CUDA each MLX operation costs ~10 us at decode whatever its size, so the small projections
    of one input are worth one matmul."""
    first = parts[0]
    has_bias = "bias" in first
    if any(type(p) is not type(first) or ("bias" in p) != has_bias for p in parts):
        return None
    quantized = isinstance(first, QuantizedLinear)
    if not quantized and not isinstance(first, Linear):
        return None
    if quantized and any((p.group_size, p.bits, p.mode) != (first.group_size, first.bits, first.mode)
                         or "biases" not in p for p in parts):
        return None
    keys = ("weight", "scales", "biases") if quantized else ("weight",)
    keys += ("bias",) if has_bias else ()
    return linear_like(first, {key: mx.concatenate([p[key] for p in parts], axis=0) for key in keys})


def linear_like(like: nn.Module, params: dict) -> nn.Module:
    """A Linear, or a QuantizedLinear quantized as `like` is, holding the arrays `params` (weight, and
    scales and biases if quantized; bias if any), e.g. views of stacked weights."""
    has_bias = "bias" in params
    if isinstance(like, QuantizedLinear):
        # built at the smallest size, then given the real arrays (no random weights quantized)
        layer = QuantizedLinear(like.group_size, 1, bias=has_bias, group_size=like.group_size, bits=like.bits,
                                mode=like.mode)
    else:
        layer = Linear(1, 1, bias=has_bias)
    for key, value in params.items():
        layer[key] = value
    return layer


def fuse_parts(module: nn.Module, fused_name: str, names: Sequence[str]) -> None:
    """Replace `module`'s linear layers `names` (one input, outputs side by side) by one layer
    `fused_name` (fuse_linears); unchanged where they cannot be fused."""
    fused = fuse_linears([module[n] for n in names])
    if fused is not None:
        setattr(module, fused_name, fused)
        for n in names:
            del module[n]


def unfuse_parts(flat: dict, prefix: str, fused_name: str, names: Sequence[str], sizes: Sequence[int]) -> None:
    """In a flat parameter dict, `prefix + fused_name` split back into `names` of `sizes` output rows
    each (the inverse of fuse_parts, as views); absent entries are left alone."""
    for leaf in ("weight", "scales", "biases", "bias"):
        key = f"{prefix}{fused_name}.{leaf}"
        if key in flat:
            rows = flat.pop(key)  # (sum(sizes), ...): output rows first for every leaf
            for n, piece in zip(names, mx.split(rows, _cuts(sizes), axis=0)):
                flat[f"{prefix}{n}.{leaf}"] = piece


def _cuts(sizes: Sequence[int]) -> list:
    cuts, total = [], 0
    for n in sizes[:-1]:
        total += n
        cuts.append(total)
    return cuts


def split_last(y: mx.array, sizes: Sequence[int]):
    """y (..., sum(sizes)) -> the consecutive pieces of those sizes along the last axis."""
    return mx.split(y, _cuts(sizes), axis=-1)


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
        if "gate_up_proj" in self:  # fused after loading (fuse_projections)
            gate, up = mx.split(self.gate_up_proj(x), 2, axis=-1)  # two halves of hidden_dims
            return self.down_proj(nn.silu(gate) * up)
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))

    def fusions(self):
        """(fused name, the checkpoint's names, their output sizes) of fuse_projections."""
        hidden = self.gate_up_proj.weight.shape[0] // 2 if "gate_up_proj" in self else self.gate_proj.weight.shape[0]
        return [("gate_up_proj", ("gate_proj", "up_proj"), (hidden, hidden))]

    def fuse_projections(self) -> None:
        """gate_proj and up_proj as one `gate_up_proj` (same input); the checkpoint's names are gone
        from this module afterwards. Unchanged where the two cannot be fused."""
        for fused, names, _ in self.fusions():
            fuse_parts(self, fused, names)
