"""KVCache: growth in steps, offsets, and equality of cached and uncached attention inputs."""

from __future__ import annotations

import numpy as np

import mlx.core as mx

from metalgen.cache import KVCache


def rand(shape, seed):
    return mx.array(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def test_update_and_fetch_concatenates_and_grows_in_steps():
    cache = KVCache()
    k1, v1 = rand((1, 2, 5, 8), 0), rand((1, 2, 5, 8), 1)
    keys, values = cache.update_and_fetch(k1, v1)
    assert cache.offset == 5 and cache.keys.shape[2] == KVCache.step
    for i in range(300):  # crosses a step boundary, so the buffer is regrown and copied
        cache.update(rand((1, 2, 1, 8), 10 + i), rand((1, 2, 1, 8), 1000 + i))
    assert cache.offset == 305 and cache.keys.shape[2] == 2 * KVCache.step
    np.testing.assert_array_equal(np.array(cache.keys[:, :, :5]), np.array(k1))
    np.testing.assert_array_equal(np.array(cache.values[:, :, 5:6]), np.array(rand((1, 2, 1, 8), 1000)))


def test_max_size_caps_capacity():
    cache = KVCache(max_size=10)
    cache.update(rand((1, 1, 3, 4), 0), rand((1, 1, 3, 4), 1))
    assert cache.keys.shape[2] == 10
    assert cache.nbytes == 2 * 10 * 4 * 4
