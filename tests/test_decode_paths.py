"""The stacked-weight decode paths against the plain path (CPU: reference; GPU: fused, megakernel)."""

import re
import shutil
import subprocess

import mlx.core as mx
import pytest

from kernels_metal import source as S
from metalgen.api import load
from metalgen.decode import decoder_for, stacked_weights
from metalgen.decode.check import step_errors
from metalgen.errors import MetalgenError
from metalgen.generate import generate_step


@pytest.fixture(scope="module")
def qwen3():
    return load("dummy:tiny-qwen3")[0]


def test_reference_matches_plain_logits(qwen3):
    errs = step_errors(qwen3, "reference", prompt_tokens=9, steps=12)
    assert max(errs) < 2e-2


def test_reference_same_tokens_as_plain(qwen3):
    p = mx.array([3, 1, 4, 1, 5, 9, 2, 6], mx.int32)
    a = [t for t, _ in generate_step(p, qwen3, max_tokens=12, decode="plain")]
    b = [t for t, _ in generate_step(p, qwen3, max_tokens=12, decode="reference")]
    assert a == b


def test_stacking_rebinds_views(qwen3):
    w = stacked_weights(qwen3)
    layer = qwen3.model.layers[1]
    assert mx.array_equal(layer.mlp.up_proj.weight, w.wgu[1, 1])
    assert mx.array_equal(layer.self_attn.k_proj.weight, w.wqkv[1, w.q_dim:w.q_dim + w.kv_dim])
    assert w.wqkv.shape == (w.layers, w.qkv_dim, w.hidden)


def test_modes_on_cpu(qwen3):
    import kernels_metal

    if kernels_metal.backend() != "cpu":
        pytest.skip("CPU-only expectations")
    assert decoder_for(qwen3, "auto") is None and decoder_for(qwen3, "plain") is None
    with pytest.raises(MetalgenError):
        decoder_for(qwen3, "megakernel")
    with pytest.raises(MetalgenError):
        decoder_for(qwen3, "bogus")


def test_megakernel_cuda_text():
    spec = S.CUDA_ONLY_SPECS["decode_megakernel"]
    text = S.header(spec, "cuda") + S.body(spec, "cuda")
    assert "mg_grid_barrier(bar)" in text and "#define MG_GRID 1" in text
    for pat in (r"threadgroup", r"\bsimd_", r"metal::", r"const device"):
        assert not re.search(pat, text)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
def test_megakernel_compiles_with_nvcc(tmp_path):
    for spec in (S.CUDA_ONLY_SPECS["decode_megakernel"], S.SPECS["decode_layer"]):
        src = tmp_path / f"{spec.name}.cu"
        src.write_text("#include <cstdint>\n#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n"
                       "#include <cooperative_groups.h>\n" + S.cuda_program(spec))
        r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90", "-c", str(src), "-o",
                            str(tmp_path / "k.o")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[:3000]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["qwen2.5-0.5b", "qwen3-0.6b"])
@pytest.mark.parametrize("mode", ["fused", "megakernel"])
def test_gpu_paths_match_plain(shape, mode):
    import kernels_metal

    if mode == "megakernel" and kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    model = load(f"dummy:{shape}")[0]
    errs = step_errors(model, mode, prompt_tokens=128, steps=256)
    assert max(errs) < 2e-2


def test_flip_barrier_arithmetic():
    # mg_grid_barrier (cuda.h): the word starts at 0 and every complete barrier adds exactly 2^31,
    # so it alternates 0 / 2^31 and is never reset. Block 0 adds 2^31 - (n - 1), the others 1: in
    # any arrival order the top bit flips only once all n have arrived.
    for start in (0, 0x80000000):
        for n in (1, 2, 3, 132, 264):
            for first in {0, n // 2, n - 1}:
                w = start
                olds = []
                for b in list(range(first, n)) + list(range(first)):
                    olds.append(w)
                    w = (w + (0x80000000 - (n - 1) if b == 0 else 1)) & 0xFFFFFFFF
                    if len(olds) < n:  # not everyone has arrived: nobody may pass yet
                        assert all(((w ^ o) & 0x80000000) == 0 for o in olds)
                assert all(((w ^ o) & 0x80000000) != 0 for o in olds)
                assert w == (start ^ 0x80000000)


def test_auto_lists_only_checked_shapes():
    from metalgen.decode.path import AUTO_GPU, auto_shape_key

    assert "metal" not in AUTO_GPU
    for shape in ("qwen2.5-0.5b", "qwen3-0.6b"):
        assert auto_shape_key(load(f"dummy:{shape}")[0]) in AUTO_GPU["cuda"]
