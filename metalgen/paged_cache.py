"""The running batch's KV cache, paged: every layer keeps one pool of fixed-size blocks, and each row of
the batch holds a list of blocks of its own, as many as its length needs (metalgen.batch).

Why pages rather than one (B, kv_heads, capacity, head_dim) buffer a layer (metalgen.batch_cache, which
prompts prefilled together still use until they join): with a shared buffer every row is as long as the
longest one (left padding) and attention reads that padding; a row that joins or leaves moves the whole
batch's KV (a concatenation, a gather of the kept rows). Here a row's memory follows its own length to
the block, a decode step writes one slot a row, attention reads each row's own blocks through its block
table (kernels_metal.paged_decode_attention: no mask, no padding), a joining row's KV is copied once
into its blocks, and a leaving row's blocks go back to the free list with no device work at all.

A hybrid stack's Gated DeltaNet layers hold no positions: each keeps its rows' conv and recurrent states
as (B, ...) arrays (`LinearRowStates`), which a joining row's states are appended to and a leaving row's
taken out of.

The bookkeeping (which blocks each row holds, each row's length) is the host's, so that the per-step
arrays (block table, lengths, the slots written) need no readback. The pool grows when the free list
runs out (doubling, a copy of the pool), and is dropped with the batch when the batch empties.
"""

from __future__ import annotations

import functools
from typing import Callable, List, Optional, Sequence, Tuple

import mlx.core as mx
import numpy as np

import kernels_metal as K

from .batch_cache import BatchLinearCache
from .cache import LinearAttnCache
from .errors import MetalgenError

BLOCK_SIZE = 32  # positions a block; one of kernels_metal.PAGED_BLOCK_SIZES


