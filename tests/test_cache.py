"""KVCache: growth in steps, offsets, and equality of cached and uncached attention inputs; prompt
caches saved and loaded (the hybrid models' LinearAttnCache: tests/test_models_hybrid.py)."""

from __future__ import annotations

import numpy as np

import mlx.core as mx

import pytest

from metalgen.cache import KVCache, LinearAttnCache, load_prompt_cache, save_prompt_cache
from metalgen.errors import MetalgenError


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


def test_prompt_cache_round_trip(tmp_path):
    kv, empty, lin = KVCache(), KVCache(), LinearAttnCache()
    kv.update(rand((1, 2, 7, 8), 0), rand((1, 2, 7, 8), 1))
    lin.conv_state, lin.recurrent, lin.offset = rand((1, 3, 12), 2), rand((1, 4, 8, 8), 3), 7
    save_prompt_cache(tmp_path / "c.safetensors", [kv, empty, lin])
    a, b, c = load_prompt_cache(tmp_path / "c.safetensors")
    assert (a.offset, b.offset, c.offset) == (7, 0, 7) and b.keys is None
    np.testing.assert_array_equal(np.array(a.keys[..., :7, :]), np.array(kv.keys[..., :7, :]))
    np.testing.assert_array_equal(np.array(c.recurrent), np.array(lin.recurrent))
    np.testing.assert_array_equal(np.array(c.conv_state), np.array(lin.conv_state))
    a.update(rand((1, 2, 1, 8), 4), rand((1, 2, 1, 8), 5))  # a loaded cache grows as a fresh one
    assert a.offset == 8


def test_loading_a_file_that_is_not_a_prompt_cache(tmp_path):
    mx.save_safetensors(str(tmp_path / "w.safetensors"), {"x": mx.zeros((2,))})
    with pytest.raises(MetalgenError, match="not a metalgen prompt cache"):
        load_prompt_cache(tmp_path / "w.safetensors")
    with pytest.raises(MetalgenError, match="not a metalgen prompt cache"):
        load_prompt_cache(tmp_path / "missing.safetensors")



def test_copy_prompt_cache_is_left_alone_by_later_updates():
    # a hybrid stack's per-layer caches: KVCache (slice-assigned in place) and Gated DeltaNet states
    # (replaced each step): the copy and the original each go on as if the other did not exist
    import metalgen
    from metalgen.cache import cache_length, copy_prompt_cache, make_prompt_cache

    model = metalgen.load("dummy:tiny-qwen3.5", dtype="float32")[0]

    def logits_after(ids, cache=None):
        cache = cache if cache is not None else make_prompt_cache(model, decode="plain")
        out = model.logits(model.hidden(mx.array([ids], mx.int32), cache=cache)[:, -1, :])
        mx.eval(out)
        return out, cache

    _, cache = logits_after([5, 6, 7, 8])
    assert {type(c) for c in cache} == {KVCache, LinearAttnCache}
    copy = copy_prompt_cache(cache)
    logits_after([1, 2, 3], cache)  # the original moves on
    got_copy, _ = logits_after([9], copy)
    got_orig, _ = logits_after([9], cache)
    assert cache_length(copy) == 5 and cache_length(cache) == 8
    want_copy, _ = logits_after([5, 6, 7, 8, 9])
    want_orig, _ = logits_after([5, 6, 7, 8, 1, 2, 3, 9])
    np.testing.assert_allclose(np.array(got_copy), np.array(want_copy), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(got_orig), np.array(want_orig), rtol=1e-4, atol=1e-4)
    assert np.abs(np.array(want_copy) - np.array(want_orig)).max() > 1e-3  # the two histories differ
    assert copy_prompt_cache([object()]) is None and copy_prompt_cache(object()) is None
