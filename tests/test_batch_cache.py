"""metalgen.batch_cache: prompts prefilled together in left-padded rows, the mask and positions, rows leaving
mid-prefill, and the rows' logits (and those of decode steps after they join a paged batch) against each
prompt alone (tiny float32 models on the CPU)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from metalgen.batch_cache import BatchKVCache, BatchLinearCache, empty_group_caches, filter_caches
from metalgen.cache import make_prompt_cache
from metalgen.errors import MetalgenError
from metalgen.paged_cache import PagedBatchCache

from checkpoints import BATCH_CONFIGS, HYBRID_BATCH_CONFIGS, tiny_model

CONFIGS = {**BATCH_CONFIGS, **HYBRID_BATCH_CONFIGS}


def test_mask_hides_each_rows_padding_and_is_causal_for_chunks():
    batch = BatchKVCache.empty([2, 0])
    k = mx.ones((2, 2, 4, 4))
    batch.update(k, k)  # 4 columns: row 0 holds 2 tokens after its padding, row 1 holds 4
    one = np.array(batch.make_mask(1))
    assert one.shape == (2, 1, 1, 5)
    assert one[:, 0, 0].tolist() == [[False, False, True, True, True], [True] * 5]
    three = np.array(batch.make_mask(3))
    assert three.shape == (2, 1, 3, 7)
    assert three[0, 0].astype(int).tolist() == [[0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert three[1, 0, 0].astype(int).tolist() == [1, 1, 1, 1, 1, 0, 0]


def test_bad_filters_are_one_line_errors():
    with pytest.raises(MetalgenError, match="at least one row"):
        BatchKVCache.empty([0, 1]).filter([])
    assert filter_caches([BatchKVCache.empty([0])], []) is None
    with pytest.raises(MetalgenError, match="2 rows was given 1 paddings"):
        BatchKVCache(mx.zeros((2, 1, 3, 4)), mx.zeros((2, 1, 3, 4)), 3, [0])


def close(batched: np.ndarray, alone: np.ndarray) -> bool:
    return float(np.abs(batched - alone).max()) <= 1e-4 * float(np.abs(alone).max())


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


def test_a_linear_layers_cache_feeds_zeros_at_each_rows_padding_and_filters_like_the_kv():
    batch = BatchLinearCache.empty([2, 0, 5])
    assert (batch.size, batch.state, batch.nbytes) == (3, [], 0)
    assert np.array(batch.real_columns(4)).astype(int).tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
    batch.offset = 4  # (the layer counts the columns it is fed)
    assert np.array(batch.real_columns(2)).astype(int).tolist() == [[1, 1], [1, 1], [0, 1]]
    batch.offset = 5
    assert batch.real_columns(3) is None  # past every row's padding: nothing to zero
    batch.conv_state = mx.arange(3)[:, None, None] * mx.ones((3, 3, 2))
    batch.recurrent = mx.arange(3)[:, None, None, None] * mx.ones((3, 1, 2, 2))
    # rows 2 and 0 kept: 2 columns are padding of both and fed, so they are forgotten, as the KV's are
    assert batch.filter([2, 0]) == 2
    assert (batch.offset, batch.padding) == (3, [3, 0])
    assert np.array(batch.recurrent[:, 0, 0, 0]).tolist() == [2, 0] and np.array(batch.conv_state[:, 0, 0]).tolist() == [2, 0]
    with pytest.raises(MetalgenError, match="at least one row"):
        batch.filter([])
    # a hybrid stack's group: the kind each layer needs
    model = tiny_model(HYBRID_BATCH_CONFIGS["qwen3_5"])
    kinds = [type(c).__name__ for c in empty_group_caches(model, [1, 0])]
    assert kinds == ["BatchKVCache", "BatchLinearCache", "BatchKVCache", "BatchLinearCache"]


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_prompts_prefilled_together_equal_each_alone(kind):
    """Prompts of 7, 12 and 3 tokens left-padded to 12 in one empty batched cache, fed in chunks of 5, 5 and 2
    columns (the first chunk is all padding for the 3-token row): each row's last logits, and those of two
    decode steps after the rows join a paged batch holding a longer prompt, agree with each prompt alone."""
    model = tiny_model(CONFIGS[kind])
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
    group = empty_group_caches(model, padding)
    for a, b in ((0, 5), (5, 10), (10, 12)):
        logits = np.array(model(ids[:, a:b], cache=group)[:, -1])
    assert not np.isnan(logits).any()
    for i in range(3):
        assert close(logits[i], alone[i][0]), (kind, i)

    running = empty_group_caches(model, [0])
    mx.eval(model(mx.array([first]), cache=running))
    batch = PagedBatchCache.for_model(model, block_size=16)
    batch.join(running, [0])
    batch.join(group, [0, 1, 2])  # each row without its padding, in blocks of its own
    assert batch.lengths == [14, 7, 12, 3]
    for s in range(2):
        inputs = mx.array([[feeds[3][s]]] + [[feeds[i][s]] for i in range(3)])  # (4, 1): the batch's order
        batch.begin_step()
        logits = np.array(model(inputs, cache=batch.layers)[:, -1])
        for row, r in enumerate([3, 0, 1, 2]):
            assert close(logits[row], alone[r][s + 1]), (kind, s, r)
