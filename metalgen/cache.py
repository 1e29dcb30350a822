"""Per-layer caches: a KV cache for each attention layer, a conv state plus a recurrent state for
each Gated DeltaNet layer (Qwen3-Next, Qwen3.5). The generation loop owns them and passes them into
the model; `save_prompt_cache` / `load_prompt_cache` keep a filled one (a reused system prompt, the
previous turns of a chat) in a safetensors file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Sequence, Tuple, Union

import mlx.core as mx

from .errors import MetalgenError


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


class StaticKVCache:
    """Keys and values of one attention layer in a fixed buffer (B, kv_heads, capacity, head_dim),
    written at a position held as an array: a step over it has the same shapes at every position,
    so `mx.compile` traces it once. `update_and_fetch` returns the whole buffer; `key_mask`
    (1, 1, 1, capacity) marks the positions written so far, which attention must mask with."""

    def __init__(self, keys: mx.array, values: mx.array, offset: mx.array):
        self.keys, self.values = keys, values
        self.offset = offset  # () int32: the next position to write

    @classmethod
    def from_cache(cls, cache: KVCache, capacity: int) -> "StaticKVCache":
        """A KVCache's valid positions copied into a buffer of `capacity` positions."""
        if cache.offset > capacity:
            raise MetalgenError(f"a static cache of {capacity} positions cannot hold {cache.offset}")
        B, H, _, Dk = cache.keys.shape
        pad = [(0, 0), (0, 0), (0, capacity - cache.offset), (0, 0)]
        keys = mx.pad(cache.keys[..., : cache.offset, :], pad)
        values = mx.pad(cache.values[..., : cache.offset, :], pad)
        return cls(keys, values, mx.array(cache.offset, dtype=mx.int32))

    def update_and_fetch(self, k: mx.array, v: mx.array) -> Tuple[mx.array, mx.array]:
        """Write k, v (B, kv_heads, L, head_dim) at the offset; return the whole buffers."""
        start = self.offset.reshape(1)
        self.keys = mx.slice_update(self.keys, k.astype(self.keys.dtype), start, axes=(2,))
        self.values = mx.slice_update(self.values, v.astype(self.values.dtype), start, axes=(2,))
        self.offset = self.offset + k.shape[2]
        return self.keys, self.values

    @property
    def key_mask(self) -> mx.array:
        """(1, 1, 1, capacity) bool: true for the positions written so far."""
        return (mx.arange(self.keys.shape[2]) < self.offset)[None, None, None, :]

    @property
    def state(self) -> List[mx.array]:
        return [self.keys, self.values]


class LinearAttnCache:
    """The state of one Gated DeltaNet layer: the conv's last taps (B, kernel - 1, conv_dim) in the
    activations' dtype and the recurrent state (B, value_heads, key_head_dim, value_head_dim) in
    float32, both replaced (not grown) at every step; `offset` counts the tokens they have seen."""

    def __init__(self):
        self.conv_state: Optional[mx.array] = None
        self.recurrent: Optional[mx.array] = None
        self.offset = 0

    @property
    def state(self) -> List[mx.array]:
        """The arrays to evaluate to materialize this cache."""
        return [a for a in (self.conv_state, self.recurrent) if a is not None]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state)


def make_prompt_cache(model, max_size: Optional[int] = None, decode: Optional[str] = "auto") -> List:
    """One fresh cache per layer of `model`: the kind each layer needs (a model with other than
    attention layers says which through its `make_cache`).

    decode: "plain" gives per-layer KVCaches. "auto" (the default) or a stacked decode path's name
    gives a `metalgen.decode.StackedPromptCache` where that path runs for
    this model (on CUDA, every stack the megakernel takes but the hybrid ones), so that generation
    with this cache decodes on the fast path in place; per-layer caches elsewhere. `max_size` (a
    bounded cache) takes per-layer caches."""
    if decode not in (None, "plain", "compiled") and max_size is None:
        from .decode.prompt_cache import stacked_prompt_cache

        stacked = stacked_prompt_cache(model, decode)
        if stacked is not None:
            return stacked
    make = getattr(model, "make_cache", None)
    if make is not None:
        return make(max_size)
    return [KVCache(max_size) for _ in model.layers]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two id sequences (what a cache holding `a` can keep of `b`)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cache_length(cache) -> int:
    """The positions a prompt cache holds (every layer holds as many)."""
    return int(cache.offset) if hasattr(cache, "offset") else (int(cache[0].offset) if cache else 0)


