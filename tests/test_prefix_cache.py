"""metalgen.prefix_cache: longest-prefix matches at any token, shared prefixes held once, only the missing
positions asked for, eviction by the byte budget in least-recently-used order (synthetic KV whose values are
the token ids, so that what comes back can be checked position by position)."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
import pytest

from metalgen.errors import MetalgenError
from metalgen.prefix_cache import PrefixCache

LAYERS, HEADS, DIM = 2, 1, 2
PER_TOKEN = 2 * LAYERS * HEADS * DIM * 4  # keys and values, float32: 32 bytes a position


def kv(ids):
    """(layers, heads, n, dim) keys holding each position's id (plus 1000 x the layer), values negated."""
    ids = mx.array(ids, mx.float32)
    k = ids[None, None, :, None] + 1000 * mx.arange(LAYERS, dtype=mx.float32)[:, None, None, None]
    k = mx.broadcast_to(k, (LAYERS, HEADS, ids.size, DIM)) + 0  # (+ 0: an array of its own)
    return k, -k


def slicer(ids, asked):
    def cut(begin, end):
        asked.append((begin, end))
        return kv(ids[begin:end])
    return cut


def insert(cache, ids):
    asked = []
    added = cache.insert(ids, slicer(ids, asked))
    return added, asked


def held(cache, ids):
    """The ids whose KV `cache` gives for the longest held prefix of `ids` (read back from the keys)."""
    n = cache.match(ids)
    if n == 0:
        return []
    k, v = cache.fetch(ids, n)
    assert k.shape == (LAYERS, HEADS, n, DIM) and np.array_equal(np.array(v), -np.array(k))
    return np.array(k[0, 0, :, 0]).astype(int).tolist()


def test_matches_end_at_any_token_and_shared_prefixes_are_held_once():
    cache = PrefixCache(1 << 20)
    a = list(range(1, 11))
    assert insert(cache, a) == (10, [(0, 10)])
    b = a[:6] + [50, 51]
    assert insert(cache, b) == (2, [(6, 8)])  # only what follows the shared 6 is asked for
    assert cache.tokens == 12 and cache.nbytes == 12 * PER_TOKEN
    assert cache.match(a[:6] + [50, 99]) == 7 and held(cache, a[:6] + [50, 99]) == a[:6] + [50]
    assert held(cache, a[:3] + [77]) == a[:3]  # ends inside a node
    assert held(cache, a + [11, 12]) == a and held(cache, b) == b
    assert insert(cache, a[:4]) == (0, [])  # a prefix of a held sequence: held already
    assert insert(cache, a + [11, 12]) == (2, [(10, 12)])  # a held sequence that goes on grows
    assert cache.tokens == 14 and cache.nbytes == 14 * PER_TOKEN
    assert held(cache, a + [11, 12, 13]) == a + [11, 12] and cache.match([2, 3]) == 0
    with pytest.raises(MetalgenError, match="holds 3 leading ids of this sequence, not 4"):
        cache.fetch(a[:3] + [0], 4)


def test_eviction_by_the_byte_budget_in_least_recently_used_order():
    cache = PrefixCache(25 * PER_TOKEN)
    a, b, c = (list(range(s, s + 10)) for s in (100, 200, 300))
    insert(cache, a)
    insert(cache, b)
    held(cache, a)  # a lookup: `a` is now more recent than `b`
    insert(cache, c)  # 30 positions: the least recently used, `b`, goes
    assert (cache.match(a), cache.match(b), cache.match(c)) == (10, 0, 10) and cache.nbytes == 20 * PER_TOKEN
    d = a[:5] + [7, 7, 7]  # shares 5 with `a`: its tail is the stalest leaf now
    insert(cache, d)
    held(cache, c)
    insert(cache, list(range(400, 407)))  # 30 again: `a`'s tail goes, the prefix it shares with `d` stays
    assert (cache.match(a), cache.match(d), cache.match(c)) == (5, 8, 10)
    assert cache.nbytes == 25 * PER_TOKEN == cache.tokens * PER_TOKEN
    # longer than the budget: what fits is kept (the sequence's first positions), everything else goes
    big = list(range(500, 540))
    assert insert(cache, big) == (25, [(0, 40), (0, 25)])
    assert cache.match(big) == 25 and cache.match(c) == 0 and cache.nbytes == 25 * PER_TOKEN


