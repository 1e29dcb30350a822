"""The compiled decode path (metalgen/decode/compiled.py) against the plain path on the hybrid stacks."""

import mlx.core as mx
import numpy as np
import pytest

import kernels_metal as K
from metalgen.api import load
from metalgen.cache import make_prompt_cache
from metalgen.decode import make_step
from metalgen.decode.check import step_errors
from metalgen.decode.path import AUTO_COMPILED, _entry, takes_compiled
from metalgen.errors import MetalgenError
from metalgen.generate import generate_step

from conftest import mlx_jit_gap

SHAPES = ["tiny-qwen3.5", "tiny-qwen3-next", "tiny-qwen3.5-moe-4bit"]
# bf16 random-weight models: two paths that round in other places (a fused elementwise kernel on
# the GPU) differ by the bf16 noise; on the CPU the traced ops are the plain ones
TOL = 1e-5 if K.backend() == "cpu" else 2e-2


@pytest.fixture(scope="module", params=SHAPES)
def model(request):
    m = load(f"dummy:{request.param}")[0]
    with mlx_jit_gap():  # prompts of the lengths the tests below run, through every layer
        for n in (3, 4, 11, 21):
            mx.eval(m(mx.arange(1, n + 1)[None]))
    return m


def test_logits_follow_the_plain_path(model):
    errs = step_errors(model, "compiled", prompt_tokens=11, steps=12)
    assert max(errs) < TOL


def test_greedy_tokens_and_caches_match_plain(model):
    prompt = mx.array(np.random.default_rng(1).integers(0, 5000, 21), mx.int32)
    caches, tokens = {}, {}
    for mode in ("plain", "compiled"):
        # a prompt cache of the caller keeps generation on plain; so drive both through make_step
        cache = make_prompt_cache(model, decode="plain")
        model.logits(model.hidden(prompt[None], cache=cache)[:, -1, :])
        step = make_step(model, cache, int(prompt.size), 8, mode)
        assert (step is None) == (mode == "plain")
        tok, out = mx.array([7], mx.int32), []
        for _ in range(8):
            logits = model.logits(model.hidden(tok[None], cache=cache)[:, -1, :]) if step is None else step(tok)
            tok = mx.argmax(logits, axis=-1).astype(mx.int32)
            out.append(int(tok.item()))
        tokens[mode], caches[mode] = out, cache
    if K.backend() == "cpu":
        assert tokens["plain"] == tokens["compiled"]
    for a, b in zip(caches["plain"], caches["compiled"]):
        assert a.offset == b.offset == 29
        for x, y in zip(a.state, b.state):
            x, y = np.array(x.astype(mx.float32)), np.array(y.astype(mx.float32))
            assert np.abs(x - y).max() <= TOL * max(1.0, np.abs(x).max())


def test_layer_functions_are_traced_once_per_model(model):
    cache = make_prompt_cache(model, decode="plain")
    model.hidden(mx.array([[1, 2, 3]]), cache=cache)
    make_step(model, cache, 3, 4, "compiled")
    first = _entry(model)["compiled"]
    make_step(model, cache, 3, 4, "compiled")
    assert _entry(model)["compiled"] is first
    assert len(first) == model.spec.num_hidden_layers


def test_generate_step_takes_it_by_name(model):
    prompt = mx.array([5, 6, 7, 8], mx.int32)
    plain = [t for t, _ in generate_step(prompt, model, max_tokens=6, decode="plain")]
    compiled = [t for t, _ in generate_step(prompt, model, max_tokens=6, decode="compiled")]
    assert len(compiled) == 6
    if K.backend() == "cpu":
        assert compiled == plain


def test_auto_takes_it_only_where_measured():
    hybrid = load("dummy:tiny-qwen3.5")[0]
    assert takes_compiled(hybrid, "auto") == (K.backend() in AUTO_COMPILED)
    assert takes_compiled(hybrid, "compiled") and not takes_compiled(hybrid, "plain")


def test_a_dense_model_is_refused_by_name():
    dense = load("dummy:tiny-qwen3")[0]
    assert not takes_compiled(dense, "auto")
    with pytest.raises(MetalgenError, match="hybrid"):
        takes_compiled(dense, "compiled")
