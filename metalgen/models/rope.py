"""RoPE configuration parsing: Hugging Face rope settings -> inverse frequencies.

Both config spellings are read: the older `rope_theta` + `rope_scaling` pair (Qwen2/Qwen2.5/
Qwen3 checkpoints on the hub) and the `rope_parameters` dict that newer transformers writes.
The tables themselves are built and applied by `kernels_metal`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Optional

import numpy as np

import kernels_metal as K

from ..errors import MetalgenError

SUPPORTED_ROPE_TYPES = ("default", "linear", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: Optional[int] = None
    attention_factor: Optional[float] = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    truncate: bool = True
    mrope_section: Optional[tuple] = None
    mrope_interleaved: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "RopeConfig":
        params = dict(config.get("rope_parameters") or {})
        scaling = config.get("rope_scaling") or {}
        params = {**scaling, **params}
        theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        if rope_type == "mrope":  # Qwen2-VL spelling: default frequencies, 3-axis positions
            rope_type = "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise MetalgenError(
                f"unsupported rope scaling type '{rope_type}' "
                f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )
        section = params.get("mrope_section")
        return cls(
            theta=float(theta),
            rope_type=rope_type,
            factor=float(params.get("factor") or 1.0),
            original_max_position_embeddings=params.get(
                "original_max_position_embeddings",
                config.get("original_max_position_embeddings"),
            ),
            attention_factor=params.get("attention_factor"),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
            mrope_section=tuple(section) if section else None,
            mrope_interleaved=bool(params.get("interleaved", params.get("mrope_interleaved", False))),
        )

    def inv_freq(self, dims: int, max_position_embeddings: int):
        """Return (inv_freq float64 (dims/2,), attention scale applied to cos/sin)."""
        exponents = np.arange(0, dims, 2, dtype=np.float64) / dims
        base_inv = 1.0 / (self.theta**exponents)
        if self.rope_type == "default":
            return base_inv, 1.0
        if self.rope_type == "linear":
            return base_inv / self.factor, 1.0
        return self._yarn(dims, base_inv, max_position_embeddings)

    def _yarn(self, dims: int, base_inv: np.ndarray, max_position_embeddings: int):
        factor = self.factor
        original = self.original_max_position_embeddings or max_position_embeddings

        def mscale_of(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.attention_factor is not None:
            attention = float(self.attention_factor)
        elif self.mscale and self.mscale_all_dim:
            attention = mscale_of(factor, self.mscale) / mscale_of(factor, self.mscale_all_dim)
        else:
            attention = mscale_of(factor)

        def correction_dim(rotations: float) -> float:
            return dims * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(self.theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dims - 1)
        if low == high:
            high += 0.001  # the reference nudges this to avoid dividing by zero
        ramp = np.clip((np.arange(dims // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        extrapolation = 1.0 - ramp
        inv = (base_inv / factor) * (1.0 - extrapolation) + base_inv * extrapolation
        return inv, attention


class RoPE:
    """Rotary embedding for one model: a cached cos/sin table shared by all its layers."""

    def __init__(self, config: RopeConfig, dims: int, max_position_embeddings: int):
        inv_freq, scale = config.inv_freq(dims, max_position_embeddings)
        self.dims = dims
        self.max_positions = max_position_embeddings
        self.table = K.rope_table(inv_freq, max_position_embeddings, attention_scale=scale)

    def __call__(self, x, offset: int = 0):
        # x: (B, H, L, D), positions offset .. offset + L - 1
        return K.rope(x, self.table, offset)
