"""metalgen.batch_cache: left-padded rows joining and leaving, the mask and positions, and a batched decode
step's logits against each sequence decoded alone (tiny float32 models on the CPU)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from metalgen.batch_cache import BatchKVCache, filter_caches, merge_caches
from metalgen.cache import KVCache, make_prompt_cache
from metalgen.errors import MetalgenError

from checkpoints import BATCH_CONFIGS, tiny_model


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
