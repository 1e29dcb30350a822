"""Per-layer KV caches. The generation loop owns them and passes them into the model."""

from __future__ import annotations

from typing import List, Optional, Tuple

import mlx.core as mx


class KVCache:
    """Keys and values of one attention layer, in a buffer grown `step` positions at a time.

    Buffers are (B, kv_heads, capacity, head_dim); `offset` positions are valid. Growing in
    steps keeps decode from reallocating every token, and a fixed buffer lets the decode
    attention kernel read the cache in place given only its valid length.
    """

    step = 256

    def __init__(self, max_size: Optional[int] = None):
        self.keys: Optional[mx.array] = None
        self.values: Optional[mx.array] = None
        self.offset = 0
        self.max_size = max_size

    def _grow(self, k: mx.array, v: mx.array, needed: int) -> None:
        B, H, _, Dk = k.shape
        Dv = v.shape[3]
        capacity = ((needed + self.step - 1) // self.step) * self.step
        if self.max_size is not None:
            capacity = max(needed, min(capacity, self.max_size))
        new_k = mx.zeros((B, H, capacity, Dk), k.dtype)
        new_v = mx.zeros((B, H, capacity, Dv), v.dtype)
        if self.keys is not None and self.offset > 0:
            new_k[..., : self.offset, :] = self.keys[..., : self.offset, :]
            new_v[..., : self.offset, :] = self.values[..., : self.offset, :]
        self.keys, self.values = new_k, new_v

    def update(self, k: mx.array, v: mx.array) -> None:
        """Append k, v: (B, kv_heads, L, head_dim) at the current offset."""
        end = self.offset + k.shape[2]
        if self.keys is None or end > self.keys.shape[2]:
            self._grow(k, v, end)
        self.keys[..., self.offset : end, :] = k
        self.values[..., self.offset : end, :] = v
        self.offset = end

    def update_and_fetch(self, k: mx.array, v: mx.array) -> Tuple[mx.array, mx.array]:
        """Append k, v and return all valid keys and values."""
        self.update(k, v)
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @property
    def state(self) -> List[mx.array]:
        """The arrays to evaluate to materialize this cache."""
        return [] if self.keys is None else [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state)


def make_prompt_cache(model, max_size: Optional[int] = None) -> List[KVCache]:
    """One fresh KVCache per layer of `model`."""
    return [KVCache(max_size) for _ in model.layers]
