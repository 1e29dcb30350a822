"""metalgen.batch_cache: left-padded rows joining and leaving, the mask and positions, and a batched decode
step's logits against each sequence decoded alone (tiny float32 models on the CPU)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from metalgen.batch_cache import BatchKVCache, extend_caches, filter_caches
from metalgen.cache import KVCache, make_prompt_cache
from metalgen.errors import MetalgenError

from checkpoints import BATCH_CONFIGS, tiny_model


def merge_caches(batch, prompt_cache):
    """One sequence's per-layer KVCaches (prefilled alone) added to a batch's caches as a new last row."""
    return extend_caches(batch, [BatchKVCache.from_cache(c) for c in prompt_cache])


def filled(length: int, start: float) -> KVCache:
    """A one-row KVCache (1, 2 heads, length, 4) whose keys count up from `start` (values: negated)."""
    k = (start + mx.arange(2 * length * 4, dtype=mx.float32)).reshape(1, 2, length, 4)
    c = KVCache()
    c.update(k, -k)
    return c


def held(c: KVCache) -> np.ndarray:
    return np.array(c.keys[0, :, : c.offset])


def valid(c: BatchKVCache, row: int) -> np.ndarray:
    return np.array(c.keys[row, :, c.padding[row] : c.offset, :])


def test_rows_join_and_leave_with_their_padding():
    a, b, c = filled(3, 1.0), filled(5, 100.0), filled(9, 1000.0)
    batch = BatchKVCache.from_cache(a)
    batch.extend(BatchKVCache.from_cache(b))  # the batch is the shorter side: it gets the padding
    assert (batch.offset, batch.padding) == (5, [2, 0])
    assert batch.left_padding.tolist() == [2, 0] and batch.positions.tolist() == [3, 5]
    assert np.array_equal(valid(batch, 0), held(a)) and np.array_equal(valid(batch, 1), held(b))
    assert not np.array(batch.keys[0, :, :2]).any()  # the padding is zeros, hidden by the mask
    assert batch.keys.shape[2] > batch.offset  # room for the next step without reallocating

    batch.update(mx.ones((2, 2, 1, 4)), mx.ones((2, 2, 1, 4)))
    batch.extend(BatchKVCache.from_cache(c))  # the new row is the shorter side now: 6 columns against 9
    assert (batch.offset, batch.padding) == (9, [5, 3, 0])
    assert np.array_equal(valid(batch, 2), held(c))
    assert np.array_equal(valid(batch, 1)[:, :5], held(b)) and np.array(valid(batch, 1)[:, 5]).min() == 1

    batch.filter([0, 1])  # the longest row leaves: the 3 columns of padding every row kept shares go
    assert (batch.offset, batch.padding) == (6, [2, 0])
    assert np.array_equal(valid(batch, 0)[:, :3], held(a))
    assert np.array_equal(np.array(batch.values[1, :, :5]), -held(b))
    batch.filter([1])
    assert (batch.offset, batch.padding, batch.size) == (6, [0], 1)


def test_mask_hides_each_rows_padding_and_is_causal_for_chunks():
    batch = BatchKVCache.from_cache(filled(2, 0.0))
    batch.extend(BatchKVCache.from_cache(filled(4, 0.0)))
    one = np.array(batch.make_mask(1))
    assert one.shape == (2, 1, 1, 5)
    assert one[:, 0, 0].tolist() == [[False, False, True, True, True], [True] * 5]
    three = np.array(batch.make_mask(3))
    assert three.shape == (2, 1, 3, 7)
    assert three[0, 0].astype(int).tolist() == [[0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert three[1, 0, 0].astype(int).tolist() == [1, 1, 1, 1, 1, 0, 0]


def test_bad_joins_and_filters_are_one_line_errors():
    with pytest.raises(MetalgenError, match="only a filled per-layer KVCache"):
        BatchKVCache.from_cache(KVCache())
    two = KVCache()
    two.update(mx.zeros((2, 2, 3, 4)), mx.zeros((2, 2, 3, 4)))
    with pytest.raises(MetalgenError, match="one sequence, not 2"):
        BatchKVCache.from_cache(two)
    with pytest.raises(MetalgenError, match="at least one row"):
        BatchKVCache.from_cache(filled(2, 0.0)).filter([])
    assert filter_caches([BatchKVCache.from_cache(filled(2, 0.0))], []) is None


def close(batched: np.ndarray, alone: np.ndarray) -> bool:
    return float(np.abs(batched - alone).max()) <= 1e-4 * float(np.abs(alone).max())


@pytest.mark.parametrize("kind", sorted(BATCH_CONFIGS))
def test_batched_decode_logits_equal_each_sequence_alone(kind):
    """Rows of prompt lengths 7, 12 and 3 fed the same tokens batched and alone: every step's logits agree,
    while row 2 joins after two steps and row 1 (the longest) leaves after four."""
    model = tiny_model(BATCH_CONFIGS[kind])
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 512, n).tolist() for n in (7, 12, 3)]
    feeds = rng.integers(0, 512, (3, 6)).tolist()
    caches = []
    for p in prompts:  # each prompt prefilled alone, as metalgen.batch does before a row joins
        c = make_prompt_cache(model, decode="plain")
        mx.eval(model(mx.array([p]), cache=c))
        caches.append(c)
    alone = []
    for p, feed in zip(prompts, feeds):
        c = make_prompt_cache(model, decode="plain")
        model(mx.array([p]), cache=c)
        alone.append([np.array(model(mx.array([[t]]), cache=c)[0, -1]) for t in feed])

    batch = merge_caches(merge_caches(None, caches[0]), caches[1])
    rows, fed = [0, 1], [0, 0, 0]
    compared = 0
    for step in range(6):
        if step == 2:
            batch = merge_caches(batch, caches[2])
            rows.append(2)
        if step == 4:
            batch = filter_caches(batch, [rows.index(0), rows.index(2)])
            rows = [0, 2]
            assert batch[0].padding == [0, 6]  # 11 and 5 tokens: row 1's 5 columns more are gone with it
        inputs = mx.array([[feeds[r][fed[r]]] for r in rows])  # (B, 1)
        logits = np.array(model(inputs, cache=batch)[:, -1])
        for i, r in enumerate(rows):
            assert close(logits[i], alone[r][fed[r]]), (kind, step, r)
            fed[r] += 1
            compared += 1
    assert compared == 14 and all(c.offset == 7 + 6 for c in batch)


def test_an_empty_cache_takes_left_padded_rows_and_their_padding_queries_see_only_themselves():
    batch = BatchKVCache.empty([2, 0, 3])
    assert (batch.keys, batch.offset, batch.nbytes) == (None, 0, 0)
    assert batch.positions.tolist() == [-2, 0, -3]  # each row's first real token turns at position 0
    mask = np.array(batch.make_mask(4))
    assert mask.shape == (3, 1, 4, 4)
    # row 0: two padding queries, each on its own key, then causal over the real columns 2, 3
    assert mask[0, 0].astype(int).tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert mask[1, 0].astype(int).tolist() == np.tril(np.ones((4, 4), int)).tolist()
    assert mask[2, 0, 3].astype(int).tolist() == [0, 0, 0, 1]

    k = mx.arange(3 * 2 * 4 * 4, dtype=mx.float32).reshape(3, 2, 4, 4)
    batch.update(k, -k)  # the first chunk makes the buffers: its rows, heads, head_dim and dtype
    assert batch.offset == 4 and batch.keys.shape[:2] == (3, 2) and batch.keys.shape[2] > 4
    assert np.array_equal(np.array(batch.keys[:, :, :4]), np.array(k))
    one = np.array(batch.make_mask(1))  # a one-column chunk: row 2 is still padding there
    assert one.shape == (3, 1, 1, 5)
    assert one[:, 0, 0].astype(int).tolist() == [[0, 0, 1, 1, 1], [1] * 5, [0, 0, 0, 1, 1]]
    with pytest.raises(MetalgenError, match="3 rows was given 2 rows"):
        BatchKVCache.empty([0, 0, 0]).update(k[:2], k[:2])

    # rows 0 and 2 kept mid-prefill: 2 columns are padding of both, and written, so they go
    assert batch.filter([0, 2]) == 2
    assert (batch.offset, batch.padding) == (2, [0, 1])
    assert np.array_equal(np.array(batch.keys[1, :, :2]), np.array(k[2, :, 2:]))
    # a cache that has written fewer columns than the rows' shared padding drops only those
    early = BatchKVCache.empty([5, 3])
    early.update(k[:2, :, :1], k[:2, :, :1])
    assert early.filter([0, 1]) == 1 and (early.offset, early.padding) == (0, [4, 2])


@pytest.mark.parametrize("kind", sorted(BATCH_CONFIGS))
def test_prompts_prefilled_together_equal_each_alone(kind):
    """Prompts of 7, 12 and 3 tokens left-padded to 12 in one empty batched cache, fed in chunks of 5, 5 and 2
    columns (the first chunk is all padding for the 3-token row): each row's last logits, and those of two
    decode steps after the rows join a batch holding a longer prompt, agree with each prompt alone."""
    model = tiny_model(BATCH_CONFIGS[kind])
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 512, n).tolist() for n in (7, 12, 3)]
    first = rng.integers(0, 512, 14).tolist()  # the running batch's prompt, longer than all three
    feeds = rng.integers(0, 512, (4, 2)).tolist()
    alone = []
    for p, feed in zip(prompts + [first], feeds):
        c = make_prompt_cache(model, decode="plain")
        out = [np.array(model(mx.array([p]), cache=c)[0, -1])]
        alone.append(out + [np.array(model(mx.array([[t]]), cache=c)[0, -1]) for t in feed])

    T = max(map(len, prompts))
    padding = [T - len(p) for p in prompts]
    ids = mx.array([[0] * n + p for n, p in zip(padding, prompts)])  # (3, 12), left-padded
    group = [BatchKVCache.empty(padding) for _ in model.layers]
    for a, b in ((0, 5), (5, 10), (10, 12)):
        logits = np.array(model(ids[:, a:b], cache=group)[:, -1])
    assert not np.isnan(logits).any()
    for i in range(3):
        assert close(logits[i], alone[i][0]), (kind, i)

    running = make_prompt_cache(model, decode="plain")
    mx.eval(model(mx.array([first]), cache=running))
    batch = merge_caches(None, running)
    batch = extend_caches(batch, group)  # the group is the shorter side: 2 more columns of padding
    assert batch[0].padding == [0, 7, 2, 11] and batch[0].offset == 14
    for s in range(2):
        inputs = mx.array([[feeds[3][s]]] + [[feeds[i][s]] for i in range(3)])  # (4, 1): the batch's order
        logits = np.array(model(inputs, cache=batch)[:, -1])
        for row, r in enumerate([3, 0, 1, 2]):
            assert close(logits[row], alone[r][s + 1]), (kind, s, r)
