"""Shared fixtures: tiny random checkpoints in Hugging Face layout, the shipped tokenizer."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

# float32 is float32 in these tests on every backend: MLX's CUDA backend otherwise runs float32 matmuls
# on TF32 tensor cores (10-bit mantissa inputs), and on tiny random checkpoints that rounding grows
# through the layers to 1e-1 of the logits and flips MoE routing (H200, 2026-11-24:
# benchmarks/results/hybrid_h200_2026-11-24.txt). Set before MLX is imported, which reads it.
os.environ.setdefault("MLX_ENABLE_TF32", "0")

ASSET_TOKENIZER = Path(__file__).resolve().parents[1] / "metalgen" / "assets" / "qwen3-tokenizer"


def pytest_collection_modifyitems(config, items):
    import kernels_metal

    if kernels_metal.backend() != "cpu":
        return
    skip = pytest.mark.skip(reason="needs a GPU backend (Metal or CUDA)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ours():
    """The shipped Qwen3 tokenizer, loaded once for the whole test session (it is 11 MB)."""
    from tokenizer import Tokenizer

    return Tokenizer.from_pretrained(ASSET_TOKENIZER)


def copy_tokenizer(folder: Path) -> None:
    """Put the real Qwen tokenizer files into a checkpoint folder."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ASSET_TOKENIZER / name, folder / name)


@contextlib.contextmanager
def mlx_jit_gap():
    """Skip, not fail, where MLX's own CUDA JIT cannot build one of its kernels on this machine: on
    the 2026-11-23 H200 image its 4-bit `qmm_sm90_*` kernels include `crt/mma.h`, which the CUDA
    wheel there lacks. Only that message is turned into a skip; anything else still fails."""
    try:
        yield
    except RuntimeError as err:
        if "crt/mma.h" in str(err):
            pytest.skip(f"MLX's CUDA JIT cannot build its kernel here: {str(err).splitlines()[0][:100]}")
        raise


def check_layer_by_layer_equals_one_graph(model) -> None:
    """Prompt chunks evaluate a layer at a time (generate.prefill): the same outputs and caches as one
    graph, over a prompt and a continuation."""
    import mlx.core as mx
    import numpy as np

    from metalgen.cache import make_prompt_cache

    ids = mx.array(np.random.default_rng(4).integers(0, 512, (1, 24)))
    runs = []
    for layer_by_layer in (False, True):
        cache = make_prompt_cache(model, decode="plain")
        first = model.hidden(ids, cache=cache, layer_by_layer=layer_by_layer)
        more = model.hidden(ids[:, :5], cache=cache, layer_by_layer=layer_by_layer)
        runs.append([first, more] + [a for c in cache for a in c.state])
    assert len(runs[1]) > 2
    for a, b in zip(*runs):
        assert np.array_equal(np.array(a), np.array(b))
