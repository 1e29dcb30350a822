"""Every kernel is generated for both GPU backends from one body; each backend's text uses only
its own vocabulary; every Metal variant compiles as C++ against tests/metal_stub.h in the exact
signature mx.fast.metal_kernel generates."""

import os
import re
import shutil
import subprocess

import pytest

from kernels_metal import source as S
from nvcc_batch import NVCC, nvcc_all

HERE = os.path.dirname(os.path.abspath(__file__))
SMALL = {"eps": 1, "params": 4, "scale": 1, "fparams": 4, "iparams": 2, "state": 2}

CUDA_ONLY = [r"__global__", r"__shfl", r"__syncthreads", r"\bthreadIdx\b", r"\bblockIdx\b", r"\bblockDim\b",
             r"__nv_bfloat16", r"__half", r"__device__", r"__shared__", r"atomicAdd", r"cuda", r"CUDA",
             r"__forceinline__", r"cooperative_groups"]
METAL_ONLY = [r"threadgroup", r"\bsimd_", r"thread_position_in_grid", r"thread_index_in_simdgroup",
              r"metal::", r"device const", r"const device", r"\bas_type\b", r"\bbfloat16_t\b", r"atomic_uint",
              r"\[\[kernel\]\]", r"\bMetal\b", r"\bmetal\b"]


def test_every_kernel_has_both_variants():
    assert set(S.KERNELS) == set(S.SPECS)
    for name in S.KERNELS:
        spec = S.SPECS[name]
        for be in S.BACKENDS:
            h, b = S.header(spec, be), S.body(spec, be)
            assert "mg_" in b and len(h) > 500
        assert S.metal_program(spec) and S.cuda_program(spec)
        # one body for both: the two sources differ only by their entry prologue
        mb, cb = S.body(spec, "metal"), S.body(spec, "cuda")
        assert mb.endswith(S._read(f"bodies/{spec.body}.body")) and cb.endswith(S._read(f"bodies/{spec.body}.body"))


@pytest.mark.parametrize("name", S.KERNELS)
def test_no_cross_backend_identifiers(name):
    spec = S.SPECS[name]
    metal = S.header(spec, "metal") + S.body(spec, "metal")
    cuda = S.header(spec, "cuda") + S.body(spec, "cuda")
    for pat in CUDA_ONLY:
        assert not re.search(pat, metal), f"{pat} in the Metal text of {name}"
    for pat in METAL_ONLY:
        assert not re.search(pat, cuda), f"{pat} in the CUDA text of {name}"


def test_prelude_is_the_text_the_kernels_paste():
    # the probes' header (benchmarks/*_probe.py): the CUDA prelude as the generated kernels carry it, without
    # its "#pragma once", and a prelude that does not exist is an error, not an empty header
    text = S.prelude("cuda.h")
    assert "mg_grid_barrier" in text and "#pragma once" not in text
    assert text in S.header(S.CUDA_ONLY_SPECS["decode_megakernel"], "cuda")
    with pytest.raises(FileNotFoundError):
        S.prelude("no_such.h")


def test_bodies_use_only_the_shared_vocabulary():
    folder = os.path.join(os.path.dirname(S.__file__), "bodies")
    for f in os.listdir(folder):
        text = open(os.path.join(folder, f)).read() + S._read("preludes/common.h")
        for pat in CUDA_ONLY + METAL_ONLY:
            assert not re.search(pat, text), f"{pat} in {f} / common.h"


def test_template_arguments_are_not_preprocessor_conditions():
    # a template argument is a C++ constant, not a macro: `#if QKN` would always see 0 and drop its branch
    # with no error on either backend (the GPU check caught one)
    for name in S.KERNELS:
        spec = S.SPECS[name]
        body = S._read(f"bodies/{spec.body}.body")
        for t in spec.templates:
            assert not re.search(rf"^\s*#\s*(el)?if\b.*\b{t}\b", body, re.M), f"#if on template {t} in {spec.body}"


def test_metal_signature_matches_mlx():
    spec = S.SPECS["add_rms_norm"]
    prog = S.metal_program(spec, SMALL)
    assert "template <typename T, typename W, int D>\n[[kernel]] void custom_kernel_add_rms_norm_bf16(" in prog
    assert "  const device bfloat16_t* x [[buffer(0)]],\n" in prog
    assert "  const constant float* eps [[buffer(3)]],\n" in prog
    assert "  device bfloat16_t* h [[buffer(5)]],\n" in prog
    assert "uint3 thread_position_in_threadgroup [[thread_position_in_threadgroup]]" in prog
    assert "uint thread_index_in_simdgroup [[thread_index_in_simdgroup]]" in prog
    assert prog.rstrip().endswith("custom_kernel_add_rms_norm_bf16<bfloat16_t, bfloat16_t, 1024>;")
    cu = S.cuda_program(spec)
    assert "__global__ void custom_kernel_add_rms_norm_bf16(\n    const __nv_bfloat16* x," in cu
    assert "  using T = __nv_bfloat16;\n" in cu and "  constexpr int D = 1024;\n" in cu


GXX = shutil.which("g++") or shutil.which("clang++")


