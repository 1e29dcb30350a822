"""A caller's prompt cache on the fast decode paths (metalgen.decode.prompt_cache): the plain prefill writes
into the stacked KV cache, the decoder decodes on it in place, turn after turn."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import kernels_metal as K
from metalgen.api import load
from metalgen.cache import KVCache, load_prompt_cache, make_prompt_cache, save_prompt_cache
from metalgen.decode.prompt_cache import StackedPromptCache
from metalgen.errors import MetalgenError
from metalgen.generate import generate_step
from metalgen.sampling import make_logits_processors, make_sampler

TURNS = [[5, 9, 17, 3, 88, 1000], [8, 77, 2], [4000] * 9 + [12, 13]]


@pytest.fixture(scope="module")
def tiny32():
    return load("dummy:tiny-qwen3", dtype="float32")[0]


def chat(model, cache, turns=TURNS, max_tokens=7, seed=5):
    """Each turn's tokens, sampled (seeded, with a repetition penalty) on `cache`, and the logits the last
    turn's final token gets from the cache afterwards."""
    out = []
    for i, turn in enumerate(turns):
        out.append([t for t, _ in generate_step(
            mx.array(turn, mx.int32), model, max_tokens=max_tokens, prompt_cache=cache,
            sampler=make_sampler(1.0, top_k=50, seed=seed + i), logits_processors=make_logits_processors(1.2))])
    h = model.hidden(mx.array([[out[-1][-1]]], mx.int32), cache=cache)
    return out, model.logits(h[:, -1, :])


def test_turns_on_the_stacked_cache_equal_the_plain_ones(tiny32):
    stacked = make_prompt_cache(tiny32, decode="reference")
    assert isinstance(stacked, StackedPromptCache) and len(stacked) == len(tiny32.model.layers)
    stacked.step = 8  # grow often: every turn crosses the capacity
    plain = make_prompt_cache(tiny32, decode="plain")
    a, la = chat(tiny32, stacked)
    b, lb = chat(tiny32, plain)
    assert a == b
    assert len({t for turn in a for t in turn}) > 3  # the turns are not one repeated token
    assert float(mx.max(mx.abs(la - lb)).item()) < 1e-4
    n = sum(map(len, TURNS)) + len(TURNS) * 6 + 1  # each turn's last token is fed by the next one
    assert stacked.offset == plain[0].offset == n and stacked.state.capacity >= n
    for c, p in zip(stacked, plain):
        assert mx.allclose(c.keys[..., :n, :], p.keys[..., :n, :], atol=1e-6).item()


def test_layers_report_their_own_offsets_inside_a_forward_pass(tiny32):
    cache = make_prompt_cache(tiny32, decode="reference")
    seen = []
    for layer in cache:
        orig = layer.update

        def spy(k, v, layer=layer, orig=orig):
            before = layer.offset
            orig(k, v)
            seen.append((layer.layer, before, layer.offset, cache.offset))

        layer.update = spy
    tiny32.hidden(mx.array([[1, 2, 3]], mx.int32), cache=cache)
    # layer 0 reports 3 once written while the state commits only after the last layer
    assert seen == [(0, 0, 3, 0), (1, 0, 3, 3)]


def test_saved_stacked_cache_loads_as_per_layer_caches(tiny32, tmp_path):
    stacked = make_prompt_cache(tiny32, decode="reference")
    list(generate_step(mx.array(TURNS[0], mx.int32), tiny32, max_tokens=4, prompt_cache=stacked))
    save_prompt_cache(tmp_path / "c.safetensors", stacked)
    loaded = load_prompt_cache(tmp_path / "c.safetensors")
    assert all(isinstance(c, KVCache) and not isinstance(c, type(stacked[0])) for c in loaded)
    p = mx.array(TURNS[1], mx.int32)
    a = [t for t, _ in generate_step(p, tiny32, max_tokens=5, prompt_cache=stacked)]
    b = [t for t, _ in generate_step(p, tiny32, max_tokens=5, prompt_cache=loaded)]
    assert a == b


def test_which_models_get_a_stacked_cache(tiny32):
    if K.backend() == "cpu":  # "auto" is the plain path on the CPU
        assert not isinstance(make_prompt_cache(tiny32), StackedPromptCache)
    assert not isinstance(make_prompt_cache(tiny32, max_size=64, decode="reference"), StackedPromptCache)
    hybrid = load("dummy:tiny-qwen3.5")[0]  # Gated DeltaNet layers keep per-layer caches
    assert not isinstance(make_prompt_cache(hybrid, decode="reference"), StackedPromptCache)


def test_hybrid_turns_take_the_compiled_path_on_the_callers_cache(monkeypatch):
    # the hybrid stacks keep per-layer caches; the compiled path advances them in place, so a caller's
    # cache holds every turn as the plain path's does
    from metalgen.decode import compiled

    built, real = [], compiled.CompiledDecoder
    monkeypatch.setattr(compiled, "CompiledDecoder", lambda *a: built.append(a) or real(*a))
    model = load("dummy:tiny-qwen3.5", dtype="float32")[0]
    runs = []
    for mode in ("compiled", "plain"):
        cache = make_prompt_cache(model, decode="plain")
        runs.append([[t for t, _ in generate_step(mx.array(turn, mx.int32), model, max_tokens=6, prompt_cache=cache,
                                                   decode=mode, sampler=make_sampler(1.0, seed=i))]
                     for i, turn in enumerate(TURNS)])
        runs[-1].append(cache[0].offset)
    assert runs[0] == runs[1] and len(built) == len(TURNS)


