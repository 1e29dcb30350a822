"""Pieces every model file shares: the ModelArgs base and the attention-mask choice."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from ..errors import MetalgenError


@dataclasses.dataclass
class BaseModelArgs:
    """Base of every model's `ModelArgs`: fields carry Hugging Face config.json names."""

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]):
        """Build from a config dict, ignoring keys this architecture does not use."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        missing = [
            name
            for name, f in fields.items()
            if name not in params
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise MetalgenError(
                f"config.json lacks required field(s) {', '.join(missing)} for model_type "
                f"'{params.get('model_type', '?')}'"
            )
        return cls(**{k: v for k, v in params.items() if k in fields})


def causal_mask_for(length: int) -> Optional[str]:
    """The mask a block needs for `length` new tokens appended to a cache.

    A single query token sees the whole cache, so it needs none; longer inputs use the
    lower-right aligned causal mask that `mx.fast.scaled_dot_product_attention` knows by
    name, which is also right for a prompt chunk appended after earlier chunks.
    """
    return "causal" if length > 1 else None


def mask_for(length: int, cache) -> Optional[Any]:
    """The mask every block of a stack needs for `length` new tokens: the cache's own where it has one (a
    batched cache's rows are left-padded: metalgen.batch_cache.BatchKVCache.make_mask, an array), else
    `causal_mask_for`. `cache` is the stack's per-layer cache list, or None."""
    # the first layer with a mask of its own: a hybrid stack's Gated DeltaNet layers have none
    make = next((c.make_mask for c in cache or () if hasattr(c, "make_mask")), None)
    return causal_mask_for(length) if make is None else make(length)