def _compile(text, tmp_path, name, flags=("-fsyntax-only",)):
    src = tmp_path / f"{name}.cpp"
    src.write_text('#include "metal_stub.h"\n' + text)
    return subprocess.run([GXX, "-std=c++17", *flags, "-Wno-attributes", "-Werror=return-type", "-I", HERE,
                           str(src)], capture_output=True, text=True)


@pytest.mark.skipif(GXX is None, reason="no C++ compiler")
def test_metal_variants_compile(tmp_path):
    errors = []
    for name in S.KERNELS:
        r = _compile(S.metal_program(S.SPECS[name], SMALL), tmp_path, name)
        if r.returncode:
            errors.append(f"{name}:\n{r.stderr[:3000]}")
    assert not errors, "\n".join(errors)


@pytest.mark.skipif(GXX is None, reason="no C++ compiler")
def test_stub_compile_catches_typos(tmp_path):
    prog = S.metal_program(S.SPECS["rms_norm"], SMALL)
    bad = prog.replace("mg_block_sum(ss, red", "mg_block_summ(ss, red", 1)
    assert bad != prog
    assert _compile(bad, tmp_path, "typo").returncode != 0
    leak = prog.replace("MG_BARRIER();", "__syncthreads();", 1)
    assert _compile(leak, tmp_path, "leak").returncode != 0


# the decode layer kernels have their own nvcc test (tests/test_decode_paths.py)
NVCC_KERNELS = [k for k in S.KERNELS if not k.startswith("decode_layer")]


@pytest.fixture(scope="module")
def nvcc_results(tmp_path_factory):
    """Every kernel's CUDA program through nvcc, compiled concurrently once for the module."""
    return nvcc_all({name: S.cuda_program(S.SPECS[name]) for name in NVCC_KERNELS}, tmp_path_factory.mktemp("nvcc"))


@pytest.mark.skipif(NVCC is None, reason="no nvcc")
@pytest.mark.parametrize("name", NVCC_KERNELS)
def test_cuda_variants_compile_with_nvcc(nvcc_results, name):
    r = nvcc_results[name]
    assert r.returncode == 0, r.stderr[:3000]
    assert "0 bytes spill stores" in r.stderr, r.stderr[-2000:]


METAL_GROUP_BYTES = 32 * 1024  # the threadgroup memory a Metal group may have


@pytest.mark.skipif(GXX is None, reason="no C++ compiler")
@pytest.mark.parametrize("name", [k for k in S.KERNELS if k.startswith("decode_layer")])
def test_metal_decode_group_memory_fits(tmp_path, name):
    """The Metal decode kernels keep their shared arrays within the 32 KB a Metal group may have at their example
    sizes (models up to qwen3-4b's hidden and intermediate sizes). Built as C++ against the stub, where threadgroup
    arrays are the function's locals, the kernel's stack (g++ -fstack-usage) bounds them from above: the CUDA side's
    32 KB of attention slots (MG_HAS_ASYNC_COPY) turned on in the Metal prelude takes the five that would use them
    past it."""
    r = _compile(S.metal_program(S.SPECS[name], SMALL), tmp_path, name,
                 ("-O1", "-c", "-fstack-usage", "-o", str(tmp_path / f"{name}.o")))
    if r.returncode and "stack-usage" in r.stderr:
        pytest.skip("this C++ compiler has no -fstack-usage")
    assert r.returncode == 0, r.stderr[:3000]
    usage = [int(line.split("\t")[1]) for line in (tmp_path / f"{name}.su").read_text().splitlines()
             if "custom_kernel_" + name in line]
    assert usage and 0 < max(usage) <= METAL_GROUP_BYTES, usage


def test_a_build_with_other_defines_sits_beside_its_spec():
    # with_defines: the copy replaces the define it names and keeps the others; the spec it came from is untouched
    base = S.CUDA_ONLY_SPECS["decode_megakernel_q"]
    name = S.with_defines("decode_megakernel_q", "test_no_sums", [("MG_CHUNK_SUMS", 0), ("MG_GRID", 1)])
    try:
        assert name == "decode_megakernel_q__test_no_sums" and name in S.CUDA_ONLY_SPECS
        copy = dict(S.CUDA_ONLY_SPECS[name].defines)
        assert copy["MG_CHUNK_SUMS"] == 0 and copy["MG_QUANT"] == dict(base.defines)["MG_QUANT"]
        assert [k for k, _ in S.CUDA_ONLY_SPECS[name].defines].count("MG_GRID") == 1
        assert "#define MG_CHUNK_SUMS 0" in S.header(S.CUDA_ONLY_SPECS[name], "cuda")
        assert "MG_CHUNK_SUMS" not in dict(base.defines) and S.CUDA_ONLY_SPECS["decode_megakernel_q"] is base
        fused = S.with_defines("decode_layer_q", "test_no_sums", [("MG_CHUNK_SUMS", 0)])
        assert fused in S.SPECS and dict(S.SPECS[fused].defines)["MG_GRID"] == 0
    finally:
        S.CUDA_ONLY_SPECS.pop("decode_megakernel_q__test_no_sums", None)
        S.SPECS.pop("decode_layer_q__test_no_sums", None)