def test_a_cache_past_the_context_is_a_clear_error(tiny32):
    cache = make_prompt_cache(tiny32, decode="reference")
    limit = cache.max_positions
    with pytest.raises(MetalgenError, match=f"past the model's context of {limit}"):
        list(generate_step(mx.array([1] * 8, mx.int32), tiny32, max_tokens=limit, prompt_cache=cache))


@pytest.mark.parametrize("dtype,H,D", [(mx.bfloat16, 2, 64), (mx.float16, 8, 128), (mx.float32, 2, 64)])
def test_kv_store_writes_one_layer_and_returns_its_positions(dtype, H, D):
    # the kernel on a GPU (in place), the slice update on the CPU: the layer's positions 7..11 replaced,
    # every other position and layer kept, and the layer's first 12 positions returned
    rng = np.random.default_rng(0)
    kc, vc = (mx.array(rng.standard_normal((3, H, 16, D)), dtype) for _ in range(2))
    k, v = (mx.array(rng.standard_normal((1, H, 5, D)), dtype) for _ in range(2))
    mx.eval(kc, vc, k, v)
    want_k, want_v = np.array(kc.astype(mx.float32)), np.array(vc.astype(mx.float32))
    want_k[1, :, 7:12], want_v[1, :, 7:12] = np.array(k[0].astype(mx.float32)), np.array(v[0].astype(mx.float32))
    kc2, vc2, sync, keys, values = K.kv_store(kc, vc, k, v, 1, 7)
    assert np.array_equal(np.array(keys.astype(mx.float32)), want_k[1:2, :, :12])
    assert np.array_equal(np.array(values.astype(mx.float32)), want_v[1:2, :, :12])
    mx.eval(sync)  # the cache arrays themselves, read once the write is done
    assert np.array_equal(np.array(kc2.astype(mx.float32)), want_k)
    assert np.array_equal(np.array(vc2.astype(mx.float32)), want_v)
    assert sync.shape == (1,) and sync.dtype == mx.uint32
    with pytest.raises(ValueError, match="past the cache capacity"):
        K.kv_store(kc2, vc2, k, v, 0, 12)


def teacher_forced_chat(model, cache, turns, steps):
    """Every decode step's logits (float32 (V,)) of a chat on `cache`, the tokens scripted (the same on every
    cache, whatever the logits say) and the logits recorded by a logits processor."""
    rng = np.random.default_rng(11)
    logits_seen = []

    def record(history, logits):
        logits_seen.append(logits.astype(mx.float32)[0])
        return logits

    for prompt in turns:
        script = iter(rng.integers(0, 150000, steps).tolist())

        def sampler(logits):
            return mx.array([next(script)], mx.int32), mx.zeros((1,))

        list(generate_step(prompt, model, max_tokens=steps, prompt_cache=cache, sampler=sampler,
                           logits_processors=[record]))
    return logits_seen


def test_teacher_forced_chat_on_the_reference_cache(tiny32):
    # the GPU test's helper, on the CPU: the reference decoder's stacked cache against plain, float32
    from metalgen.decode.path import rel_err

    turns = [mx.array(t, mx.int32) for t in TURNS]
    a = teacher_forced_chat(tiny32, make_prompt_cache(tiny32, decode="reference"), turns, 6)
    b = teacher_forced_chat(tiny32, make_prompt_cache(tiny32, decode="plain"), turns, 6)
    assert len(a) == len(b) == 18 and max(rel_err(x, y) for x, y in zip(a, b)) < 1e-5
    assert rel_err(a[0], a[1]) > 1e-2  # steps see different tokens: the comparison is not of one constant


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["qwen3-0.6b", "qwen2.5-0.5b-4bit"])
def test_gpu_chat_on_the_megakernel_cache_follows_plain(shape):
    # a three-turn chat on the megakernel's stacked cache (written by the prefill's kv_store, decoded on in
    # place) against plain per-layer caches, the same tokens fed to both: bf16 logits as close as two bf16
    # paths get (CHECK_RTOL-level noise, docs/decode.md), and the same number of positions held
    from metalgen.decode.path import rel_err

    if K.backend() != "cuda":
        pytest.skip("CUDA only")
    model = load(f"dummy:{shape}")[0]
    stacked = make_prompt_cache(model)  # "auto": the megakernel on CUDA
    assert isinstance(stacked, StackedPromptCache) and stacked.decoder.name == "megakernel"
    plain = make_prompt_cache(model, decode="plain")
    rng = np.random.default_rng(3)
    turns = [mx.array(rng.integers(0, 150000, n), mx.int32) for n in (40, 300, 700)]
    a = teacher_forced_chat(model, stacked, turns, 24)
    b = teacher_forced_chat(model, plain, turns, 24)
    errs = [rel_err(x, y) for x, y in zip(a, b)]
    print(f"{shape}: per-step relative error vs plain, largest {max(errs):.4f}, median {np.median(errs):.4f}")
    assert len(errs) == 72 and max(errs) < 5e-2
    assert stacked.offset == plain[0].offset == 1040 + 3 * 23


def test_the_cache_keeps_no_copies_of_its_layers_after_a_turn(tiny32):
    # the layers' returned keys and values (on a GPU copies of the cache) are let go once the step that
    # reads them is enqueued: a 16k-token prompt kept 1.9 GB of them alive through the decode (H200)
    cache = make_prompt_cache(tiny32, decode="reference")
    for prompt in (TURNS[0], [7]):  # a prompt of many tokens, then of one (the decode-shaped update)
        list(generate_step(mx.array(prompt, mx.int32), tiny32, max_tokens=3, prompt_cache=cache))
        assert all(layer._fetched is None for layer in cache)
    assert cache[0].keys.shape[2] == cache.offset  # read again on demand
