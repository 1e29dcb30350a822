"""metalgen.load: folders, shards, quantized checkpoints, dtypes, dummy models, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mlx.core as mx

import metalgen
from metalgen import MetalgenError

from checkpoints import TINY_QWEN3, write_checkpoint
from conftest import mlx_jit_gap

IDS = mx.array([[1, 100, 2000, 30000, 151000]])


def same_logits(a, b, tol=1e-5):
    x, y = np.array(a(IDS).astype(mx.float32)), np.array(b(IDS).astype(mx.float32))
    return np.abs(x - y).max() <= tol * np.abs(y).max()


def test_single_file_checkpoint_loads_with_tokenizer_and_eos(tmp_path):
    ref = write_checkpoint(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    model, tok = metalgen.load(str(tmp_path))
    assert same_logits(model, ref)
    assert {151645, 151643} <= set(tok.eos_token_ids)


def test_sharded_checkpoint_with_index(tmp_path):
    ref = write_checkpoint(tmp_path, shards=3)
    model, _ = metalgen.load(str(tmp_path))
    assert same_logits(model, ref)


@pytest.mark.parametrize("bits", [4, 8])
def test_mlx_quantized_checkpoint(tmp_path, bits):
    ref = write_checkpoint(tmp_path, quantize={"group_size": 32, "bits": bits})
    model, _ = metalgen.load(str(tmp_path))
    assert type(model.layers[0].mlp.up_proj).__name__ == "QuantizedLinear"
    assert same_logits(model, ref)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("bits", [0, 4, 8])
def test_a_tied_head_goes_through_the_kernel_library(tmp_path, monkeypatch, bits, rows):
    """The LM head tied to a (quantized) embedding is the kernel library's product, as an untied lm_head is (MLX's
    own as_linear would bypass it: on the CPU its quantized product of bf16 activations is 8x slower and
    3.5-6% off), and equals the float64 product of the (dequantized) embedding. One row is what generation takes
    (the last position), five a whole prompt's logits."""
    import kernels_metal as K

    write_checkpoint(tmp_path, quantize={"group_size": 64, "bits": bits} if bits else None)
    model, _ = metalgen.load(str(tmp_path), dtype="bfloat16")
    emb = model.model.embed_tokens
    assert "lm_head" not in model and ("scales" in emb) == bool(bits)
    # hidden states of a norm's scale, not the model's own: its layers' quantized prompt products would need MLX's
    # qmm_sm90 kernel, which the GPU image cannot build (conftest.mlx_jit_gap), and only the head is tested here
    h = mx.random.normal((1, rows, model.spec.hidden_size)).astype(mx.bfloat16)
    name = "quantized_linear" if bits else "linear"
    seen, real = [], getattr(K, name)
    monkeypatch.setattr(K, name, lambda x, w, *a, **kw: seen.append(w.shape) or real(x, w, *a, **kw))
    y = model.logits(h)
    assert seen == [emb["weight"].shape] and y.dtype == mx.bfloat16 and y.shape == (1, rows, 151936)
    table = mx.dequantize(emb["weight"], emb["scales"], emb["biases"], group_size=64, bits=bits) if bits else emb.weight
    f64 = lambda a: np.array(a.astype(mx.float32), dtype=np.float64)  # noqa: E731
    truth = f64(h) @ f64(table).T
    # at this hidden size a GPU backend's dispatch rule gives both quantized products to MLX's own kernel (the GEMV
    # takes 1-4 rows of larger matrices), which the H200 image cannot build
    with mlx_jit_gap():
        got = f64(y)
    # a GPU backend's products of bf16 activations are held to test_linear_and_quantized's bound there (the dense
    # cases passed it on the H200, 2026-11-27; the quantized ones skipped there, above)
    assert np.abs(got - truth).max() < (1e-2 if K.backend() == "cpu" else 5e-2) * np.abs(truth).max()


def test_dtype_cast(tmp_path):
    write_checkpoint(tmp_path)
    model, _ = metalgen.load(str(tmp_path), dtype="bfloat16")
    assert model.layers[0].mlp.up_proj.weight.dtype == mx.bfloat16
    with pytest.raises(MetalgenError, match="unknown dtype"):
        metalgen.load(str(tmp_path), dtype="int3")


def test_untied_qwen2_with_biases(tmp_path):
    config = dict(TINY_QWEN3, model_type="qwen2", tie_word_embeddings=False)
    ref = write_checkpoint(tmp_path, config)
    model, _ = metalgen.load(str(tmp_path))
    assert "bias" in model.layers[0].self_attn.q_proj and "lm_head" in model
    assert same_logits(model, ref)


