"""metalgen.paged_cache: rows joining with their own blocks, blocks freed and reused as rows leave, the pool
growing without losing what it holds, the step's slots and table, the prefix cache's copies, and a paged
decode step's logits against each sequence decoded alone (tiny float32 models on the CPU)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from metalgen.batch_cache import BatchKVCache
from metalgen.cache import make_prompt_cache
from metalgen.errors import MetalgenError
from metalgen.paged_cache import PagedBatchCache

from checkpoints import BATCH_CONFIGS, HYBRID_BATCH_CONFIGS, prefill_group, tiny_model

CONFIGS = {**BATCH_CONFIGS, **HYBRID_BATCH_CONFIGS}


def group_of(lengths, heads=2, dim=4, layers=1, start=1.0):
    """Per-layer left-padded caches as a prefill leaves them: row g holds lengths[g] positions whose keys
    count up from start + 1000 g (values negated; each layer adds 1e5), after its padding."""
    T = max(lengths)
    caches = []
    for layer in range(layers):
        c = BatchKVCache.empty([T - n for n in lengths])
        k = np.zeros((len(lengths), heads, T, dim), np.float32)
        for g, n in enumerate(lengths):
            k[g, :, T - n :] = (start + 1000 * g + 1e5 * layer + np.arange(heads * n * dim)).reshape(heads, n, dim)
        c.update(mx.array(k), mx.array(-k))
        caches.append(c)
    return caches


def row_keys(cache: PagedBatchCache, b: int, layer: int = 0) -> np.ndarray:
    """Row b's keys as (heads, length, dim), read through its blocks."""
    k, _ = cache.row_slicer(b)(0, cache.lengths[b])
    return np.array(k[layer])


def written(group, g: int, layer: int = 0) -> np.ndarray:
    c = group[layer]
    return np.array(c.keys[g, :, c.padding[g] : c.offset])


def test_rows_join_in_blocks_of_their_own_and_leave_them_free():
    cache = PagedBatchCache(num_layers=2, block_size=16)
    group = group_of([3, 20, 17], layers=2)
    cache.join(group, [0, 1, 2])
    assert cache.lengths == [3, 20, 17]
    assert [len(b) for b in cache.blocks] == [1, 2, 2]  # each row's length, to the block
    assert len({b for blocks in cache.blocks for b in blocks}) == 5  # no block shared
    for b in range(3):
        for layer in range(2):
            assert np.array_equal(row_keys(cache, b, layer), written(group, b, layer))
        _, v = cache.row_slicer(b)(0, cache.lengths[b])
        assert np.array_equal(np.array(v[1]), -written(group, b, 1))
    held = cache.blocks_held
    freed = set(cache.blocks[1])
    cache.keep([2, 0])  # the 20-token row leaves; the others keep their blocks, in the new order
    assert cache.lengths == [17, 3] and cache.blocks_held == held - 2
    assert np.array_equal(row_keys(cache, 0), written(group, 2)) and np.array_equal(row_keys(cache, 1), written(group, 0))
    # a twin (a request's `n` choices) gets its own copy of its prompt's row; freed blocks are reused first
    twins = group_of([5], layers=2, start=7.0)
    cache.join(twins, [0, 0])
    assert set(cache.blocks[2]) | set(cache.blocks[3]) <= freed and cache.blocks[2] != cache.blocks[3]
    assert np.array_equal(row_keys(cache, 2), written(twins, 0)) and np.array_equal(row_keys(cache, 3), written(twins, 0))


def test_the_pool_grows_and_keeps_what_it_holds():
    cache = PagedBatchCache(num_layers=1, block_size=16)
    group = group_of([40])
    cache.join(group, [0])
    first = cache.capacity
    assert first >= 3
    big = group_of([16 * first], start=5.0)  # more blocks than are free: the pools grow
    cache.join(big, [0])
    assert cache.capacity > first
    assert cache.layers[0].keys.shape[0] == cache.capacity * 16
    assert np.array_equal(row_keys(cache, 0), written(group, 0))
    assert np.array_equal(row_keys(cache, 1), written(big, 0))


