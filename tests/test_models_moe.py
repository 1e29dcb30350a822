"""Qwen3-MoE and Qwen2-MoE (models/moe.py, qwen3_moe.py, qwen2_moe.py): parity with transformers on
tiny random fp32 checkpoints, every checkpoint layout, experts stacked across layers at load, the
dummy shapes, and one-line errors for bad checkpoints."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten

import kernels_metal
import metalgen
from metalgen.cache import make_prompt_cache
from metalgen.errors import MetalgenError
from metalgen.generate import generate_step
from metalgen.models import build_model
from metalgen.models.moe import QuantizedSwitchLinear

from conftest import copy_tokenizer, mlx_jit_gap
from hf_checkpoints import rel_err, save_tiny_hf_model, saved_pair

PROMPT_LEN = 40  # x top-2 = 80 (token, expert) pairs: the CPU's grouped product, not the gathered one
DECODE_STEPS = 16
GREEDY = 48
TOL = 1e-4  # float32 on every backend (conftest turns MLX's TF32 matmuls off on CUDA)

CASES = {
    # mixed dense / sparse (layer 1 dense by mlp_only_layers), renormalised top-k, untied
    "qwen3moe-mixed-norm-untied": ("qwen3_moe", dict(head_dim=16, num_hidden_layers=3, mlp_only_layers=[1],
                                                     norm_topk_prob=True, tie_word_embeddings=False)),
    # every other layer sparse (decoder_sparse_step 2), raw softmax weights, tied
    "qwen3moe-step2-raw-tied": ("qwen3_moe", dict(head_dim=16, num_hidden_layers=4, decoder_sparse_step=2,
                                                  norm_topk_prob=False, tie_word_embeddings=True,
                                                  num_experts_per_tok=3)),
    # transformers 5's packed expert tensors
    "qwen3moe-packed": ("qwen3_moe", dict(head_dim=16, norm_topk_prob=True, tie_word_embeddings=True,
                                          packed=True)),
    # the shared expert with its sigmoid gate, layer 0 dense, raw weights, untied, q/k/v biases
    "qwen2moe-shared-untied": ("qwen2_moe", dict(num_hidden_layers=3, mlp_only_layers=[0],
                                                 tie_word_embeddings=False)),
    "qwen2moe-norm-tied-packed": ("qwen2_moe", dict(norm_topk_prob=True, tie_word_embeddings=True, packed=True)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    return saved_pair(tmp_path_factory, request.param, *CASES[request.param])


def test_logits_match_transformers(pair):
    import torch

    hf, ours = pair
    ids = np.random.default_rng(1).integers(0, 512, PROMPT_LEN + DECODE_STEPS)
    with torch.no_grad():
        ref = hf(torch.tensor(ids[None])).logits[0].numpy()
    cache = make_prompt_cache(ours, decode="plain")
    got = [np.array(ours(mx.array(ids[None, :PROMPT_LEN]), cache=cache)[0])]
    for t in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
        got.append(np.array(ours(mx.array(ids[None, t:t + 1]), cache=cache)[0]))
    got = np.concatenate(got)
    assert rel_err(got[:PROMPT_LEN], ref[:PROMPT_LEN]) < TOL
    for t in range(PROMPT_LEN, PROMPT_LEN + DECODE_STEPS):
        assert rel_err(got[t], ref[t]) < TOL, f"decode step {t - PROMPT_LEN}"


def test_greedy_tokens_match_transformers(pair):
    import torch

    hf, ours = pair
    prompt = np.random.default_rng(2).integers(0, 512, 12)
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompt[None]), max_new_tokens=GREEDY, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, 12:].tolist()
    got = [t for t, _ in generate_step(mx.array(prompt), ours, max_tokens=GREEDY)]
    assert got == want


def test_router_scores_match_transformers(pair):
    # the routing itself: top-k experts and their weights for every token of a prompt
    import torch

    hf, ours = pair
    sparse = ours.spec.moe.sparse_layers[0]
    x = np.random.default_rng(4).standard_normal((30, hf.config.hidden_size)).astype(np.float32)
    with torch.no_grad():
        _, want_w, want_i = hf.model.layers[sparse].mlp.gate(torch.tensor(x))
    from kernels_metal import moe_route

    blk = ours.model.layers[sparse].mlp
    w, i = moe_route(blk.gate(mx.array(x)), blk.top_k, blk.norm_topk_prob)
    assert np.array_equal(np.sort(np.array(i), -1), np.sort(want_i.numpy(), -1))
    # the router's float32 matmul and softmax: 1e-6
    assert np.abs(np.sort(np.array(w), -1) - np.sort(want_w.numpy(), -1)).max() < 1e-6


def test_experts_are_stacked_across_layers_as_views(pair):
    _, ours = pair
    moe = ours.spec.moe
    st = ours.model.expert_stacks()
    assert st is not None and st.keys == ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
    L, E, I, H = len(moe.sparse_layers), moe.num_experts, moe.intermediate_size, ours.spec.hidden_size
    assert st.arrays["gate_proj.weight"].shape == (L, E, I, H)
    assert st.arrays["down_proj.weight"].shape == (L, E, H, I)
    for s, layer in enumerate(moe.sparse_layers):
        w = ours.model.layers[layer].mlp.switch_mlp.gate_proj.weight
        assert np.array_equal(np.array(w), np.array(st.arrays["gate_proj.weight"][s]))
    # replacing a layer's weights makes the stacks stale, and they say so
    layer = ours.model.layers[moe.sparse_layers[-1]].mlp.switch_mlp.up_proj
    old = layer.weight
    layer.weight = old + 0
    assert ours.model.expert_stacks() is None
    layer.weight = old
    assert ours.model.expert_stacks() is st


def test_chunked_prefill_equals_single_pass(pair):
    _, ours = pair
    ids = mx.array(np.random.default_rng(3).integers(0, 512, 70))
    one = [t for t, _ in generate_step(ids, ours, max_tokens=6, prefill_step_size=512)]
    chunked = [t for t, _ in generate_step(ids, ours, max_tokens=6, prefill_step_size=9)]
    assert one == chunked


# --- the MLX community layout (switch_mlp, optionally quantized) ----------------------------------


def _save_mlx_layout(model, config, folder, quantize=None):
    """Write `model` as mlx_lm.convert does: stacked switch_mlp experts, quantized with the routers
    at 8 bits (mlx-lm's qwen3_moe predicate) when `quantize` = (group_size, bits)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(config)
    if quantize:
        gs, bits = quantize
        q = {"group_size": gs, "bits": bits}

        def pred(path, module):
            if path.endswith("mlp.gate"):
                q[path] = {"group_size": gs, "bits": 8}
                return q[path]
            return hasattr(module, "to_quantized") and module.weight.shape[-1] % gs == 0

        nn.quantize(model, gs, bits, class_predicate=pred)
        config["quantization"] = q
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(config))
    copy_tokenizer(folder)
    return model