class PagedKVCache:
    """One attention layer's pool: keys and values (slots, kv_heads, head_dim), blocks of
    `table.block_size` consecutive slots, which the rows of `table` hold. Decode only: one new token a
    row (`attend`); prompts are prefilled elsewhere and copied in (PagedBatchCache.join)."""

    def __init__(self, table: "PagedBatchCache"):
        self.table = table
        self.keys: Optional[mx.array] = None
        self.values: Optional[mx.array] = None

    @property
    def positions(self) -> mx.array:
        """(B,) int32: each row's length before this step, where RoPE turns its new token."""
        return self.table.positions

    def attend(self, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
        """Write the step's k, v (B, kv_heads, 1, head_dim) into each row's next slot and return the
        attention of q (B, heads, 1, head_dim) over each row's positions, the new one included."""
        if q.shape[2] != 1:
            raise MetalgenError("a paged KV cache takes one token a row (prompts are prefilled elsewhere)")
        t = self.table
        slots = t.slots  # (B,)
        # (B, kv_heads, 1, D) -> (B, kv_heads, D): one slot a row
        self.keys[slots] = k[:, :, 0, :].astype(self.keys.dtype)
        self.values[slots] = v[:, :, 0, :].astype(self.values.dtype)
        return self._rows_attention(q, scale)

    def attend_projected(self, q: mx.array, k: Optional[mx.array], v: Optional[mx.array], q_norm, k_norm,
                         eps: float, table, scale: float) -> mx.array:
        """`attend` from the step's q/k/v projections (B, 1, heads * D) straight out of the layers (k and v
        None: q is the one projection of all three, (B, 1, (Hq + 2 Hkv) * D)): q and k normed (q_norm, k_norm:
        the per-head norm weights (D,), or None), turned by RoPE (`table`) at each row's position and k, v
        written into the pools in one launch (kernels_metal.qk_rope_store), then the rows' attention.
        -> (B, heads, 1, D)"""
        t = self.table
        q, self.keys, self.values = K.qk_rope_store(q, k, v, q_norm, k_norm, eps, table, t.positions, t.slots,
                                                    self.keys, self.values)
        return self._rows_attention(q, scale)

    def _rows_attention(self, q: mx.array, scale: float) -> mx.array:
        """q (B, heads, 1, D) over each row's positions so far, this step's included."""
        t = self.table
        return K.paged_decode_attention(q, self.keys, self.values, t.block_table, t.kv_lengths, t.max_length,
                                        t.block_size, scale)

    def _grow(self, slots: int, heads: int, head_dim: int, dtype) -> None:
        """Room for `slots` slots in all, the pool's contents kept."""
        if self.keys is None:
            shape = (slots, heads, head_dim)
            self.keys, self.values = mx.zeros(shape, dtype), mx.zeros(shape, dtype)
            return
        extra = slots - self.keys.shape[0]
        if extra > 0:
            pad = [(0, extra), (0, 0), (0, 0)]
            self.keys, self.values = mx.pad(self.keys, pad), mx.pad(self.values, pad)

    @property
    def state(self) -> List[mx.array]:
        """The arrays to evaluate to materialize this cache."""
        return [] if self.keys is None else [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class LinearRowStates(LinearAttnCache):
    """One Gated DeltaNet layer's states for the running batch, a row each: the conv's last taps
    (B, kernel - 1, conv_dim) and the recurrent state (B, value_heads, key_head_dim, value_head_dim), which
    the layer's decode step replaces (models/gated_delta.py). Rows join with the states their prefill
    left (`join`) and leave by a gather of the others (`keep`): a few MB a layer, against a whole sequence's
    KV for an attention layer. A step padded to more rows (PagedBatchCache.begin_step) runs on arrays of
    that many rows (`pad`): the first `rows` are the batch's, the others padding, dropped when rows join
    or leave."""

    def __init__(self):
        super().__init__()
        self.rows = 0  # the batch's rows, the first of the arrays' rows

    def join(self, group: BatchLinearCache, at: mx.array) -> None:
        """Append rows `at` (int32 indices, a row possibly twice) of a prefilled group's states."""
        conv, rec = group.conv_state[at], group.recurrent[at]
        if self.recurrent is None:
            self.conv_state, self.recurrent = conv, rec
        else:
            self._drop_padding()
            self.conv_state = mx.concatenate([self.conv_state, conv.astype(self.conv_state.dtype)])
            self.recurrent = mx.concatenate([self.recurrent, rec])
        self.rows += int(at.shape[0])

    def keep(self, keep: mx.array) -> None:
        """Keep only the rows `keep` (int32 indices, in that order)."""
        self.conv_state, self.recurrent = self.conv_state[keep], self.recurrent[keep]
        self.rows = int(keep.shape[0])

    def pad(self, rows: int) -> None:
        """Arrays of `rows` rows for a padded step (zeros past the batch's, or what the last padded step left)."""
        extra = rows - self.recurrent.shape[0]
        if extra > 0:
            self.conv_state = mx.pad(self.conv_state, [(0, extra)] + [(0, 0)] * (self.conv_state.ndim - 1))
            self.recurrent = mx.pad(self.recurrent, [(0, extra)] + [(0, 0)] * (self.recurrent.ndim - 1))

    def _drop_padding(self) -> None:
        if self.recurrent.shape[0] > self.rows:
            self.conv_state, self.recurrent = self.conv_state[: self.rows], self.recurrent[: self.rows]


class PagedBatchCache:
    """The running batch's KV, every layer's pool (`layers`, what the model is given as its cache) and the
    rows' blocks. Rows are in the batch's order; `join` appends rows, `keep` drops rows, `begin_step`
    makes the arrays of the decode step about to be enqueued (and gives each row a block where its next
    position starts one). `linear`: the layers that are Gated DeltaNet (a hybrid stack's), which keep their
    rows' states (LinearRowStates) instead of a pool."""

    def __init__(self, num_layers: int, block_size: int = BLOCK_SIZE, linear: Sequence[int] = ()):
        if block_size not in K.PAGED_BLOCK_SIZES:
            raise MetalgenError(f"a paged KV cache's block size must be one of {K.PAGED_BLOCK_SIZES}, "
                                f"got {block_size}")
        self.block_size = block_size
        linear = set(linear)
        self.layers = [LinearRowStates() if i in linear else PagedKVCache(self) for i in range(num_layers)]
        self.pools = [c for c in self.layers if isinstance(c, PagedKVCache)]  # the attention layers'
        self.states = [c for c in self.layers if isinstance(c, LinearRowStates)]
        self.blocks: List[List[int]] = []  # per row, its blocks in position order
        self.lengths: List[int] = []  # per row, the positions written (or about to be, once begin_step ran)
        self.capacity = 0  # blocks in each pool
        self._shape = None  # (kv_heads, head_dim, dtype) of the pools, from the first rows joined
        self._free: List[int] = []  # blocks no row holds (a stack: the last freed is reused first)
        self._spare: Optional[int] = None  # the block that padding rows write into (begin_step), once needed
        # the rows' block tables on the host (B, width >= their blocks), kept between steps so that a step
        # adds only the blocks it takes (a 32k-token row holds 1024); None: re-laid at the next step
        self._table: Optional[np.ndarray] = None
        # the step's device arrays (begin_step)
        self.positions = self.kv_lengths = self.slots = self.block_table = None
        self.max_length = 0

    @classmethod
    def for_model(cls, model, block_size: int = BLOCK_SIZE) -> "PagedBatchCache":
        """An empty cache for the batch of `model`, its Gated DeltaNet layers (a hybrid stack's) told apart."""
        hybrid = getattr(model.spec, "hybrid", None)
        n = len(model.layers)
        return cls(n, block_size, [i for i in range(n) if hybrid.is_linear(i)] if hybrid is not None else ())

    @property
    def size(self) -> int:
        """The number of rows."""
        return len(self.lengths)

    @property
    def blocks_held(self) -> int:
        return self.capacity - len(self._free)

    def _take(self, n: int) -> List[int]:
        """n free blocks, the pools grown (doubling) when the free list is short."""
        if len(self._free) < n:
            grown = max(self.capacity * 2, self.capacity + n - len(self._free), 16)
            for layer in self.pools:
                layer._grow(grown * self.block_size, *self._shape)
            # new blocks go under the old free ones: lower ids first, so that pools stay dense
            self._free = list(range(grown - 1, self.capacity - 1, -1)) + self._free
            self.capacity = grown
        return [self._free.pop() for _ in range(n)]

    def join(self, group: Sequence, at: Sequence[int]) -> None:
        """Append rows whose prompts were prefilled together in `group` (per-layer left-padded caches:
        BatchKVCache, and BatchLinearCache for Gated DeltaNet layers): new row i is row at[i] of the group (a
        row may be named twice: a request's `n` choices each get a copy). Each new row's KV, without its
        padding, is copied into blocks of its own; its Gated DeltaNet states are appended to the rows'."""
        if self.states:
            rows = mx.array(list(at), mx.int32)
            for layer, c in zip(self.layers, group):
                if isinstance(layer, LinearRowStates):
                    layer.join(c, rows)
        first = next(c for layer, c in zip(self.layers, group) if isinstance(layer, PagedKVCache))
        if self._shape is None:
            self._shape = (first.keys.shape[1], first.keys.shape[3], first.keys.dtype)
        lengths = [first.offset - first.padding[g] for g in at]
        bs = self.block_size
        new_blocks = [self._take(-(-n // bs)) for n in lengths]
        # the copy, one gather and one scatter a layer: source rows of the group's (G, Hkv, S, Hd) buffers
        # flattened to (G * S, Hkv, Hd), destination slots of the pool
        S = first.keys.shape[2]
        src, dst = [], []
        for g, n, blocks in zip(at, lengths, new_blocks):
            src.append(np.arange(n, dtype=np.int32) + g * S + first.padding[g])
            dst.append(_slots(blocks, np.arange(n, dtype=np.int32), bs))
        src_idx, dst_idx = mx.array(np.concatenate(src)), mx.array(np.concatenate(dst))
        for layer, c in zip(self.layers, group):
            if not isinstance(layer, PagedKVCache):
                continue
            G, H, _, D = c.keys.shape
            # (G, H, S, D) -> (G, S, H, D) -> (G * S, H, D)
            layer.keys[dst_idx] = mx.swapaxes(c.keys, 1, 2).reshape(G * S, H, D)[src_idx]
            layer.values[dst_idx] = mx.swapaxes(c.values, 1, 2).reshape(G * S, H, D)[src_idx]
        self.blocks += new_blocks
        self.lengths += lengths
        self._table = None  # re-laid at the next step

    def keep(self, keep: Sequence[int]) -> None:
        """Keep only the rows `keep` (indices, in the order given); the others' blocks are free at once."""
        keep = [int(i) for i in keep]
        kept = set(keep)
        for i, blocks in enumerate(self.blocks):
            if i not in kept:
                self._free.extend(reversed(blocks))
        self.blocks = [self.blocks[i] for i in keep]
        self.lengths = [self.lengths[i] for i in keep]
        self._table = None
        if self.states and keep:  # (no row left: the batch drops the cache)
            rows = mx.array(keep, mx.int32)
            for layer in self.states:
                layer.keep(rows)

    def begin_step(self, rows: Optional[int] = None) -> None:
        """Make the device arrays of the decode step about to be enqueued, which writes each row's next
        position: a row whose next position starts a block gets one first. Advances the lengths.

        rows: the step's arrays padded to this many rows (at least the batch's), for a step traced for a few
        batch sizes only (metalgen.batch_step). A padding row is at position 0, writes into a block that no
        row holds (the same slot for all of them) and attends to that slot alone, and has states of its own
        in each Gated DeltaNet layer (LinearRowStates.pad); the rows' own are as without padding."""
        bs = self.block_size
        if self._table is None or self._table.shape[0] != len(self.blocks):
            self._table = _table_of(self.blocks)
        for b, n in enumerate(self.lengths):
            if n == len(self.blocks[b]) * bs:
                self.blocks[b] += self._take(1)
                j = len(self.blocks[b]) - 1
                if j >= self._table.shape[1]:  # wider by doubling: a long context is not re-laid every block
                    self._table = np.pad(self._table, ((0, 0), (0, self._table.shape[1])))
                self._table[b, j] = self.blocks[b][j]
        lengths = np.asarray(self.lengths, np.int32)
        width = max(len(blocks) for blocks in self.blocks)
        table = self._table[:, :width]  # past a row's blocks: never read
        # each row's slot from the host table, not its block list (a list per row would cost its length)
        slots = table[np.arange(len(lengths)), lengths // bs] * bs + lengths % bs
        pad = (rows or len(lengths)) - len(lengths)
        if pad > 0:
            if self._spare is None:
                self._spare = self._take(1)[0]  # held for the cache's life: never a row's
            lengths = np.concatenate([lengths, np.zeros(pad, np.int32)])
            slots = np.concatenate([slots, np.full(pad, self._spare * bs, slots.dtype)])
            table = np.concatenate([table, np.full((pad, width), self._spare, np.int32)])
        for layer in self.states:
            layer.pad(len(lengths))
        self.positions = mx.array(lengths)
        self.kv_lengths = mx.array(lengths + 1)
        self.slots = mx.array(slots.astype(np.int32))
        self.block_table = mx.array(np.ascontiguousarray(table))
        self.max_length = int(lengths.max()) + 1
        self.lengths = [n + 1 for n in self.lengths]

    def row_slicer(self, b: int) -> Callable[[int, int], Tuple[mx.array, mx.array]]:
        """For the prefix cache: (begin, end) -> row b's keys and values of positions begin .. end - 1, each
        (layers, kv_heads, end - begin, head_dim) over the attention layers, a copy of their own."""
        return self.row_slicers([b])[0]

    def row_slicers(self, rows: Sequence[int]) -> List[Callable[[int, int], Tuple[mx.array, mx.array]]]:
        """`row_slicer` of each of `rows` (rows leaving together), sharing one copy of all their positions,
        made when a slicer is first asked: one gather a layer and one stack over the layers, for keys and for
        values, then one copy a row of what it is asked, rather than the gathers and the stack for each row
        (a launch costs the host ~10 us: 8 rows of a 28-layer model leaving in one step took 10-12 ms so)."""
        rows = list(rows)
        lengths = [self.lengths[b] for b in rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        bs = self.block_size

        @functools.cache  # made once, when a slicer is first asked
        def stacked() -> Tuple[mx.array, mx.array]:
            idx = mx.array(np.concatenate([_slots(self.blocks[b], np.arange(n, dtype=np.int32), bs)
                                           for b, n in zip(rows, lengths)]))
            # each layer's (N, Hkv, D) at the rows' slots, stacked: (layers, N, Hkv, D), the rows one after the
            # other
            keys = mx.stack([c.keys[idx] for c in self.pools])
            values = mx.stack([c.values[idx] for c in self.pools])
            # the rows' blocks are free once they leave, and the next step may write into them in place
            # (qk_rope_store), with no data edge from this copy: the pools from now on come after it
            for c in self.pools:
                c.keys, c.values = mx.depends([c.keys, c.values], [keys, values])
            return keys, values

        def slicer_of(i: int):
            b, n, at = rows[i], lengths[i], offsets[i]

            def slicer(begin: int, end: int) -> Tuple[mx.array, mx.array]:
                if not 0 <= begin < end <= n:
                    raise MetalgenError(f"row {b} holds {n} positions, not {begin} .. {end}")
                keys, values = stacked()
                # (layers, N, Hkv, D) -> its positions (layers, Hkv, end - begin, D), a buffer of its own
                return tuple(mx.contiguous(mx.swapaxes(a[:, at + begin : at + end], 1, 2)) for a in (keys, values))

            return slicer

        return [slicer_of(i) for i in range(len(rows))]

    def row_states(self, b: int) -> Callable[[], List[mx.array]]:
        """For the prefix cache: () -> row b's Gated DeltaNet states after its positions so far, (conv (1, ...),
        recurrent (1, ...)) for each such layer in layer order (a hybrid stack's snapshot)."""
        return lambda: [a[b : b + 1] for c in self.states for a in (c.conv_state, c.recurrent)]

    @property
    def state(self) -> List[mx.array]:
        return [a for layer in self.layers for a in layer.state]

    @property
    def nbytes(self) -> int:
        """The pools' bytes (held blocks and free ones), and the Gated DeltaNet layers' states."""
        return sum(layer.nbytes for layer in self.layers)


def _table_of(blocks: List[List[int]]) -> np.ndarray:
    """The rows' blocks as an int32 table (B, width), width the most blocks a row holds (at least 1), zeros past
    a row's own."""
    table = np.zeros((len(blocks), max(1, max(len(b) for b in blocks))), np.int32)
    for b, row in enumerate(blocks):
        table[b, : len(row)] = row
    return table


def _slots(blocks: Sequence[int], positions, block_size: int):
    """The pool slots of a row's positions (an int32 array): its block for each, then the offset in it
    (kernels_metal.reference.paged_slots is the same on the device, for a table of rows)."""
    p = np.asarray(positions)
    return (np.asarray(blocks, np.int32)[p // block_size] * block_size + p % block_size).astype(np.int32)
