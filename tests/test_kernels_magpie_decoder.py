"""kernels_metal.magpie_decoder_step's reference against Magpie's own decoder (Model.decoder_hidden over
StaticKVCaches, as the frame loop steps it), on a tiny random decoder in float32: CFG's two rows and
one row, with and without the attention prior; the packing and cache stacking of
metalgen.magpie.decoder_kernel; the public function on the CPU backend."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

import kernels_metal as K
from kernels_metal import reference as ref
from metalgen.cache import StaticKVCache
from metalgen.magpie.decoder_kernel import StackedMemory, kernel_step, pack_decoder, stack_caches
from metalgen.magpie.frames import alignment_scores
from metalgen.models.magpie.model import MagpieArgs, Model

EST = [0, 2]
PRIOR_LAYERS = [1, 2]


def _config():
    # 3 layers, width 64, 2 self-attention heads of 32, one cross head of 32, ffn 128
    stack = dict(n_layers=3, d_model=64, d_ffn=128, sa_n_heads=2, kernel_size=1, has_xattn=True, xa_d_memory=64,
                 xa_n_heads=1, xa_d_head=32, is_causal=True, apply_norm_out=True, max_length_causal_mask=64,
                 use_learnable_pos_emb=True)
    enc = dict(stack, has_xattn=False, kernel_size=3)
    cfg = dict(model_type="decoder_ce", embedding_dim=64, frame_stacking_factor=1, local_transformer_type="none",
               encoder=enc, decoder=stack)
    shapes = {f"audio_embeddings.{j}.weight": (24, 64) for j in range(2)}
    shapes["text_embedding.weight"] = (40, 64)
    return MagpieArgs.from_config(cfg, shapes=shapes)


@pytest.fixture(scope="module")
def model():
    m = Model(_config())
    params = tree_flatten(m.parameters())
    keys = mx.random.split(mx.random.key(7), len(params))
    new = []
    for (name, p), k in zip(params, keys):
        if name.endswith("norm_out.weight") or ".norm_" in name:
            v = 1.0 + 0.2 * mx.random.normal(p.shape, key=k)  # LayerNorm weights away from 1
        else:
            v = 0.2 * mx.random.normal(p.shape, key=k)
        new.append((name, v.astype(mx.float32)))
    m.update(tree_unflatten(new))
    m.eval()
    mx.eval(m.parameters())
    return m


def _setup(model, rows, L=9, prompt=5, seed=0):
    rng = np.random.default_rng(seed)
    memory = mx.array(rng.standard_normal((rows, L, 64)).astype(np.float32))
    if rows == 2:
        memory = mx.concatenate([memory[:1], mx.zeros_like(memory[:1])], axis=0)
        mask = mx.array(np.stack([np.ones(L, bool), np.arange(L) == 0]))
    else:
        mask = mx.array(rng.random((1, L)) > 0.2) | (mx.arange(L) == 0)[None]
    memory_kv = model.decoder_memory(memory)
    cache = model.decoder.make_cache()
    x0 = mx.array(rng.standard_normal((rows, prompt, 64)).astype(np.float32))
    model.decoder_hidden(x0, memory_kv, memory_mask=mask, cache=cache)
    mx.eval([c.state for c in cache])
    return memory_kv, mask, cache, rng


def _priors(rows, L, rng):
    p = np.full((rows, L), 0.1, np.float32)
    p[0] = np.where(rng.random(L) > 0.5, 1.0, 0.1)
    return mx.array(p)


@pytest.mark.parametrize("rows", [2, 1])
@pytest.mark.parametrize("with_prior", [True, False])
def test_reference_equals_the_model_decoder(model, rows, with_prior):
    memory_kv, mask, cache, rng = _setup(model, rows)
    L, C = mask.shape[1], 12
    statics = [StaticKVCache.from_cache(c, C) for c in cache]
    kc, vc = stack_caches(cache, C)
    w = pack_decoder(model)
    mem = StackedMemory.make(w, memory_kv, mask)
    # three steps in a row: each writes its row and reads the ones before
    for step in range(3):
        x = mx.array(rng.standard_normal((rows, 1, 64)).astype(np.float32))
        prior = _priors(rows, L, rng) if with_prior else None
        layer_prior = None if prior is None else [prior[:, None] if i in PRIOR_LAYERS else None for i in range(3)]
        h_m, probs = model.decoder_hidden(x, memory_kv, memory_mask=mask, attn_prior=layer_prior,
                                          return_attention=True, cache=statics)
        s_m = alignment_scores(probs, EST)
        offset = mx.array(5 + step, dtype=mx.int32)
        h_r, s_r = ref.magpie_decoder_step(x, offset, kc, vc, mem.keys, mem.values, mask, prior, w, PRIOR_LAYERS, EST)
        np.testing.assert_allclose(np.array(h_r), np.array(h_m[:, -1]), atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(np.array(s_r), np.array(s_m), atol=1e-5, rtol=1e-5)
        assert abs(float(s_r.sum()) - 1.0) < 1e-5
        for i, c in enumerate(statics):  # the step's row written in place, at its position
            np.testing.assert_allclose(np.array(kc[i]), np.array(c.keys), atol=1e-5, rtol=1e-5)
            np.testing.assert_allclose(np.array(vc[i]), np.array(c.values), atol=1e-5, rtol=1e-5)


def test_prior_changes_the_estimate(model):
    # a test that can fail: the prior must reach the layers named and nothing else
    memory_kv, mask, cache, rng = _setup(model, 2, seed=3)
    w = pack_decoder(model)
    mem = StackedMemory.make(w, memory_kv, mask)
    x = mx.array(rng.standard_normal((2, 64)).astype(np.float32))
    prior = _priors(2, mask.shape[1], rng)
    outs = []
    for pl in ([], PRIOR_LAYERS, None):
        kc, vc = stack_caches(cache, 8)
        outs.append(ref.magpie_decoder_step(x, 5, kc, vc, mem.keys, mem.values, mask, prior, w, pl, [1]))
    base = ref.magpie_decoder_step(x, 5, *stack_caches(cache, 8), mem.keys, mem.values, mask, None, w, None, [1])
    np.testing.assert_allclose(np.array(outs[0][0]), np.array(base[0]), atol=1e-6)  # no layer: no prior
    assert float(mx.abs(outs[1][1] - base[1]).max()) > 1e-3  # layer 1 takes it: its estimate moves
    assert float(mx.abs(outs[2][0] - outs[1][0]).max()) > 1e-4  # all layers differ from layers 1, 2


def test_pack_and_public_function(model):
    memory_kv, mask, cache, rng = _setup(model, 2, seed=5)
    w = pack_decoder(model)
    assert w is pack_decoder(model)  # packed once
    assert w.wqkv.shape == (3, 192, 64) and w.wxq.shape == (3, 32, 64) and w.wf2.shape == (3, 64, 128)
    assert w.norms.shape == (3, 3, 64) and w.n_heads == 2
    mem = StackedMemory.make(w, memory_kv, mask)
    assert mem.keys.shape == (3, 2, 9, 32) and mem.mask.dtype == mx.float32
    kc, vc = stack_caches(cache, 10)
    assert kc.shape == (3, 2, 2, 10, 32) and float(mx.abs(kc[:, :, :, 5:]).max()) == 0.0
    x = mx.array(rng.standard_normal((2, 1, 64)).astype(np.float32))
    prior = _priors(2, 9, rng)
    k2, v2 = mx.array(kc), mx.array(vc)
    h1, s1 = kernel_step(x, prior[:, None], mx.array(5, dtype=mx.int32), kc, vc, mem, {2, 1}, EST)
    h2, s2 = ref.magpie_decoder_step(x, 5, k2, v2, mem.keys, mem.values, mask, prior, w, PRIOR_LAYERS, EST)
    assert float(mx.abs(kc[:, :, :, 5]).max()) > 0  # the step's keys were written in place
    if K.backend() == "cpu":  # the reference itself: bit for bit
        assert np.array_equal(np.array(h1), np.array(h2)) and np.array_equal(np.array(s1), np.array(s2))
        assert np.array_equal(np.array(kc), np.array(k2))
    else:  # the kernel sums in another order than MLX's matmuls (float32 both)
        np.testing.assert_allclose(np.array(h1), np.array(h2), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.array(s1), np.array(s2), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.array(kc), np.array(k2), rtol=1e-4, atol=1e-5)


def test_bfloat16_reference_rounds_like_float32_within_bf16(model):
    memory_kv, mask, cache, rng = _setup(model, 2, seed=9)
    w32 = pack_decoder(model)
    w16 = pack_decoder(model, mx.bfloat16)
    assert w16.dtype == mx.bfloat16
    x = mx.array(rng.standard_normal((2, 64)).astype(np.float32))
    prior = _priors(2, 9, rng)
    m32, m16 = StackedMemory.make(w32, memory_kv, mask), StackedMemory.make(w16, memory_kv, mask)
    k, v = stack_caches(cache, 8)
    h32, s32 = ref.magpie_decoder_step(x, 5, k, v, m32.keys, m32.values, mask, prior, w32, PRIOR_LAYERS, EST)
    k, v = (a.astype(mx.bfloat16) for a in stack_caches(cache, 8))
    h16, s16 = ref.magpie_decoder_step(x, 5, k, v, m16.keys, m16.values, mask, prior, w16, PRIOR_LAYERS, EST)
    assert h16.dtype == mx.bfloat16 and s16.dtype == mx.float32
    assert float(mx.abs(h16.astype(mx.float32) - h32).max()) < 0.1 * float(mx.abs(h32).max())
    assert float(mx.abs(s16 - s32).max()) < 0.05


def test_frame_loop_on_the_kernel_path_draws_the_same_codes(monkeypatch):
    # the frame loop's kernel wiring (stacked caches from the prefill, StackedMemory, kernel_step), run
    # on the CPU through the reference: greedy codes and attended positions equal the MLX path's
    from metalgen.magpie import frames
    from metalgen.magpie.dummy import _model_init, _randomize, dummy_args
    from metalgen.magpie.generate import MagpieSampling

    m = Model(dummy_args("magpie-tiny"))
    _randomize(m, 0, mx.float32, _model_init(8))
    s = MagpieSampling(temperature=0.0, estimate_alignment_from_layers=[0, 1], apply_prior_to_layers=[1],
                       max_frames=10, min_frames=4)
    text = np.arange(3, 15)
    runs = []
    for use in (False, True):
        monkeypatch.setattr(frames, "decoder_kernel", (lambda model: pack_decoder(model)) if use else (lambda model: None))
        loop = frames.FrameLoop(m, text, 0, s, cfg=True, seed=1)
        rec = {}
        codes = np.concatenate(list(loop.pieces(rec)), axis=1)
        runs.append((codes, rec["attended"], isinstance(loop.memory_kv, StackedMemory)))
    assert not runs[0][2] and runs[1][2]  # the second run took the kernel path
    assert np.array_equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert runs[0][0].shape[1] >= 4