TINY = dict(model_type="qwen3_moe", hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, intermediate_size=96, moe_intermediate_size=64,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
            vocab_size=151936, tie_word_embeddings=False, max_position_embeddings=256,
            decoder_sparse_step=1, rms_norm_eps=1e-6, rope_theta=1e6)


@pytest.mark.parametrize("quantize", [None, (64, 4), (32, 8)])
def test_mlx_layout_loads(tmp_path, quantize):
    from metalgen.dummy import random_weights

    src = build_model(TINY)
    src.update(random_weights(src, seed=5, dtype=mx.float32))
    _save_mlx_layout(src, TINY, tmp_path, quantize)
    model, _ = metalgen.load(str(tmp_path))
    for (name, a), (_, b) in zip(sorted(tree_flatten(model.parameters())), sorted(tree_flatten(src.parameters()))):
        assert np.array_equal(np.array(a), np.array(b)), name
    ids = mx.array([[1, 2, 3, 4, 5, 6, 7, 8]])
    # the same bits through the same ops on the CPU; on a GPU the loaded model's experts, stacked
    # across layers, may take another kernel than the in-memory model's per-layer ones
    with mlx_jit_gap():  # MLX's own quantized products, in both models
        got, want = np.array(model(ids)), np.array(src(ids))
    if kernels_metal.backend() == "cpu":
        assert np.array_equal(got, want)
    else:
        assert rel_err(got, want) < TOL
    blk = model.model.layers[0].mlp
    if quantize:
        assert isinstance(blk.switch_mlp.gate_proj, QuantizedSwitchLinear)
        assert (blk.switch_mlp.gate_proj.group_size, blk.switch_mlp.gate_proj.bits) == quantize
        assert blk.gate.bits == 8  # the router kept its own override
        assert model.model.expert_stacks().keys[:3] == ("gate_proj.weight", "gate_proj.scales", "gate_proj.biases")


def test_mlx_layout_matches_mlx_lm(tmp_path):
    # the same folder through mlx-lm's own loader: the same logits (both float32)
    mlx_lm = pytest.importorskip("mlx_lm")
    from metalgen.dummy import random_weights

    src = build_model(TINY)
    src.update(random_weights(src, seed=6, dtype=mx.float32))
    _save_mlx_layout(src, TINY, tmp_path, (64, 4))
    ours, _ = metalgen.load(str(tmp_path))
    theirs, _ = mlx_lm.load(str(tmp_path))
    ids = mx.array([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])
    with mlx_jit_gap():
        got, want = np.array(ours(ids)), np.array(theirs(ids))
    assert rel_err(got, want) < TOL