def test_a_step_writes_each_rows_next_slot_and_crosses_into_a_new_block():
    cache = PagedBatchCache(num_layers=1, block_size=16)
    cache.join(group_of([16, 5]), [0, 1])
    assert [len(b) for b in cache.blocks] == [1, 1]
    cache.begin_step()
    # row 0's 17th position starts its second block; row 1 writes its 6th position
    assert [len(b) for b in cache.blocks] == [2, 1] and cache.lengths == [17, 6]
    assert cache.positions.tolist() == [16, 5] and cache.kv_lengths.tolist() == [17, 6]
    assert cache.max_length == 17
    table = cache.block_table.tolist()
    assert table[0] == cache.blocks[0] and table[1][0] == cache.blocks[1][0]
    assert cache.slots.tolist() == [cache.blocks[0][1] * 16, cache.blocks[1][0] * 16 + 5]
    # what the model's attention writes: one slot a row
    layer = cache.layers[0]
    q = mx.zeros((2, 2, 1, 4))
    k = mx.full((2, 2, 1, 4), 9.0)
    layer.attend(q, k, -k, 0.5)
    assert np.array_equal(row_keys(cache, 0)[:, 16], np.full((2, 4), 9.0))
    assert np.array_equal(row_keys(cache, 1)[:, 5], np.full((2, 4), 9.0))
    with pytest.raises(MetalgenError, match="one token a row"):
        layer.attend(mx.zeros((2, 2, 3, 4)), mx.zeros((2, 2, 3, 4)), mx.zeros((2, 2, 3, 4)), 0.5)


def test_bad_block_sizes_and_slices_are_one_line_errors():
    with pytest.raises(MetalgenError, match="block size must be one of"):
        PagedBatchCache(num_layers=1, block_size=24)
    cache = PagedBatchCache(num_layers=1, block_size=16)
    cache.join(group_of([4]), [0])
    with pytest.raises(MetalgenError, match="holds 4 positions, not 2 .. 6"):
        cache.row_slicer(0)(2, 6)


def close(batched: np.ndarray, alone: np.ndarray) -> bool:
    return float(np.abs(batched - alone).max()) <= 1e-4 * float(np.abs(alone).max())


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_paged_decode_logits_equal_each_sequence_alone(kind):
    """Rows of prompt lengths 7, 12 and 3 (block size 16: the 12-token row crosses into its second block on
    the 5th step) fed the same tokens batched and alone: every step's logits agree, while row 2 joins after
    two steps and row 1 leaves after four (its blocks freed, and reused by nothing that breaks the others).
    Hybrid stacks: the left-padded prefill leaves each row's Gated DeltaNet states as its prefill alone does
    (its prompt's last logits agree), and rows join and leave those layers' states too."""
    model = tiny_model(CONFIGS[kind])
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 512, n).tolist() for n in (7, 12, 3)]
    feeds = rng.integers(0, 512, (3, 6)).tolist()
    alone, last = [], []
    for p, feed in zip(prompts, feeds):
        c = make_prompt_cache(model, decode="plain")
        last.append(np.array(model(mx.array([p]), cache=c)[0, -1]))
        alone.append([np.array(model(mx.array([[t]]), cache=c)[0, -1]) for t in feed])

    cache = PagedBatchCache.for_model(model, block_size=16)
    group, logits = prefill_group(model, prompts[:2])
    assert close(np.array(logits[0]), last[0]) and close(np.array(logits[1]), last[1])
    cache.join(group, [0, 1])
    rows, fed = [0, 1], [0, 0, 0]
    compared = 0
    for step in range(6):
        if step == 2:
            cache.join(prefill_group(model, prompts[2:])[0], [0])
            rows.append(2)
        if step == 4:
            cache.keep([rows.index(0), rows.index(2)])
            rows = [0, 2]
        inputs = mx.array([[feeds[r][fed[r]]] for r in rows])  # (B, 1)
        cache.begin_step()
        logits = np.array(model(inputs, cache=cache.layers)[:, -1])
        for i, r in enumerate(rows):
            assert close(logits[i], alone[r][fed[r]]), (kind, step, r)
            fed[r] += 1
            compared += 1
    assert compared == 14 and cache.lengths == [7 + 6, 3 + 4]