def test_dummy_models_have_real_shapes():
    model, tok = metalgen.load("dummy:tiny-qwen3")
    assert model.layers[0].self_attn.head_dim == 32
    assert tok.encode("hello") == [14990]
    from metalgen.dummy import SHAPES

    assert SHAPES["qwen3-0.6b"]["num_hidden_layers"] == 28
    with pytest.raises(MetalgenError, match="unknown dummy shape"):
        metalgen.load("dummy:nope")


def test_dummy_quantized_names_give_bits_and_group_size():
    from metalgen.dummy import dummy_config, parse_quantized

    assert parse_quantized("qwen3-8b-4bit") == ("qwen3-8b", 4, 64)
    assert parse_quantized("qwen3-8b-8bit-g32") == ("qwen3-8b", 8, 32)
    assert parse_quantized("qwen3-8b") == ("qwen3-8b", 0, 0)
    assert dummy_config("tiny-qwen3-4bit-g128")["quantization"] == {"group_size": 128, "bits": 4}
    for bad in ("qwen3-8b-4bit-g16", "qwen3-8b-g32", "qwen3-8b-3bit"):
        with pytest.raises(MetalgenError, match="unknown dummy shape"):
            parse_quantized(bad)


# --- bad input: one clear line each -------------------------------------------------------


def error_of(path, **kw) -> str:
    with pytest.raises(MetalgenError) as info:
        metalgen.load(str(path), **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_folder(tmp_path):
    assert "no model folder" in error_of(tmp_path / "nope")


def test_missing_config(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "config.json").unlink()
    assert "config.json not found" in error_of(tmp_path)


def test_malformed_config(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    assert "not valid JSON" in error_of(tmp_path)


def test_unknown_model_type(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY_QWEN3, model_type="llama9")))
    msg = error_of(tmp_path)
    assert "unknown model_type 'llama9'" in msg and "qwen3" in msg


def test_sliding_window_is_refused(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY_QWEN3, use_sliding_window=True)))
    assert "sliding-window" in error_of(tmp_path)


def test_missing_required_config_field(tmp_path):
    write_checkpoint(tmp_path)
    cfg = dict(TINY_QWEN3)
    del cfg["hidden_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert "hidden_size" in error_of(tmp_path)


def test_no_weights(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    assert "no *.safetensors" in error_of(tmp_path)


def test_missing_tensor_names_it(tmp_path):
    write_checkpoint(tmp_path)
    w = mx.load(str(tmp_path / "model.safetensors"))
    del w["model.layers.1.mlp.up_proj.weight"]
    mx.save_safetensors(str(tmp_path / "model.safetensors"), w)
    assert "'model.layers.1.mlp.up_proj.weight' is missing" in error_of(tmp_path)


def test_unexpected_tensor_names_it_and_its_file(tmp_path):
    write_checkpoint(tmp_path)
    w = mx.load(str(tmp_path / "model.safetensors"))
    w["model.layers.0.extra.weight"] = mx.zeros((2,))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), w)
    msg = error_of(tmp_path)
    assert "unexpected tensor 'model.layers.0.extra.weight'" in msg and "model.safetensors" in msg


def test_wrong_shape(tmp_path):
    write_checkpoint(tmp_path)
    w = mx.load(str(tmp_path / "model.safetensors"))
    w["model.norm.weight"] = mx.ones((63,))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), w)
    msg = error_of(tmp_path)
    assert "'model.norm.weight'" in msg and "(63,)" in msg and "(64,)" in msg


def test_corrupt_shard(tmp_path):
    write_checkpoint(tmp_path, shards=2)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    msg = error_of(tmp_path)
    assert "could not read weights file" in msg and shard.name in msg


def test_index_names_missing_shard(tmp_path):
    write_checkpoint(tmp_path, shards=2)
    (tmp_path / "model-00001-of-00002.safetensors").unlink()
    assert "model-00001-of-00002.safetensors listed in" in error_of(tmp_path)


def test_missing_tokenizer(tmp_path):
    write_checkpoint(tmp_path, tokenizer=False)
    assert "tokenizer" in error_of(tmp_path)


def test_hub_id_offline_and_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    msg = error_of("someone/not-cached-model")
    assert "not in the local Hugging Face cache" in msg and "HF_HUB_OFFLINE" in msg
