"""The per-layer caches of prompts prefilled together (metalgen.batch), until they join the running batch's
paged cache (metalgen.paged_cache): an attention layer's KV (`BatchKVCache`), and a Gated DeltaNet layer's
states (`BatchLinearCache`, hybrid stacks).

Rows are left-padded so that every row's newest token sits in the same column: one chunk writes the same
columns for all rows, and the attention of every row reads the same key range, with its padding masked
out (`make_mask`) and RoPE turning each row at its own position (`positions`). A row cancelled mid-prefill
leaves its group (`filter`); a group may also start from columns a prefix cache already holds
(`prefilled`).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import mlx.core as mx

from .cache import LinearAttnCache
from .errors import MetalgenError


class BatchKVCache:
    """Keys and values of one attention layer for B rows: (B, kv_heads, capacity, head_dim).

    `offset` columns are in use, shared by every row; row b's tokens fill columns
    `padding[b]` .. `offset - 1` (its left padding is zeros that the mask hides). The padding is kept
    twice: as a host list (to trim what all rows share without a readback) and as the (B,) int32
    device array `left_padding` that masks and positions are computed from.
    """

    step = 256

    def __init__(self, keys: Optional[mx.array], values: Optional[mx.array], offset: int, padding: Sequence[int]):
        if keys is not None and keys.shape[0] != len(padding):
            raise MetalgenError(f"a batched KV cache of {keys.shape[0]} rows was given {len(padding)} paddings")
        self.keys, self.values = keys, values
        self.offset = int(offset)
        self._set_padding(padding)

    @classmethod
    def empty(cls, padding: Sequence[int]) -> "BatchKVCache":
        """No columns yet, for rows about to be prefilled together from a left-padded (B, T) token matrix:
        row b's first `padding[b]` tokens are padding. Its buffers are made by the first `update` (which
        knows the heads, head_dim and dtype); until then `positions` are -padding, so that each row's
        first real token turns at position 0."""
        return cls(None, None, 0, padding)

    @classmethod
    def prefilled(cls, keys: mx.array, values: mx.array, padding: Sequence[int]) -> "BatchKVCache":
        """Rows about to be prefilled together whose first columns are known already (a prefix cache's KV):
        keys, values (B, kv_heads, S, head_dim) are columns 0 .. S - 1, row b's first padding[b] of them
        zeros; a padding past S goes on in the columns yet to come (as `empty`'s does)."""
        S = keys.shape[2]
        return cls(*_with_room(keys, values, S, cls.step), S, padding)

    def _set_padding(self, padding: Sequence[int]) -> None:
        self.padding: List[int] = [int(p) for p in padding]
        self.left_padding = mx.array(self.padding, mx.int32)  # (B,)

    @property
    def size(self) -> int:
        """The number of rows."""
        return len(self.padding)

    @property
    def positions(self) -> mx.array:
        """(B,) int32: the position of each row's next token (its length so far): where RoPE turns the
        tokens this step appends."""
        return self.offset - self.left_padding

    def make_mask(self, length: int) -> mx.array:
        """The attention mask for `length` new tokens per row appended at `offset`: (B, 1, length,
        offset + length) bool, True where a query may look. It hides each row's left padding and, for
        more than one token, the keys after each query (causal). A query that is itself padding (rows
        prefilled together: `empty`) sees only its own key: a query that sees nothing gives NaN on some
        backends, and a NaN value in a hidden column would still poison the other rows (0 * NaN)."""
        cols = mx.arange(self.offset + length)  # (S,)
        queries = self.offset + mx.arange(length)  # (L,): the new tokens' columns
        # (B, L): where each query's keys start; a padding query's own column
        start = mx.minimum(self.left_padding[:, None], queries[None, :])
        mask = cols[None, None, :] >= start[:, :, None]  # (B, L, S)
        if length > 1:
            mask = mask & (cols[None, None, :] <= queries[None, :, None])  # causal
        return mask[:, None]  # (B, 1, L, S): broadcast over heads

    def update(self, k: mx.array, v: mx.array) -> None:
        """Append k, v: (B, kv_heads, L, head_dim), one column block for every row."""
        if self.keys is None:  # an `empty` cache's first chunk: it sets the heads, head_dim and dtype
            if k.shape[0] != self.size:
                raise MetalgenError(f"a batched KV cache of {self.size} rows was given {k.shape[0]} rows of keys")
            self.keys, self.values = _with_room(k, v, k.shape[2], self.step)
            self.offset = k.shape[2]
            return
        end = self.offset + k.shape[2]
        if end > self.keys.shape[2]:
            self.keys, self.values = _with_room(self.keys[..., : self.offset, :], self.values[..., : self.offset, :],
                                                 end, self.step)
        self.keys[..., self.offset : end, :] = k
        self.values[..., self.offset : end, :] = v
        self.offset = end

    def update_and_fetch(self, k: mx.array, v: mx.array):
        """Append k, v and return every row's keys and values so far (B, kv_heads, offset, head_dim)."""
        self.update(k, v)
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    def filter(self, keep: Sequence[int]) -> int:
        """Keep only the rows `keep` (indices, in the order given), and drop the left columns that are
        padding in every row kept. Returns how many columns were dropped: of rows still being prefilled
        only those already written go (the rest of their padding is yet to come, and stays in `padding`)."""
        idx, padding, shared = _filter_plan(keep, self.padding, self.offset, "KV cache")
        if idx is not None and self.keys is not None:
            self.keys, self.values = self.keys[idx], self.values[idx]
        if shared:
            self.keys = self.keys[..., shared:, :]
            self.values = self.values[..., shared:, :]
            self.offset -= shared
        self._set_padding([p - shared for p in padding])
        return shared

    @property
    def state(self) -> List[mx.array]:
        """The arrays to evaluate to materialize this cache."""
        if self.keys is None:
            return [self.left_padding]
        return [self.keys, self.values, self.left_padding]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class BatchLinearCache(LinearAttnCache):
    """The states of one Gated DeltaNet layer for B rows prefilled together: the conv's last taps
    (B, kernel - 1, conv_dim) and the recurrent state (B, value_heads, key_head_dim, value_head_dim) float32,
    as cache.LinearAttnCache holds them for one sequence.

    Rows are left-padded as the group's attention layers are (BatchKVCache; `padding` and `offset` have the
    same meaning), and a padding column must leave a row's states as a fresh sequence's: the layer zeroes
    its conv input there (`real_columns`). Zero inputs need nothing else: the conv's past is zeros anyway,
    the conv has no bias, and a zero key adds nothing to a state that is still zero, whatever the decay.
    """

    def __init__(self, padding: Sequence[int], offset: int = 0):
        super().__init__()
        self.offset = int(offset)  # columns fed so far (GatedDeltaNet advances it)
        self.padding: List[int] = [int(p) for p in padding]

    @classmethod
    def empty(cls, padding: Sequence[int]) -> "BatchLinearCache":
        """No column fed yet: states are made by the first chunk (zeros before it)."""
        return cls(padding)

    @property
    def size(self) -> int:
        """The number of rows."""
        return len(self.padding)

    def real_columns(self, length: int) -> Optional[mx.array]:
        """(B, length) bool: which of the next `length` columns are a row's tokens rather than its padding;
        None when every one is (the chunk lies past every row's padding)."""
        if max(self.padding) <= self.offset:
            return None
        cols = self.offset + mx.arange(length)  # (L,)
        return cols[None, :] >= mx.array(self.padding, mx.int32)[:, None]

    def filter(self, keep: Sequence[int]) -> int:
        """Keep only the rows `keep` (in the order given) and forget the left columns that are padding in
        every row kept, as BatchKVCache.filter does (the states hold no columns: only the count moves).
        Returns how many columns were dropped."""
        idx, padding, shared = _filter_plan(keep, self.padding, self.offset, "Gated DeltaNet cache")
        if idx is not None and self.recurrent is not None:
            self.conv_state, self.recurrent = self.conv_state[idx], self.recurrent[idx]
        self.offset -= shared
        self.padding = [p - shared for p in padding]
        return shared


def _filter_plan(keep: Sequence[int], padding: Sequence[int], offset: int, what: str):
    """What a group's cache keeps of its rows (`filter`): the rows' int32 indices (None where every row stays,
    in order), the kept rows' padding, and the left columns that are padding in every kept row and were fed
    (the ones to forget)."""
    keep = [int(i) for i in keep]
    if not keep:
        raise MetalgenError(f"a batched {what} must keep at least one row (drop the cache instead)")
    idx = None if keep == list(range(len(padding))) else mx.array(keep, mx.int32)
    kept = [padding[i] for i in keep]
    return idx, kept, min(min(kept), offset)


def empty_group_caches(model, padding: Sequence[int]) -> List:
    """Fresh per-layer caches for rows about to be prefilled together (left-padded by `padding`): a
    BatchLinearCache for each Gated DeltaNet layer of a hybrid stack, a BatchKVCache for the others."""
    hybrid = getattr(model.spec, "hybrid", None)
    return [BatchLinearCache.empty(padding) if hybrid is not None and hybrid.is_linear(i)
            else BatchKVCache.empty(padding) for i in range(len(model.layers))]


def _with_room(keys: mx.array, values: mx.array, used: int, step: int):
    """keys, values (B, H, used, D) copied into buffers with room past `used` (capacity rounded up to
    `step`, at least one free column, so that a one-column chunk does not reallocate)."""
    capacity = ((used + step) // step) * step
    pad = [(0, 0), (0, 0), (0, capacity - keys.shape[2]), (0, 0)]
    return mx.pad(keys, pad), mx.pad(values, pad)


def filter_caches(batch: List, keep: Sequence[int]) -> Optional[List[BatchKVCache]]:
    """Keep the rows `keep` of every layer's cache; None when no row is kept."""
    if not keep:
        return None
    for c in batch:
        c.filter(keep)
    return batch
