"""Parity of the Qwen2 / Qwen3 model files with Hugging Face transformers (torch, CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx

from metalgen.cache import make_prompt_cache
from metalgen.generate import generate_step

from conftest import check_layer_by_layer_equals_one_graph
from hf_checkpoints import rel_err, saved_pair

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT_LEN = 12
DECODE_STEPS = 32
# float32 end to end agrees with transformers to ~1e-6 on the CPU, and on CUDA with TF32 off (conftest)
TOL = 1e-4

CASES = {
    # qwen2 with q/k/v biases and tied embeddings, GQA ratio 2
    "qwen2-tied-gqa2": ("qwen2", dict(tie_word_embeddings=True)),
    # qwen2, plain multi-head (ratio 1), untied, linear rope scaling
    "qwen2-untied-mha-linear": (
        "qwen2",
        dict(num_key_value_heads=4, tie_word_embeddings=False,
             rope_scaling={"rope_type": "linear", "factor": 2.0}),
    ),
    # qwen3 with head_dim (32) != hidden / heads (8), untied, GQA ratio 4
    "qwen3-headdim-gqa4": (
        "qwen3",
        dict(num_attention_heads=8, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False),
    ),
    # qwen3 tied with YaRN as Qwen3 configs declare it
    "qwen3-tied-yarn": (
        "qwen3",
        dict(head_dim=32, tie_word_embeddings=True,
             rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    return saved_pair(tmp_path_factory, request.param, *CASES[request.param])


def test_logits_match_over_prompt_and_cached_decode(pair):
    hf, ours = pair
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 512, PROMPT_LEN + DECODE_STEPS)
    with torch.no_grad():
        ref = hf(torch.tensor(ids[None])).logits[0].numpy()

    cache = make_prompt_cache(ours, decode="plain")
    got = [np.array(ours(mx.array(ids[None, :PROMPT_LEN]), cache=cache)[0])]
    for t in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
        got.append(np.array(ours(mx.array(ids[None, t : t + 1]), cache=cache)[0]))
    got = np.concatenate(got)
    assert got.shape == ref.shape
    assert rel_err(got[:PROMPT_LEN], ref[:PROMPT_LEN]) < TOL
    for t in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
        assert rel_err(got[t], ref[t]) < TOL, f"decode step {t - PROMPT_LEN}"


def test_greedy_continuation_identical(pair):
    hf, ours = pair
    prompt = np.random.default_rng(2).integers(0, 512, PROMPT_LEN)
    with torch.no_grad():
        out = hf.generate(
            torch.tensor(prompt[None]), max_new_tokens=64, do_sample=False,
            eos_token_id=None, pad_token_id=0,
        )[0, PROMPT_LEN:].tolist()
    ours_tokens = [t for t, _ in generate_step(mx.array(prompt), ours, max_tokens=64)]
    assert ours_tokens == out


def test_layer_by_layer_equals_one_graph(pair):
    check_layer_by_layer_equals_one_graph(pair[1])


def test_chunked_prefill_equals_single_pass(pair):
    _, ours = pair
    ids = mx.array(np.random.default_rng(3).integers(0, 512, 40))
    one = [t for t, _ in generate_step(ids, ours, max_tokens=8, prefill_step_size=512)]
    chunked = [t for t, _ in generate_step(ids, ours, max_tokens=8, prefill_step_size=7)]
    assert one == chunked
