"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (models/hybrid.py, gated_delta.py and the three model files):
parity with transformers on tiny random fp32 checkpoints, with prompts longer than one prefill chunk of
the gated delta rule; per-layer caches of both kinds, chunked prefill and saved prompt caches; the
image-text and MLX layouts; the dummy shapes; one-line errors for bad checkpoints."""

from __future__ import annotations

import json
import logging

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

import metalgen
from metalgen.cache import KVCache, LinearAttnCache, load_prompt_cache, make_prompt_cache, save_prompt_cache
from metalgen.errors import MetalgenError
from metalgen.generate import generate_step
from metalgen.dummy import dummy_config, quantize_like_mlx_lm, random_weight_dict
from metalgen.loading import load_model, read_config
from metalgen.models import build_model
from metalgen.models.layers import Linear, fuse_linears

from conftest import check_layer_by_layer_equals_one_graph, copy_tokenizer, mlx_jit_gap
from hf_checkpoints import rel_err, save_tiny_hf_model, saved_pair

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT_LEN = 80  # longer than one 64-token chunk of the chunked gated delta rule
DECODE_STEPS = 16
GREEDY = 48
TOL = 1e-4  # float32 on every backend (conftest turns MLX's TF32 matmuls off on CUDA)

CASES = {
    # sparse layers with a shared expert, layer 1 dense (mlp_only_layers), untied
    "qwen3next-mixed": ("qwen3_next", dict(mlp_only_layers=[1], tie_word_embeddings=False)),
    # raw softmax weights, one value head per key head, the attention layers first and last
    "qwen3next-raw-mha": ("qwen3_next", dict(norm_topk_prob=False, linear_num_value_heads=2,
                                             layer_types=["full_attention", "linear_attention",
                                                          "linear_attention", "full_attention"])),
    # dense, tied, the whole head turned
    # (the factor at the top level as well: transformers 5.17 reads it only there, 5.23 either place)
    "qwen3.5-tied-full-rope": ("qwen3_5", dict(tie_word_embeddings=True, partial_rotary_factor=1.0,
                                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 1.0})),
    "qwen3.5-moe": ("qwen3_5_moe", dict(tie_word_embeddings=False)),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    return saved_pair(tmp_path_factory, request.param, *CASES[request.param])


def test_logits_match_transformers(pair):
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
    hf, ours = pair
    prompt = np.random.default_rng(2).integers(0, 512, PROMPT_LEN)
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompt[None]), max_new_tokens=GREEDY, do_sample=False,
                           eos_token_id=None, pad_token_id=0)[0, PROMPT_LEN:].tolist()
    got = [t for t, _ in generate_step(mx.array(prompt), ours, max_tokens=GREEDY)]
    assert got == want


def test_caches_follow_the_layer_types(pair):
    _, ours = pair
    cache = make_prompt_cache(ours, decode="plain")
    kinds = ["linear" if isinstance(c, LinearAttnCache) else "kv" for c in cache]
    assert all(isinstance(c, (KVCache, LinearAttnCache)) for c in cache)
    assert kinds == ["linear" if t == "linear_attention" else "kv" for t in ours.spec.hybrid.layer_types]
    ours(mx.array([[1, 2, 3, 4, 5]]), cache=cache)
    lin = next(c for c in cache if isinstance(c, LinearAttnCache))
    spec = ours.spec.hybrid.linear
    assert lin.offset == 5 and lin.recurrent.dtype == mx.float32
    assert lin.recurrent.shape == (1, spec.num_value_heads, spec.key_head_dim, spec.value_head_dim)
    assert lin.conv_state.shape == (1, spec.conv_kernel - 1, spec.conv_dim)


def test_chunked_prefill_equals_single_pass(pair):
    # prompt chunks of 9 carry the conv taps and the recurrent state across chunk edges
    _, ours = pair
    ids = mx.array(np.random.default_rng(3).integers(0, 512, 70))
    one = [t for t, _ in generate_step(ids, ours, max_tokens=6, prefill_step_size=512)]
    chunked = [t for t, _ in generate_step(ids, ours, max_tokens=6, prefill_step_size=9)]
    assert one == chunked


def test_layer_by_layer_equals_one_graph(pair):
    check_layer_by_layer_equals_one_graph(pair[1])


def test_saved_prompt_cache_continues_the_sequence(pair, tmp_path):
    _, ours = pair
    ids = np.random.default_rng(5).integers(0, 512, 30)
    cache = make_prompt_cache(ours, decode="plain")
    ours(mx.array(ids[None, :20]), cache=cache)
    save_prompt_cache(tmp_path / "p.safetensors", cache, {"model": "tiny"})
    loaded, meta = load_prompt_cache(tmp_path / "p.safetensors", return_metadata=True)
    assert meta["model"] == "tiny" and [type(c) for c in loaded] == [type(c) for c in cache]
    got = np.array(ours(mx.array(ids[None, 20:]), cache=loaded))
    want = np.array(ours(mx.array(ids[None, 20:]), cache=cache))
    assert np.array_equal(got, want)
    assert rel_err(got[0], np.array(ours(mx.array(ids[None])))[0, 20:]) < 1e-4


# --- layouts ----------------------------------------------------------------------------------------


def test_image_text_layout_loads_the_text_decoder(tmp_path, caplog):
    # a Qwen3.5 checkpoint as published: config nested under text_config, weights under
    # model.language_model., a vision tower and multi-token-prediction weights beside them
    hf = save_tiny_hf_model(tmp_path / "text", "qwen3_5")
    text = load_model(tmp_path / "text", read_config(tmp_path / "text"))
    folder = tmp_path / "vl"
    folder.mkdir()
    cfg = json.loads((tmp_path / "text" / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
         "text_config": {**cfg, "model_type": "qwen3_5_text"}, "vision_config": {"depth": 2},
         "tie_word_embeddings": cfg.get("tie_word_embeddings", False)}))
    w = {k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
         for k, v in mx.load(str(tmp_path / "text" / "model.safetensors")).items()}
    w["model.visual.blocks.0.attn.qkv.weight"] = mx.zeros((4, 4))
    w["mtp.layers.0.input_layernorm.weight"] = mx.zeros((64,))
    mx.save_safetensors(str(folder / "model.safetensors"), w)
    copy_tokenizer(folder)
    with caplog.at_level(logging.WARNING, logger="metalgen.models"):
        model, _ = metalgen.load(str(folder))
    notes = [r.getMessage() for r in caplog.records if "image input is not supported" in r.getMessage()]
    assert len(notes) == 1
    ids = mx.array([[5, 6, 7, 8, 9]])
    assert np.array_equal(np.array(model(ids)), np.array(text(ids)))
    del hf


def test_mlx_layout_loads_as_saved(tmp_path):
    # our own parameters (norms as 1 + weight, conv weights (C, taps, 1)), saved as MLX conversions
    # store them, load back unchanged: no second shift
    save_tiny_hf_model(tmp_path / "hf", "qwen3_next", tie_word_embeddings=False)
    ours = load_model(tmp_path / "hf", read_config(tmp_path / "hf"))
    folder = tmp_path / "mlx"
    folder.mkdir()
    mx.save_safetensors(str(folder / "model.safetensors"), ours.checkpoint_parameters())
    (folder / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    copy_tokenizer(folder)
    again, _ = metalgen.load(str(folder))
    ids = mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    assert np.array_equal(np.array(again(ids)), np.array(ours(ids)))


# --- fused projections --------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["tiny-qwen3.5", "tiny-qwen3-next", "tiny-qwen3.5-4bit", "tiny-qwen3-next-8bit"])
def test_fused_projections_compute_what_the_parts_did(shape):
    # each layer's projections of one input become one layer; the logits stay those of the parts
    config = dummy_config(shape)
    model = build_model(config)
    if "quantization" in config:
        quantize_like_mlx_lm(model, config)
    model.load_weights(list(random_weight_dict(model, seed=3, dtype=mx.float32).items()), strict=True)
    names = {k for k, _ in tree_flatten(model.parameters())}
    # quantized: one token (MLX's quantized GEMV; its GEMM does not build on every CUDA image)
    ids = mx.array([[3]]) if "quantization" in config else mx.array([[3, 1, 4, 1, 5, 9, 2, 6]])
    with mlx_jit_gap():
        before = np.array(model(ids))
    model.fuse_projections()
    lin = next(y for y in model.model.layers if "linear_attn" in y)
    att = next(y for y in model.model.layers if "self_attn" in y)
    assert "in_proj" in lin.linear_attn and "in_proj_qkv" not in lin.linear_attn and "in_proj_ba" not in lin.linear_attn
    assert "qkv_proj" in att.self_attn and "q_proj" not in att.self_attn
    if shape.startswith("tiny-qwen3.5"):  # dense MLPs (Qwen3-Next's are sparse)
        assert "gate_up_proj" in lin.mlp and "gate_proj" not in lin.mlp
    if "quantization" in config:
        assert type(lin.linear_attn.in_proj).__name__ == "QuantizedLinear"
    assert rel_err(np.array(model(ids)), before) < 1e-5
    # the checkpoint's names and shapes come back, as an MLX conversion stores them
    flat = model.checkpoint_parameters()
    assert set(flat) == names
    fresh = build_model(config)
    if "quantization" in config:
        quantize_like_mlx_lm(fresh, config)
    assert all(flat[k].shape == v.shape for k, v in tree_flatten(fresh.parameters()))


def test_parts_that_differ_stay_apart():
    a, b = Linear(64, 8, bias=False), Linear(64, 8, bias=True)
    assert fuse_linears([a, b]) is None
    q4, q8 = a.to_quantized(group_size=64, bits=4), Linear(64, 8, bias=False).to_quantized(group_size=64, bits=8)
    assert fuse_linears([q4, q8]) is None
    assert fuse_linears([q4, a]) is None
    fused = fuse_linears([a, Linear(64, 4, bias=False)])
    assert fused.weight.shape == (12, 64)


def test_norms_take_one_plus_weight_from_hugging_face(tmp_path):
    hf = save_tiny_hf_model(tmp_path, "qwen3_5")
    ours = load_model(tmp_path, read_config(tmp_path))
    theirs = hf.model.layers[3].self_attn.q_norm.weight.detach().numpy()
    assert np.allclose(np.array(ours.model.layers[3].self_attn.q_norm.weight), 1.0 + theirs)
    gated = hf.model.layers[0].linear_attn.norm.weight.detach().numpy()
    assert np.allclose(np.array(ours.model.layers[0].linear_attn.norm.weight), gated)  # not shifted


# --- dummy shapes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["tiny-qwen3.5", "tiny-qwen3-next", "tiny-qwen3.5-moe", "tiny-qwen3.5-moe-4bit"])
def test_dummy_shapes(shape):
    model, tok = metalgen.load(f"dummy:{shape}")
    assert isinstance(metalgen.generate(model, tok, "Hello", max_tokens=3), str)
    if shape.endswith("4bit"):
        gate = model.model.layers[0].mlp.gate
        assert gate.bits == 8 and model.model.layers[0].mlp.shared_expert_gate.bits == 8


def test_big_dummy_shapes_have_published_sizes():
    from metalgen.dummy import dummy_config
    from metalgen.models import build_model

    def params(shape):
        model = build_model(dummy_config(shape))
        return sum(v.size for _, v in tree_flatten(model.parameters())), model.spec

    n, spec = params("qwen3.5-35b-a3b")
    assert 34e9 < n < 36.5e9 and spec.hybrid.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    n, spec = params("qwen3.5-122b-a10b")
    assert 121e9 < n < 123e9 and (spec.moe.num_experts, spec.moe.top_k) == (256, 8)
    assert spec.moe.shared_intermediate_size == 1024 and spec.hybrid.linear.num_value_heads == 64
    n, spec = params("qwen3-next-80b-a3b")
    assert 79e9 < n < 82e9 and spec.moe.num_experts == 512 and spec.hybrid.rotary_dims == 64
    # the dense sizes count their text decoder only (the published totals add the vision tower)
    for shape, low, high, value_heads in (("qwen3.5-0.8b", 0.7e9, 0.8e9, 16), ("qwen3.5-2b", 1.8e9, 2.0e9, 16),
                                          ("qwen3.5-4b", 4.0e9, 4.4e9, 32), ("qwen3.5-9b", 8.8e9, 9.1e9, 32),
                                          ("qwen3.5-27b", 26.5e9, 27.5e9, 48)):
        n, spec = params(shape)
        assert low < n < high and spec.moe is None and spec.hybrid.linear.num_value_heads == value_heads, shape


# --- bad checkpoints ----------------------------------------------------------------------------------


@pytest.fixture()
def hybrid_folder(tmp_path):
    save_tiny_hf_model(tmp_path, "qwen3_5")
    copy_tokenizer(tmp_path)
    return tmp_path


def _edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def test_layer_types_of_the_wrong_length(hybrid_folder):
    _edit_config(hybrid_folder, layer_types=["linear_attention", "full_attention"])
    with pytest.raises(MetalgenError, match="layer_types has 2 entries for num_hidden_layers 4"):
        metalgen.load(str(hybrid_folder))


def test_linear_heads_that_do_not_divide(hybrid_folder):
    _edit_config(hybrid_folder, linear_num_value_heads=3)
    with pytest.raises(MetalgenError, match="linear_num_value_heads 3 must be a positive multiple of "
                                            "linear_num_key_heads 2"):
        metalgen.load(str(hybrid_folder))


def test_missing_recurrent_tensor_is_one_line_on_the_cli(hybrid_folder, capsys):
    from metalgen.cli import main

    path = hybrid_folder / "model.safetensors"
    w = dict(mx.load(str(path)))
    w.pop("model.layers.1.linear_attn.A_log")
    path.unlink()
    mx.save_safetensors(str(path), w)
    assert main(["generate", "--model", str(hybrid_folder), "--prompt", "hi", "--max-tokens", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("metalgen: error: tensor 'model.layers.1.linear_attn.A_log' is missing")