def test_the_budget_counts_what_memory_holds():
    """A node split or evicted keeps no view of a larger buffer: MLX's active memory follows `nbytes`. In a
    process of its own: MLX's active memory is the process's, and the servers other tests leave running
    allocate and free on their own threads."""
    import subprocess
    import sys

    code = f"""
import gc, sys
sys.path[:0] = {[os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(os.path.abspath(__file__))]!r}
import mlx.core as mx
from test_prefix_cache import PER_TOKEN, insert
from metalgen.prefix_cache import PrefixCache
gc.collect()
base = mx.get_active_memory()
cache = PrefixCache(1 << 30)
ids = list(range(4000))
insert(cache, ids)
insert(cache, ids[:1000] + [9])  # splits the 4000 at 1000
mx.eval([n.keys for n in cache._nodes()])
gc.collect()
assert abs(mx.get_active_memory() - base - cache.nbytes) < 4096, "split"
cache.max_bytes = 1500 * PER_TOKEN
insert(cache, [7])  # over budget: the 3000-position tail (least recently used) goes
assert cache.match(ids) == 1000
gc.collect()
assert abs(mx.get_active_memory() - base - cache.nbytes) < 4096 and cache.nbytes == 1002 * PER_TOKEN, "evicted"
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_no_budget_holds_nothing_and_a_negative_one_is_refused():
    cache = PrefixCache(0)
    assert insert(cache, [1, 2, 3]) == (0, []) and cache.match([1, 2, 3]) == 0
    with pytest.raises(MetalgenError, match="budget must be >= 0 bytes, got -1"):
        PrefixCache(-1)


def snapshot(n):
    """A hybrid stack's states after n ids (two arrays, each holding n), and the count of calls for them."""
    calls = []

    def make():
        calls.append(n)
        return [mx.full((1, 3), float(n)), mx.full((1, 2, 2), -float(n))]

    return make, calls


def test_state_snapshots_are_kept_where_sequences_end_and_are_the_only_places_to_start():
    cache = PrefixCache(1 << 20)
    a = list(range(1, 11))
    make, calls = snapshot(10)
    assert cache.insert(a, slicer(a, []), make) == 10 and calls == [10]
    state_bytes = (3 + 4) * 4
    assert cache.nbytes == 10 * PER_TOKEN + state_bytes
    assert cache.match(a + [11]) == 10 and cache.match_state(a + [11], 100) == 10
    assert cache.match_state(a, 9) == 0  # no snapshot at 9 or before: start from nothing
    # a held prefix gets its own snapshot: the node is cut where it ends, the tail keeps its own
    make6, calls6 = snapshot(6)
    assert cache.insert(a[:6], slicer(a, []), make6) == 0 and calls6 == [6]
    assert cache.nbytes == 10 * PER_TOKEN + 2 * state_bytes
    assert cache.match_state(a, 9) == 6 and cache.match_state(a + [11], 100) == 10
    assert cache.match_state(a[:6] + [99], 100) == 6 and cache.match_state(a[:5], 100) == 0
    assert np.array(cache.fetch_states(a, 6)[0]).tolist() == [[6.0] * 3]
    assert np.array(cache.fetch_states(a + [11], 10)[1]).tolist() == [[[-10.0] * 2] * 2]
    assert held(cache, a) == a  # the KV is as it was, across the cut
    # asked again: held already, nothing made
    assert cache.insert(a[:6], slicer(a, []), make6) == 0 and calls6 == [6]
    with pytest.raises(MetalgenError, match="no state after the first 8 ids"):
        cache.fetch_states(a, 8)
    # a branch without a snapshot (a sequence cut by the budget, or inserted without states) gives none
    b = a[:6] + [40, 41]
    cache.insert(b, slicer(b, []))
    assert cache.match(b) == 8 and cache.match_state(b + [1], 100) == 6
    # eviction takes a leaf's snapshot with its KV
    cache.max_bytes = 6 * PER_TOKEN + state_bytes
    cache._evict()
    assert cache.nbytes == 6 * PER_TOKEN + state_bytes and cache.match_state(a + [11], 100) == 6