def trim_prompt_cache(cache, n: int) -> int:
    """Forget the last `n` positions of a prompt cache, so that other tokens can follow the ones kept
    (a chat whose next rendering differs from what was fed). Returns the positions trimmed: `n`, or 0
    where a layer cannot go back (a Gated DeltaNet layer's state has no positions to cut)."""
    n = max(0, min(int(n), cache_length(cache)))
    if n == 0:
        return 0
    trim = getattr(cache, "trim", None)
    if trim is not None:  # a StackedPromptCache
        return trim(n)
    if any(not isinstance(c, KVCache) for c in cache):
        return 0
    for c in cache:
        c.offset -= n
    return n


def copy_prompt_cache(cache) -> Optional[List]:
    """A copy of per-layer caches (KVCache, LinearAttnCache) that later updates of either leave alone, or
    None for caches of other kinds. The copy holds the same arrays (MLX arrays are values), under new
    objects: a KVCache appends by slice assignment into its own array object, so the copy keeps a slice
    of the valid positions instead (its next append grows a new buffer); a Gated DeltaNet layer replaces
    its state arrays at every step, so they are shared as they are."""
    if not isinstance(cache, list):
        return None
    out = []
    for c in cache:
        if isinstance(c, KVCache):
            new = KVCache(c.max_size)
            if c.keys is not None and c.offset > 0:
                new.keys, new.values = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
            new.offset = c.offset
        elif isinstance(c, LinearAttnCache):
            new = LinearAttnCache()
            new.conv_state, new.recurrent, new.offset = c.conv_state, c.recurrent, c.offset
        else:
            return None
        out.append(new)
    return out


def can_trim_prompt_cache(cache) -> bool:
    """Whether `trim_prompt_cache` can take positions back from this cache (not where a layer is a Gated
    DeltaNet layer's state)."""
    return hasattr(cache, "trim") or all(isinstance(c, KVCache) for c in cache)


def save_prompt_cache(path: Union[str, Path], cache: List, metadata: Optional[dict] = None) -> None:
    """Write a filled per-layer cache to a safetensors file (each layer's kind, offset and arrays;
    `metadata`: the caller's strings, e.g. the model it belongs to)."""
    arrays, layers = {}, []
    for i, c in enumerate(cache):
        if isinstance(c, KVCache):
            layers.append({"kind": "kv", "offset": c.offset})
            if c.offset:
                arrays[f"{i}.keys"] = c.keys[..., : c.offset, :]
                arrays[f"{i}.values"] = c.values[..., : c.offset, :]
        elif isinstance(c, LinearAttnCache):
            layers.append({"kind": "linear", "offset": c.offset})
            if c.conv_state is not None:
                arrays[f"{i}.conv_state"] = c.conv_state
                arrays[f"{i}.recurrent"] = c.recurrent
        else:
            raise MetalgenError(f"cannot save a cache layer of type {type(c).__name__}")
    meta = {"metalgen.layers": json.dumps(layers), **{str(k): str(v) for k, v in (metadata or {}).items()}}
    mx.save_safetensors(str(path), arrays, metadata=meta)


def load_prompt_cache(path: Union[str, Path], return_metadata: bool = False):
    """The per-layer cache that `save_prompt_cache` wrote (and its metadata when asked)."""
    try:
        arrays, meta = mx.load(str(path), return_metadata=True)
        layers = json.loads(meta.pop("metalgen.layers"))
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise MetalgenError(f"{path}: not a metalgen prompt cache ({str(e).splitlines()[0] if str(e) else e})")
    cache = []
    for i, layer in enumerate(layers):
        if layer["kind"] == "kv":
            c = KVCache()
            if layer["offset"]:
                c.update(arrays[f"{i}.keys"], arrays[f"{i}.values"])
        else:
            c = LinearAttnCache()
            if f"{i}.conv_state" in arrays:
                c.conv_state, c.recurrent = arrays[f"{i}.conv_state"], arrays[f"{i}.recurrent"]
            c.offset = layer["offset"]
        cache.append(c)
    return (cache, meta) if return_metadata else cache