def test_the_step_table_follows_rows_over_many_blocks_and_joins():
    # the host table is kept between steps and widened as rows take blocks: every step's table and slots are
    # those of the rows' block lists, also after a row joins and another leaves
    cache = PagedBatchCache(num_layers=1, block_size=16)
    cache.join(group_of([16]), [0])
    for step in range(70):
        if step == 30:
            cache.join(group_of([40]), [0])
        if step == 50:
            cache.keep([1])
        cache.begin_step()
        table, slots = np.array(cache.block_table), cache.slots.tolist()
        assert table.shape == (cache.size, max(len(b) for b in cache.blocks))
        for b, blocks in enumerate(cache.blocks):
            assert table[b, : len(blocks)].tolist() == blocks
            n = cache.lengths[b] - 1  # the position this step writes
            assert slots[b] == blocks[n // 16] * 16 + n % 16
    assert cache.lengths == [40 + 40] and len(cache.blocks[0]) == 5


def test_rows_leaving_together_share_one_copy_and_each_get_their_own_positions():
    cache = PagedBatchCache(num_layers=3, block_size=16)
    group = group_of([3, 20, 17], layers=3)
    cache.join(group, [0, 1, 2])
    slicers = cache.row_slicers([2, 0])
    for b, slicer in zip([2, 0], slicers):
        for begin, end in ((0, cache.lengths[b]), (1, 3)):
            k, v = slicer(begin, end)
            assert k.shape == (3, 2, end - begin, 4)
            for layer in range(3):
                assert np.array_equal(np.array(k[layer]), written(group, b, layer)[:, begin:end])
                assert np.array_equal(np.array(v[layer]), -written(group, b, layer)[:, begin:end])
    with pytest.raises(MetalgenError, match="row 0 holds 3 positions"):
        slicers[1](2, 4)


def test_row_states_padded_for_a_step_take_joining_rows_after_the_batchs_own():
    from metalgen.batch_cache import BatchLinearCache
    from metalgen.paged_cache import LinearRowStates

    def group(first, n):
        g = BatchLinearCache([0] * n, 4)
        # row r's values are first + r everywhere: (n, 3, 5) conv taps, (n, 2, 4, 4) states
        rows = mx.arange(first, first + n, dtype=mx.float32)
        g.conv_state = mx.broadcast_to(rows[:, None, None], (n, 3, 5))
        g.recurrent = mx.broadcast_to(rows[:, None, None, None], (n, 2, 4, 4))
        return g

    states = LinearRowStates()
    states.join(group(0, 3), mx.array([0, 1, 2], mx.int32))
    states.pad(8)  # a step of 3 rows run as 8
    assert states.recurrent.shape[0] == 8 and states.rows == 3
    states.join(group(10, 2), mx.array([1, 0], mx.int32))  # the padding goes, the new rows follow the batch's
    assert states.rows == 5 and states.recurrent.shape[0] == 5
    assert np.array(states.recurrent[:, 0, 0, 0]).tolist() == [0, 1, 2, 11, 10]
    assert np.array(states.conv_state[:, 0, 0]).tolist() == [0, 1, 2, 11, 10]
    states.pad(8)
    states.keep(mx.array([4, 0], mx.int32))
    assert states.rows == 2 and np.array(states.recurrent[:, 0, 0, 0]).tolist() == [10, 0]