# --- dummy shapes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-qwen3-moe-4bit", "tiny-qwen2-moe-8bit",
                                   "tiny-qwen3-8bit"])
def test_dummy_shapes(shape):
    model, tok = metalgen.load(f"dummy:{shape}")
    text = metalgen.generate(model, tok, "Hello", max_tokens=3)
    assert isinstance(text, str)
    bits = 4 if shape.endswith("4bit") else 8 if shape.endswith("8bit") else 0
    emb = model.model.embed_tokens
    assert getattr(emb, "bits", 0) == bits
    if model.spec.moe is not None:
        assert model.model.expert_stacks() is not None
        gate = model.model.layers[model.spec.moe.sparse_layers[0]].mlp.gate
        if bits and model.args.model_type == "qwen3_moe":
            assert gate.bits == 8  # mlx_lm.convert's router precision


def test_big_dummy_shapes_have_published_sizes():
    from metalgen.dummy import dummy_config

    def params(shape):
        args = build_model(dummy_config(shape)).args
        model = build_model(dummy_config(shape))
        return sum(v.size for _, v in tree_flatten(model.parameters())), args

    n, args = params("qwen3-30b-a3b")
    assert 30.0e9 < n < 31.0e9 and args.num_experts == 128 and args.num_experts_per_tok == 8
    spec = build_model(dummy_config("qwen3-235b-a22b")).spec
    assert spec.num_hidden_layers == 94 and spec.moe.intermediate_size == 1536
    assert build_model(dummy_config("qwen1.5-moe-a2.7b")).spec.moe.shared_intermediate_size == 5632
    with pytest.raises(MetalgenError, match="unknown dummy shape"):
        metalgen.load("dummy:qwen3-30b-a3b-3bit")


# --- bad checkpoints ---------------------------------------------------------------------------------


@pytest.fixture()
def per_expert_folder(tmp_path):
    save_tiny_hf_model(tmp_path, "qwen3_moe", head_dim=16)
    copy_tokenizer(tmp_path)
    return tmp_path


def _edit_weights(folder, fn):
    path = folder / "model.safetensors"
    w = dict(mx.load(str(path)))
    fn(w)
    path.unlink()
    mx.save_safetensors(str(path), w)


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_missing_expert_tensor(per_expert_folder):
    _edit_weights(per_expert_folder, lambda w: w.pop("model.layers.1.mlp.experts.5.up_proj.weight"))
    with pytest.raises(MetalgenError, match=r"'model\.layers\.1\.mlp\.experts\.5\.up_proj\.weight' is missing"):
        metalgen.load(str(per_expert_folder))


def test_wrong_expert_count(per_expert_folder):
    _edit_config(per_expert_folder, num_local_experts=6)
    with pytest.raises(MetalgenError, match="past num_experts 6"):
        metalgen.load(str(per_expert_folder))
    _edit_config(per_expert_folder, num_local_experts=10)
    with pytest.raises(MetalgenError, match=r"experts\.8\..* is missing .*num_experts 10"):
        metalgen.load(str(per_expert_folder))


def test_top_k_past_the_expert_count(per_expert_folder):
    _edit_config(per_expert_folder, num_experts_per_tok=9)
    with pytest.raises(MetalgenError, match="num_experts_per_tok 9 must be between 1 and num_experts 8"):
        metalgen.load(str(per_expert_folder))


def test_unsupported_expert_quantization(tmp_path):
    # MLX quantizes to 3 bits; the expert kernels do not take it
    from metalgen.dummy import random_weights

    src = build_model(TINY)
    src.update(random_weights(src, seed=7, dtype=mx.float32))
    w = dict(tree_flatten(src.parameters()))
    for name in [n for n in w if ".switch_mlp." in n]:
        base = name[: -len(".weight")]
        w[f"{base}.weight"], w[f"{base}.scales"], w[f"{base}.biases"] = mx.quantize(w[name], group_size=64, bits=3)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), w)
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, quantization={"group_size": 64, "bits": 3})))
    copy_tokenizer(tmp_path)
    with pytest.raises(MetalgenError, match=r"model\.layers\.0\.mlp\.switch_mlp\.\w+_proj: 3-bit experts"):
        metalgen.load(str(tmp_path))


def test_bad_checkpoint_is_one_line_on_the_cli(per_expert_folder, capsys):
    from metalgen.cli import main

    _edit_weights(per_expert_folder, lambda w: w.pop("model.layers.0.mlp.experts.0.gate_proj.weight"))
    assert main(["generate", "--model", str(per_expert_folder), "--prompt", "hi", "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("metalgen: error: tensor 'model.layers.0.mlp.experts.0.gate_proj")
