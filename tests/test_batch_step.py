"""metalgen.batch_step: the batch's decode step with traced layer halves (and, for heads of 64 dims, the norms,
RoPE and cache write in one kernels_metal.qk_rope_store launch) gives the hidden states of the model's own
layers over the same paged cache, at batch sizes above and below the traced threshold, while rows leave
(tiny float32 models on the CPU)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import kernels_metal as K
from metalgen.batch_step import ROW_BUCKET, BatchStep, _fused_rope
from metalgen.models.layers import QuantizedLinear
from metalgen.paged_cache import PagedBatchCache

from checkpoints import BATCH_CONFIGS, BATCH_CONFIGS_HD64, HYBRID_BATCH_CONFIGS, prefill_group, tiny_model

# heads of 16 or 32 dims: RoPE and the cache write as the layers do them; of 64: one qk_rope_store launch;
# hybrid stacks (fused: None): Gated DeltaNet and gated attention layers, each split around its cache
CONFIGS = {**{k: (c, False) for k, c in BATCH_CONFIGS.items()}, **{k + "-hd64": (c, True) for k, c in BATCH_CONFIGS_HD64.items()},
           **{k: (c, None) for k, c in HYBRID_BATCH_CONFIGS.items()}}


def prefilled(model, prompts):
    cache = PagedBatchCache.for_model(model, block_size=16)
    cache.join(prefill_group(model, prompts)[0], list(range(len(prompts))))
    return cache


@pytest.mark.parametrize("kind", sorted(CONFIGS) + ["qwen3-hd64-4bit"])
def test_traced_step_equals_the_layers_as_they_are(kind):
    """B rows past the traced threshold, then fewer: the step's hidden states are the layers' own. A dense
    stack's step reads one q/k/v and one gate/up product a layer, over views of the stacked weights (also
    4-bit), and adds each residual with the norm after it."""
    quantized = kind.endswith("-4bit")
    config, fused = CONFIGS[kind.removesuffix("-4bit")]
    model = tiny_model(config)
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    if fused is not None:
        assert all(_fused_rope(layer.self_attn) == fused for layer in model.model.layers)
    rng = np.random.default_rng(7)
    B = K.GEMV_MAX_ROWS + 3  # traced
    prompts = [rng.integers(0, 512, int(n)).tolist() for n in rng.integers(2, 20, B)]
    traced, plain = prefilled(model, prompts), prefilled(model, prompts)
    step = BatchStep(model, fuse=True)  # (by default on CUDA only)
    dense = config.get("num_experts") is None and kind not in HYBRID_BATCH_CONFIGS
    assert (step.fused is not None) == dense
    if quantized:
        assert isinstance(step.fused[0][0], QuantizedLinear)
    assert step.halves[0] is not None
    rows = list(range(B))
    for s in range(5):
        if s == 3:  # rows leave: below the threshold the step runs the layers as they are
            rows = rows[: K.GEMV_MAX_ROWS - 1]
            traced.keep(list(range(len(rows))))
            plain.keep(list(range(len(rows))))
        tokens = mx.array(rng.integers(0, 512, len(rows)), mx.int32)
        # the traced step's rows padded as the batch runs them (7 rows run as 8)
        traced.begin_step(step.rows(len(rows)))
        plain.begin_step()
        assert traced.positions.shape[0] == (len(rows) if s >= 3 else ROW_BUCKET)
        got = np.array(step.hidden(tokens, traced))
        want = np.array(model.hidden(tokens[:, None], cache=plain.layers))
        assert got.shape == (len(rows), 1, model.spec.hidden_size)
        assert float(np.abs(got - want).max()) <= 1e-5 * float(np.abs(want).max()), (kind, s)
    for b in range(len(rows)):  # the same positions written in each row's blocks (padding wrote elsewhere)
        n = traced.lengths[b]
        for x, y in zip(traced.row_slicer(b)(0, n), plain.row_slicer(b)(0, n)):
            assert np.allclose(np.array(x), np.array(y), atol=1e-5)
    for a, b in zip(traced.states, plain.states):  # the same states left
        assert np.allclose(np.array(a.recurrent), np.array(b.recurrent), atol=1e-5)


def test_the_single_products_are_for_cuda_by_default(monkeypatch):
    # elsewhere stacking the weights would hold a second copy of the largest ones while it runs
    model = tiny_model(BATCH_CONFIGS["qwen3"])
    monkeypatch.setattr(K, "backend", lambda: "cpu")  # (any backend but CUDA: this test runs on the GPU too)
    assert BatchStep(model).fused is None and BatchStep(model, fuse=False).fused is None
    monkeypatch.setattr(K, "backend", lambda: "cuda")
    assert BatchStep(model).fused is not None
