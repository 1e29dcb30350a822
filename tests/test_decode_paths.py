"""The stacked-weight decode paths against the plain path (CPU: reference; GPU: fused, megakernel)."""

import gc
import re
import shutil

import mlx.core as mx
import pytest

import kernels_metal as K
from kernels_metal import source as S
from metalgen.api import load
from metalgen.decode import decoder_for, stacked_weights
from metalgen.decode.check import step_errors, step_errors_vs_float32
from metalgen.errors import MetalgenError
from metalgen.generate import generate_step

from conftest import mlx_jit_gap


@pytest.fixture(scope="module")
def qwen3():
    return load("dummy:tiny-qwen3")[0]


def test_reference_matches_plain_logits(qwen3):
    errs = step_errors(qwen3, "reference", prompt_tokens=9, steps=12)
    assert max(errs) < 2e-2


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_fast_path_fed_the_samplers_token_draws_the_same(qwen3, temperature):
    # generate_step feeds a fast path the token a DeviceSampler keeps in its state (DeviceSampler.last_token) rather
    # than the token it returns; a sampler behind a plain function is fed the returned token. The same seed must
    # draw the same tokens either way (a stale or wrong word would change them: the dummy model's tokens vary). On
    # CUDA the megakernel, elsewhere the stacked reference
    from metalgen.sampling import make_sampler

    mode = "megakernel" if K.backend() == "cuda" else "reference"
    p = mx.array([3, 1, 4, 1, 5, 9, 2, 6], mx.int32)
    fed = [t for t, _ in generate_step(p, qwen3, max_tokens=24, decode=mode,
                                       sampler=make_sampler(temperature, seed=11))]
    inner = make_sampler(temperature, seed=11)
    returned = [t for t, _ in generate_step(p, qwen3, max_tokens=24, decode=mode, sampler=lambda x: inner(x))]
    assert fed == returned and len(set(fed)) > (3 if temperature else 0)


def test_reference_v2_matches_plain_logits(qwen3):
    # version 2's restructuring (split-K float32 partial sums, residual added after) on the CPU
    errs = step_errors(qwen3, "reference_v2", prompt_tokens=9, steps=12)
    assert max(errs) < 2e-2


def test_splitk_tasks_partition_every_row():
    from metalgen.decode.reference import splitk_tasks

    for n, k, nw in ((896, 4864, 2112), (896, 896, 2112), (1024, 2048, 2112), (2560, 9728, 2112), (64, 8, 16),
                     (4096, 12288, 1056)):
        tasks, slices = splitk_tasks(n, k, nw)
        assert slices[0][0] == 0 and slices[-1][1] == k
        assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))
        assert all(0 < k1 - k0 <= 1024 and k0 % 256 == 0 for k0, k1 in slices)  # <= 4 loads a lane
        assert tasks == n * len(slices)


def test_reference_same_tokens_as_plain(qwen3):
    p = mx.array([3, 1, 4, 1, 5, 9, 2, 6], mx.int32)
    a = [t for t, _ in generate_step(p, qwen3, max_tokens=12, decode="plain")]
    b = [t for t, _ in generate_step(p, qwen3, max_tokens=12, decode="reference")]
    assert a == b


@pytest.fixture(scope="module", params=["tiny-qwen3-moe", "tiny-qwen2-moe"])
def moe_model(request):
    return load(f"dummy:{request.param}", dtype="float32")[0]


def test_reference_matches_plain_on_moe(moe_model):
    # sparse layers (and a dense one, tiny-qwen3-moe's layer 1) on the stacks
    assert max(step_errors(moe_model, "reference", prompt_tokens=9, steps=12)) < 1e-5
    p = mx.array([3, 1, 4, 1, 5, 9, 2, 6], mx.int32)
    a = [t for t, _ in generate_step(p, moe_model, max_tokens=12, decode="plain")]
    b = [t for t, _ in generate_step(p, moe_model, max_tokens=12, decode="reference")]
    assert a == b


@pytest.mark.parametrize("shape", ["tiny-qwen3-4bit", "tiny-qwen3-moe-4bit", "tiny-qwen2-moe-8bit",
                                   "tiny-qwen3-4bit-g32", "tiny-qwen3-8bit-g128"])
def test_reference_matches_plain_on_quantized(shape):
    # MLX-quantized stacks (words, scales and biases stacked alike) through the same arithmetic as plain
    model = load(f"dummy:{shape}")[0]
    w = stacked_weights(model)
    assert w.quant is not None and w.wqkv.dtype == mx.uint32 and w.dtype == mx.bfloat16
    assert (w.quant.bits, w.quant.group_size) == (8 if "8bit" in shape else 4,
                                                  int(shape.split("-g")[-1]) if "-g" in shape else 64)
    if w.moe is not None:
        assert w.quant.gate_bits == 8  # mlx_lm.convert's routers (qwen3_moe), or all at 8 bits
        assert w.moe.wgx is model.model.expert_stacks().arrays["gate_proj.weight"]
    layer = model.model.layers[0].self_attn
    assert mx.array_equal(layer.k_proj.scales, w.quant.params["wqkv"][0][0, w.q_dim:w.q_dim + w.kv_dim])
    with mlx_jit_gap():  # the 8-bit prefill's qmm_sm90 kernel on the H200 image
        assert max(step_errors(model, "reference", prompt_tokens=9, steps=8)) < 1e-6
    p = mx.array([3, 1, 4, 1, 5, 9, 2, 6], mx.int32)
    assert ([t for t, _ in generate_step(p, model, max_tokens=8, decode="plain")]
            == [t for t, _ in generate_step(p, model, max_tokens=8, decode="reference")])


def test_quantization_the_kernels_cannot_read_is_refused():
    from metalgen.decode.stacked import quantization_of, unsupported_reason

    model = load("dummy:tiny-qwen3-4bit")[0]
    assert quantization_of(model) == (None, (4, 64), None)
    # one layer left dense among quantized ones
    import mlx.nn as nn

    dense_mlp = load("dummy:tiny-qwen3")[0].model.layers[1].mlp
    model.model.layers[1].mlp = dense_mlp
    assert "mixed quantization of the weights" in unsupported_reason(model)
    with pytest.raises(MetalgenError, match="mixed quantization"):
        decoder_for(model, "reference")
    del nn


def test_moe_stacks_are_the_models_weights(moe_model):
    w = stacked_weights(moe_model)
    m = w.moe
    spec = moe_model.spec
    assert m.sparse_layers == spec.moe.sparse_layers and m.ltab.shape == (spec.num_hidden_layers, 2)
    sparse = spec.moe.sparse_layers
    dense = [i for i in range(spec.num_hidden_layers) if i not in sparse]
    assert m.ltab.tolist() == [[1, sparse.index(i)] if i in sparse else [0, dense.index(i)]
                               for i in range(spec.num_hidden_layers)]
    assert m.wgx is moe_model.model.expert_stacks().arrays["gate_proj.weight"]  # no second copy
    for s, i in enumerate(sparse):
        blk = moe_model.model.layers[i].mlp
        assert mx.array_equal(blk.gate.weight, m.wr[s])
        assert mx.array_equal(blk.switch_mlp.down_proj.weight, m.wdx[s])
        if m.shared:
            assert mx.array_equal(blk.shared_expert.up_proj.weight, m.wsgu[s, 1])
            assert mx.array_equal(blk.shared_expert_gate.weight[0], m.wsg[s])
    assert w.wgu.shape[0] == max(1, len(dense)) or not dense


def test_stacking_rebinds_views(qwen3):
    w = stacked_weights(qwen3)
    layer = qwen3.model.layers[1]
    assert mx.array_equal(layer.mlp.up_proj.weight, w.wgu[1, 1])
    assert mx.array_equal(layer.self_attn.k_proj.weight, w.wqkv[1, w.q_dim:w.q_dim + w.kv_dim])
    assert w.wqkv.shape == (w.layers, w.qkv_dim, w.hidden)


def test_decoder_templates_name_the_model_sizes():
    # the kernel folds the model's sizes at compile time (HT, HQT, HKVT, IT): the decoder must pass
    # exactly the spec's template parameters, with the stacked weights' sizes (qwen3-0.6b's, as the
    # decoder reads them; no weights needed)
    from types import SimpleNamespace

    from metalgen.decode.gpu import MegakernelDecoder

    w = SimpleNamespace(dtype=mx.bfloat16, head_dim=128, hidden=1024, inter=3072, heads=16, kv_heads=8,
                        q_dim=2048, qkv_dim=4096, layers=28, qk_norm=True, has_bias=False, eps=1e-6, moe=None,
                        quant=None, hybrid=None)
    dec = MegakernelDecoder(w, blocks=8)
    names = [n for n, _ in dec.template]
    assert tuple(names) == S.DECODE_TEMPLATES and dec.kernel_name == "decode_megakernel"
    vals = dict(dec.template)
    assert (vals["HT"], vals["HQT"], vals["HKVT"], vals["IT"]) == (w.hidden, w.heads, w.kv_heads, w.inter)
    assert vals["SK"] >= max(w.hidden, w.q_dim, w.inter) and vals["D"] == w.head_dim
    text = S.body(S.CUDA_ONLY_SPECS["decode_megakernel"], "cuda")
    for n in ("HT", "HQT", "HKVT", "IT"):
        assert re.search(rf"constexpr int \w+ = {n};", text), n
    # an MoE decoder (Qwen3-30B-A3B's sizes) adds the experts' sizes and its own kernel; the shared
    # vector holds the chosen experts' activations
    w.hidden, w.inter, w.heads, w.kv_heads, w.q_dim, w.qkv_dim, w.layers = 2048, 6144, 32, 4, 4096, 5120, 48
    w.moe = SimpleNamespace(experts=128, top_k=8, inter=1536, shared=0, norm_topk=True)
    dec = MegakernelDecoder(w, blocks=8)
    assert tuple(n for n, _ in dec.template) == S.DECODE_MOE_TEMPLATES
    assert dec.kernel_name == "decode_megakernel_moe" and dec.steps == 6 * 48 + 1
    vals = dict(dec.template)
    assert (vals["EXT"], vals["KX"], vals["MIT"], vals["SIT"]) == (128, 8, 1536, 0)
    assert vals["SK"] >= 8 * 1536 and dec.scratch_size >= dec.moe_offset + 128 + 1 + 16
    # MLX-quantized weights: the quantized kernel, bits and group sizes as templates, each quantized
    # input's scales and biases in the spec's order
    params = {n: (mx.zeros((1,)) + i, mx.zeros((1,)) - i) for i, n in enumerate(S.QUANT_MOE_WEIGHTS)}
    w.quant = SimpleNamespace(bits=4, group_size=64, gate_bits=8, gate_group_size=64, params=params)
    dec = MegakernelDecoder(w, blocks=8)
    assert dec.kernel_name == "decode_megakernel_moe_q"
    assert tuple(n for n, _ in dec.template) == S.DECODE_MOE_TEMPLATES + S.QUANT_TEMPLATES
    assert [v for n, v in dec.template if n in S.QUANT_TEMPLATES] == [4, 64, 8, 64]
    spec = S.CUDA_ONLY_SPECS["decode_megakernel_moe_q"]
    assert len(spec.inputs) == len(S.DECODE_MOE_INPUTS) + len(dec.quant_inputs)
    assert [float(a[0]) for a in dec.quant_inputs] == [v for i in range(len(S.QUANT_MOE_WEIGHTS)) for v in (i, -i)]
    from metalgen.decode.gpu import FusedDecoder

    fused = FusedDecoder(w, blocks=8)  # the same quantized rows, a launch a phase (Metal's form)
    assert fused.kernel_name == "decode_layer_moe_q" and fused.template == dec.template
    assert len(S.SPECS["decode_layer_moe_q"].inputs) == len(spec.inputs)


def test_launch_scalars_stay_out_of_mlx_small_array_pool():
    # MLX's CUDA allocator serves arrays of 8 bytes or less from a pool of unified memory that the CPU's
    # token readback touches every step; an input every group reads there cost up to 65 us of layer 0's first
    # phase on the H200 (docs/decode.md, "Small arrays in unified memory"). The decoders' own per-launch arrays
    # are larger: the float parameters (eps and the attention scale, then padding), the dependency token and the
    # sync output
    from types import SimpleNamespace

    from metalgen.decode import gpu

    w = SimpleNamespace(dtype=mx.bfloat16, head_dim=64, hidden=896, inter=4864, heads=14, kv_heads=2, q_dim=896,
                        qkv_dim=1152, layers=24, qk_norm=False, has_bias=True, eps=1e-6, moe=None, quant=None,
                        hybrid=None)
    for cls in (gpu.MegakernelDecoder, gpu.FusedDecoder):
        dec = cls(w, blocks=8)
        assert dec.fparams.nbytes > 8 and dec.no_dep.nbytes > 8 and gpu.SYNC_WORDS * 4 > 8
        assert dec.fparams.tolist()[:2] == pytest.approx([w.eps, w.head_dim**-0.5])
        assert dec.no_dep.size == gpu.SYNC_WORDS


def test_modes_on_cpu(qwen3):
    import kernels_metal

    if kernels_metal.backend() != "cpu":
        pytest.skip("CPU-only expectations")
    assert decoder_for(qwen3, "auto") is None and decoder_for(qwen3, "plain") is None
    with pytest.raises(MetalgenError):
        decoder_for(qwen3, "megakernel")
    with pytest.raises(MetalgenError):
        decoder_for(qwen3, "bogus")


@pytest.mark.parametrize("version", [1, 2])
def test_megakernel_cuda_text(version):
    spec = S.CUDA_ONLY_SPECS["decode_megakernel" + ("_v2" if version == 2 else "")]
    text = S.header(spec, "cuda") + S.body(spec, "cuda")
    assert "mg_grid_barrier(bar)" in text and "#define MG_GRID 1" in text
    assert f"#define MG_DECODE_V {version}" in text
    # the last split group of a head to arrive merges its splits (version 1), counted by one acquire-release atomic
    # add rather than full fences around a relaxed one (docs/decode.md, "The split merges' count")
    assert "atom.acq_rel.gpu.global.add.u32" in text and "last_s[0] = mg_arrive_last_acq_rel(cnt" in text
    # the last group asks L2 for the next phases' small inputs (docs/decode.md, "Small inputs asked of L2")
    assert "prefetch.global.L2::evict_last" in text and "mg_prefetch_l2(norms + ((size_t)l * 2u + 1u)" in text
    for pat in (r"threadgroup", r"\bsimd_", r"metal::", r"const device"):
        assert not re.search(pat, text)


def test_v2_metal_text():
    spec = S.SPECS["decode_layer_v2"]
    text = S.metal_program(spec)
    assert "#define MG_DECODE_V 2" in text and "#define MG_GRID 0" in text and "mg_device_add_f32" in text


DECODE_NVCC = ["decode_megakernel", "decode_megakernel_v2", "decode_layer", "decode_layer_v2", "decode_megakernel_moe",
               "decode_layer_moe", "decode_megakernel_q", "decode_megakernel_moe_q", "decode_megakernel_hybrid",
               "decode_megakernel_hybrid_q", "decode_layer_hybrid", "decode_layer_q", "decode_layer_moe_q",
               "decode_layer_hybrid_q"]


def _decode_program(name: str, head_dim: int) -> str:
    spec = S.CUDA_ONLY_SPECS.get(name) or S.SPECS[name]
    return re.sub(r"constexpr int D = \d+;", f"constexpr int D = {head_dim};", S.cuda_program(spec))


@pytest.fixture(scope="module")
def decode_nvcc(tmp_path_factory):
    """Every decode kernel variant at head_dim 64 and 128 through nvcc, compiled concurrently once."""
    from nvcc_batch import nvcc_all

    programs = {f"{name}_{d}": _decode_program(name, d) for name in DECODE_NVCC for d in (64, 128)}
    return nvcc_all(programs, tmp_path_factory.mktemp("decode_nvcc"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc")
@pytest.mark.parametrize("name", DECODE_NVCC)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_megakernel_compiles_with_nvcc(decode_nvcc, name, head_dim):
    prog = _decode_program(name, head_dim)
    r = decode_nvcc[f"{name}_{head_dim}"]
    assert r.returncode == 0, r.stderr[:3000]
    # 2 groups of 256 threads per multiprocessor must fit (65536 registers), else the megakernel's
    # grid barrier deadlocks: its launch bounds (preludes/cuda_tail.h) hold it to 128; and nothing
    # spilled to local memory
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", r.stderr)]
    assert regs and max(regs) <= (128 if name.startswith("decode_megakernel") else 255), r.stderr[-2000:]
    assert "0 bytes spill stores" in r.stderr
    assert "__launch_bounds__(256, 2)" in prog
    assert ("#define MG_GRID 1" in prog) == name.startswith("decode_megakernel")
    assert ("#define MG_MOE 1" in prog) == ("_moe" in name or "_hybrid" in name)
    assert ("#define MG_HYBRID 1" in prog) == ("_hybrid" in name)
    assert ("#define MG_QUANT 1" in prog) == name.endswith("_q")


@pytest.mark.gpu
@pytest.mark.parametrize("shape,mode,grouped", [(s, m, False) for s in ("qwen2.5-0.5b", "qwen3-0.6b")
                                                for m in ("fused", "megakernel")] + [("qwen3-4b", "megakernel", False)]
                         + [(s, m, True) for s in ("qwen3-0.6b", "tiny-qwen2-gqa7") for m in ("fused", "megakernel")])
def test_gpu_paths_match_plain(shape, mode, grouped, monkeypatch):
    import kernels_metal

    import metalgen.decode.gpu as decode_gpu

    if mode == "megakernel" and kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    if grouped:  # attention items of 2 query heads (a long context's) from the first position on
        monkeypatch.setattr(decode_gpu, "GROUP_FROM", 1)
    model = load(f"dummy:{shape}")[0]
    vs_plain, fast32, plain32 = step_errors_vs_float32(model, mode, prompt_tokens=128, steps=256)
    print(f"{shape} {mode}: vs plain {max(vs_plain):.4f}; vs float32 {max(fast32):.4f} (plain bf16 {max(plain32):.4f})")
    # bf16 tolerance against plain (issue 5: relative 2e-2 at every step), or, where plain bf16's own
    # noise is that large, no further from the float32 truth than plain bf16 is (docs/decode.md)
    assert max(vs_plain) < 2e-2 or max(fast32) <= 1.25 * max(plain32)


def largest_gap_between(model, modes, prompt_tokens: int, steps: int, second=None, first=None) -> float:
    """The two decode paths `modes` from one seeded prompt (each prefilled on its own cache), fed the first
    path's greedy tokens: the largest absolute logit difference over `steps` steps. `second(model, step)`, if
    given, makes the second path's step function from the one its mode gave (another build of its kernel);
    `first` likewise for the first path."""
    import numpy as np

    from metalgen.cache import make_prompt_cache
    from metalgen.decode.path import make_step

    prompt = mx.array(np.random.default_rng(1).integers(0, 151936, prompt_tokens), mx.int32)
    fast = []
    for mode in modes:
        cache = make_prompt_cache(model, decode="plain")
        logits = model.logits(model.hidden(prompt[None], cache=cache)[:, -1, :])
        mx.eval(logits, [c.state for c in cache])
        fast.append(make_step(model, cache, prompt_tokens, 64, mode))
    if first is not None:
        fast[0] = first(model, fast[0])
    if second is not None:
        fast[1] = second(model, fast[1])
    tok = mx.argmax(logits, axis=-1).astype(mx.int32)
    worst = 0.0
    for _ in range(steps):
        a, b = fast[0](tok), fast[1](tok)
        worst = max(worst, float(mx.max(mx.abs(a - b)).item()))
        tok = mx.argmax(a, axis=-1).astype(mx.int32)
    return worst


def built_with(label: str, defines):
    """A `second` for largest_gap_between: the step's decoder again, its kernel a copy of the spec built with other
    #defines (kernels_metal.source.with_defines), on the same state."""
    from metalgen.decode.path import step_on

    def second(model, step):
        dec = step.decoder
        other = type(dec)(dec.w, dec.blocks, dec.version)
        other.kernel_name = S.with_defines(dec.kernel_name, label, defines)
        return step_on(model, other, step.state)
    return second


def test_gap_helper_sees_identical_paths():
    # the helper of the bitwise tests, on the CPU's reference path twice
    assert largest_gap_between(load("dummy:tiny-qwen3")[0], ("reference", "reference"), 20, 4) == 0.0


@pytest.mark.gpu
def test_megakernel_equals_fused_bitwise():
    # the megakernel merges a head's attention splits in phase 1 (the last split group to finish),
    # the fused path in phase 2 (every group): the same arithmetic, so the same bits
    import kernels_metal

    if kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    # positions 150..189: 3 splits a head
    model = load("dummy:qwen3-0.6b")[0]
    assert largest_gap_between(model, ("fused", "megakernel_v1"), 150, 40) == 0.0


@pytest.mark.gpu
def test_grouped_attention_megakernel_equals_fused_bitwise(monkeypatch):
    # items of 2 query heads (a long context's): the last split of a group merges both heads in phase 1
    import kernels_metal

    import metalgen.decode.gpu as decode_gpu

    if kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    monkeypatch.setattr(decode_gpu, "GROUP_FROM", 1)
    for shape in ("qwen3-0.6b", "tiny-qwen2-gqa7"):
        assert largest_gap_between(load(f"dummy:{shape}")[0], ("fused", "megakernel_v1"), 150, 40) == 0.0, shape
    # from 1056 positions a head has as many splits as the groups allow (33 on 132 multiprocessors): a lane of the
    # merge's quads then reads its splits in two round trips, joined online (preludes/decode.h, mg_merge_share)
    assert largest_gap_between(load("dummy:qwen3-0.6b")[0], ("fused", "megakernel_v1"), 1100, 8) == 0.0


def test_attention_group_rule():
    # one query head an item below GROUP_FROM positions, 2 (at most the group's) from it on
    from metalgen.decode.gpu import GROUP_FROM, attention_group

    assert attention_group(16, 8, GROUP_FROM - 1) == 1 and attention_group(16, 8, GROUP_FROM) == 2
    assert attention_group(14, 2, 16384) == 2 and attention_group(16, 16, 16384) == 1


NEAR_TIE = 0.03  # router gap (k-th minus (k+1)-th score) in standard deviations of the scores


@pytest.fixture()
def router_gaps(monkeypatch):
    """The smallest top-k gap of every single-token routing made during the decode steps of a
    decode.check run (the plain path's, its float32 twin's, a reference fast path's), in call order.
    Where a token's k-th and (k+1)-th router scores nearly tie, a path that rounds in other places
    than plain can choose the other expert, and that step's logits differ by a few percent. Measured
    on the CPU, 100-token prompt, 64 steps: the steps where the H200's fast paths were off had gaps
    of 0 (tiny-qwen3-moe, bf16) and 0.018, 0, 0.011, 0.023 (tiny-qwen3-moe-4bit); 5 and 12 of the 64
    steps have gaps under 0.03."""
    import kernels_metal
    import numpy as np

    from metalgen.decode import check

    gaps, route, make_step = [], kernels_metal.moe_route, check.make_step

    def spy(logits, top_k, norm_topk_prob):
        scores = np.sort(np.array(logits.astype(mx.float32)).reshape(-1, logits.shape[-1]), -1)
        if scores.shape[0] == 1:  # decode steps, not the prompt
            gaps.append(float((scores[0, -top_k] - scores[0, -top_k - 1]) / scores[0].std()))
        return route(logits, top_k, norm_topk_prob)

    def steps_from_here(*args, **kwargs):
        step = make_step(*args, **kwargs)
        gaps.clear()  # the path's self-check at load routes tokens too
        return step

    monkeypatch.setattr(kernels_metal, "moe_route", spy)
    monkeypatch.setattr(check, "make_step", steps_from_here)
    return gaps


def assert_close_except_near_ties(ok, gaps):
    """Every step `ok` but those whose routing (in any sparse layer, on any of the paths that ran)
    nearly tied; those must stay a minority, so that a wrong kernel cannot hide among them."""
    assert gaps and len(gaps) % len(ok) == 0, f"{len(gaps)} routings over {len(ok)} steps"
    per_step = len(gaps) // len(ok)
    tied = [min(gaps[i * per_step:(i + 1) * per_step]) < NEAR_TIE for i in range(len(ok))]
    off = [i for i, (good, tie) in enumerate(zip(ok, tied)) if not good and not tie]
    gaps_off = [round(min(gaps[i * per_step:(i + 1) * per_step]), 4) for i in off]
    assert not off and sum(tied) <= len(ok) // 4, \
        f"steps off: {off} (router gaps {gaps_off}); near ties at {sum(tied)} of {len(ok)} steps"


@pytest.mark.gpu
# tiny-qwen3-moe-4bit: dense layer 1 and two sparse layers, hidden 128 (two groups a row)
# the dense 4-bit rows take x in 16-bit fixed point (QFX, decode_layer.body): tiny-qwen3-h4096-4bit at H 4096,
# tiny-qwen2-gqa7-4bit at H 896 (a vector of 112 16-byte words: its last lane-group's fixing loop is partly idle)
@pytest.mark.parametrize("shape", ["tiny-qwen3-moe-4bit", "tiny-qwen2-moe-8bit", "qwen3-0.6b-4bit", "qwen3-0.6b-8bit",
                                   "qwen3-0.6b-4bit-g32", "qwen3-0.6b-4bit-g128", "qwen3-0.6b-8bit-g32",
                                   "tiny-qwen3-h4096-4bit", "tiny-qwen2-gqa7-4bit"])
def test_gpu_quantized_megakernel_matches_plain(shape, router_gaps):
    # the MLX-quantized weights read in registers: the megakernel against plain on the same weights
    import kernels_metal

    if kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    model = load(f"dummy:{shape}")[0]
    errs = step_errors(model, "megakernel", prompt_tokens=100, steps=64)
    print(f"{shape} megakernel (quantized): vs plain {' '.join(f'{e:.3f}' for e in errs)}")
    if model.spec.moe is None:
        if max(errs) >= 2e-2:
            # as the bf16 paths: then no further from float32 than plain's own bf16 is (wider rows round more:
            # tiny-qwen3-h4096-4bit's megakernel is 0.017-0.021 from plain, 0.015 from float32, and plain 0.022;
            # H200, 2026-11-27). MLX's float32 prefill fails at group size 128 on CUDA, so only where needed
            _, fast32, plain32 = step_errors_vs_float32(model, "megakernel", prompt_tokens=100, steps=64)
            print(f"  vs float32 {max(fast32):.4f}, plain vs float32 {max(plain32):.4f}")
            assert max(fast32) <= 1.25 * max(plain32)
    else:
        assert_close_except_near_ties([e < 2e-2 for e in errs], router_gaps)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["qwen3-0.6b-4bit", "qwen3-0.6b-8bit-g32", "tiny-qwen3-moe-4bit", "tiny-qwen3-next-4bit",
                                   "tiny-qwen3.5-8bit", "tiny-qwen3-h4096-4bit"])
def test_gpu_quantized_fused_equals_megakernel_bitwise(shape):
    # the fused path's quantized launches (Metal's form of the decode; run here on CUDA) and the megakernel
    # share the body: the same logits bit for bit, which ties the fused form to the megakernel's checks above
    import kernels_metal

    if kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    with mlx_jit_gap():  # the hybrid 4-bit prefill's qmm_sm90 kernel on the H200 image
        assert largest_gap_between(load(f"dummy:{shape}")[0], ("fused", "megakernel"), 150, 20) == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fused", "megakernel"])
def test_gpu_chunk_sums_keep_the_bits(mode):
    # at H 4096 the dense 4-bit float rows (x not in fixed point: MG_Q4_FIXED 0) read each chunk's sum of x, made
    # once a phase (QPS, decode_layer.body); the same kernel built without them (MG_CHUNK_SUMS 0), its rows adding
    # up x themselves, gives the same logits
    import kernels_metal

    if kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    model = load("dummy:tiny-qwen3-h4096-4bit")[0]
    first = built_with("float_rows", [("MG_Q4_FIXED", 0)])
    second = built_with("float_rows_no_chunk_sums", [("MG_Q4_FIXED", 0), ("MG_CHUNK_SUMS", 0)])
    assert largest_gap_between(model, (mode, mode), 150, 20, second=second, first=first) == 0.0


# fixed point against float rows on tiny-qwen3-h4096-4bit, 20 steps: 0.0625 (H200, 2026-11-27); unrelated logits of
# a wrong layout are ~1.4 apart in relative terms, far past this
FIXED_GAP = 0.25


@pytest.mark.gpu
def test_gpu_fixed_point_rows_near_float_rows():
    # the 4-bit rows dotted with x in 16-bit fixed point (integer pair dots, the default for dense 4-bit stacks)
    # against the same kernel with float rows (MG_Q4_FIXED 0): other roundings, so not the same bits, but as close as
    # two float summation orders are; a wrong fixed-point layout gives unrelated logits
    import kernels_metal

    if kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    model = load("dummy:tiny-qwen3-h4096-4bit")[0]
    second = built_with("float_rows", [("MG_Q4_FIXED", 0)])
    gap = largest_gap_between(model, ("megakernel", "megakernel"), 150, 20, second=second)
    print(f"fixed point against float rows: largest |logit difference| {gap:.4g}")
    assert 0.0 < gap < FIXED_GAP


@pytest.mark.gpu
@pytest.mark.parametrize("shape,prompt", [("tiny-qwen2-gqa7", 150), ("qwen3-0.6b", 150), ("qwen3-0.6b", 1500),
                                          ("tiny-qwen3-h4096-4bit", 150)])
def test_gpu_attention_count_keeps_the_bits(shape, prompt):
    # the dense megakernel's o_proj phase waits for a count of the attention merges rather than a grid barrier
    # (MG_OP_FUSE, decode_layer.body): the same logits as the build with the barrier, where the attention items end
    # before the o_proj rows' groups (150 positions) and where they reach them (1500: a group with both an item and a
    # row goes on to o_proj only after its items, so nothing waits on a group that waits)
    import kernels_metal

    if kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    model = load(f"dummy:{shape}")[0]
    second = built_with("attention_barrier", [("MG_OP_FUSE", 0)])
    assert largest_gap_between(model, ("megakernel", "megakernel"), prompt, 12, second=second) == 0.0


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["tiny-qwen3-moe", "tiny-qwen2-moe"])
@pytest.mark.parametrize("mode", ["fused", "megakernel"])
def test_gpu_moe_paths_match_plain(shape, mode, router_gaps):
    # sparse layers (and tiny-qwen3-moe's dense layer 1) on the fast paths, bf16: each step within 2e-2
    # of plain, or no further from float32 than plain bf16 is
    import kernels_metal

    if mode == "megakernel" and kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    model = load(f"dummy:{shape}")[0]
    vs_plain, fast32, plain32 = step_errors_vs_float32(model, mode, prompt_tokens=100, steps=64)
    print(f"{shape} {mode}: vs plain {max(vs_plain):.4f}; vs float32 {max(fast32):.4f} (plain bf16 {max(plain32):.4f})")
    ok = [v < 2e-2 or f <= 1.25 * p for v, f, p in zip(vs_plain, fast32, plain32)]
    assert_close_except_near_ties(ok, router_gaps)


def test_near_ties_are_excused_and_nothing_else(router_gaps):
    # the rule itself, on the CPU's reference path with a planted wrong step
    model = load("dummy:tiny-qwen3-moe")[0]
    errs = step_errors(model, "reference", prompt_tokens=20, steps=24)
    assert len(router_gaps) % 24 == 0 and len(router_gaps) > 0
    ok = [e < 2e-2 for e in errs]
    assert_close_except_near_ties(ok, router_gaps)
    per_step = len(router_gaps) // 24
    clear = next(i for i in range(24) if min(router_gaps[i * per_step:(i + 1) * per_step]) >= NEAR_TIE)
    ok[clear] = False
    with pytest.raises(AssertionError, match=f"steps off: \\[{clear}\\] "):
        assert_close_except_near_ties(ok, router_gaps)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["tiny-qwen3-moe", "tiny-qwen2-moe"])
def test_moe_megakernel_equals_fused_bitwise(shape):
    import kernels_metal

    if kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")
    assert largest_gap_between(load(f"dummy:{shape}")[0], ("fused", "megakernel"), 150, 20) == 0.0


def test_self_check_feeds_tokens_or_embeddings(qwen3):
    # the GPU paths' start-up check, run here with the reference on both sides: a token-fed stack
    # and an embedding-only stack (the TTS code predictor), each from its own empty state
    import metalgen.tts
    from metalgen.decode import ReferenceDecoder, self_check, stack_weights

    w = stack_weights(qwen3, rebind=False)
    assert self_check(ReferenceDecoder(w), w, head=qwen3.logits) == 0.0
    cp = metalgen.tts.load("dummy:qwen3-tts-tiny").model.talker.code_predictor.model
    w = stack_weights(cp, rebind=False)
    assert w.vocab == 0 and self_check(ReferenceDecoder(w), w, steps=4) == 0.0


def test_step_errors_vs_float32_sees_the_noise_floor(qwen3):
    vs_plain, fast32, plain32 = step_errors_vs_float32(qwen3, "reference", prompt_tokens=9, steps=6)
    assert len(vs_plain) == len(fast32) == len(plain32) == 6
    assert max(vs_plain) < 1e-6  # the reference path rounds where plain does
    assert 1e-4 < max(plain32) < 5e-2  # bf16 against float32: a real, small difference
    assert max(abs(a - b) for a, b in zip(fast32, plain32)) < 1e-6


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


@pytest.mark.parametrize("shape", ["tiny-qwen3", "tiny-qwen3-4bit", "tiny-qwen2-moe"])
def test_auto_takes_the_megakernel_by_rule(shape, monkeypatch, capsys):
    # "auto" on CUDA builds the megakernel for any stack (no list of shapes: these tiny shapes were never
    # measured), and a build that fails falls back to plain with its reason under --verbose
    import metalgen.decode.path as P

    built = []

    def build(model, mode, version=1):
        built.append(mode)
        raise ValueError("the decode kernels need head_dim in {64, 128, 192, 256}")

    model, _ = load(f"dummy:{shape}")
    monkeypatch.setattr(P, "_build", build)
    monkeypatch.setattr(P.K, "backend", lambda: "cuda")
    K.set_verbose(True)
    try:
        assert P.decoder_for(model, "auto") is None
    finally:
        K.set_verbose(False)
    assert built == ["megakernel"]
    assert "head_dim in {64, 128, 192, 256}" in capsys.readouterr().err
    monkeypatch.setattr(P.K, "backend", lambda: "metal")  # no default fast path there yet
    assert P.decoder_for(model, "auto") is None and built == ["megakernel"]


def test_stacked_cache_copies_into_one_array():
    # the per-layer caches' positions land in one (layers, kv heads, capacity, head_dim) array, the rest zero,
    # and the copy holds no second copy of the cache on the way: a stack and a concatenation peaked at about
    # three times the output (6.91 GB against 4.47 at 16384 positions on qwen3-0.6b)
    from metalgen.cache import KVCache
    from metalgen.decode.stacked import stack_weights, stacked_cache

    model = load("dummy:tiny-qwen3")[0]
    w = stack_weights(model)
    length, capacity = 50000, 65536  # a 34 MB output: far above the allocator's small pools
    rng = [mx.random.normal((2, 1, w.kv_heads, length, w.head_dim)).astype(w.dtype) for _ in range(w.kv_layers)]
    cache = [KVCache() for _ in range(w.kv_layers)]
    for c, (k, v) in zip(cache, rng):
        c.update(k, v)
    mx.eval([(c.keys, c.values) for c in cache])
    small = mx.array([1], mx.int32) + 1  # a few bytes kept alive first (see the stacking's memory test below)
    mx.eval(small)
    # on CUDA a buffer is freed when the work that used it completes, so an earlier test's arrays could be freed
    # inside the measurement (the H200 once saw the peak 360 bytes under `before`): let every free land first
    gc.collect()
    mx.synchronize()
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    state = stacked_cache(w, cache, length, capacity)
    grew = mx.get_peak_memory() - before
    size = state.kc.nbytes + state.vc.nbytes
    assert state.kc.shape == (w.kv_layers, w.kv_heads, capacity, w.head_dim) and state.pos == length
    assert size <= grew < 1.3 * size  # the output, and not a second copy of it
    for i, (k, v) in enumerate(rng):
        assert mx.array_equal(state.kc[i, :, :length], k[0]) and mx.array_equal(state.vc[i, :, :length], v[0])
    assert not mx.any(state.kc[:, :, length:]).item() and not mx.any(state.vc[:, :, length:]).item()


# ------------------------------------------------------------------ hybrid Gated DeltaNet stacks


HYBRID_TINY = ["tiny-qwen3.5", "tiny-qwen3-next", "tiny-qwen3.5-moe"]


@pytest.mark.parametrize("shape", HYBRID_TINY + ["tiny-qwen3-next-4bit"])
def test_hybrid_stack_rebinds_views_and_tables(shape):
    # stacking a hybrid model for the megakernel changes no logit (its parameters become views of the
    # stacks), the layer table names each layer's kinds and ordinals, and the decode state takes the
    # attention layers' KV and the Gated DeltaNet layers' conv taps and recurrent states
    from metalgen.decode.gpu import MegakernelDecoder
    from metalgen.decode.stacked import stack_weights, stacked_cache

    model = load(f"dummy:{shape}")[0]
    ids = mx.array([[11, 7, 5, 3, 2, 1]])
    cache = model.make_cache()
    with mlx_jit_gap():  # a 4-bit prefill's qmm_sm90 kernel on the H200 image
        before = model(ids, cache=cache)
        mx.eval(before)
    w = stack_weights(model, rebind=True)
    assert mx.array_equal(model(ids, cache=model.make_cache()), before)
    spec = model.spec
    hs = w.hybrid
    linear = [i for i in range(spec.num_hidden_layers) if spec.hybrid.is_linear(i)]
    assert hs.linear_layers == tuple(linear) and len(hs.attn_layers) == spec.num_hidden_layers - len(linear)
    table = w.moe.ltab.tolist()
    for i, (sparse, ff, lin, mix) in enumerate(table):
        assert lin == (i in linear) and mix == (linear.index(i) if lin else hs.attn_layers.index(i))
        assert sparse == (spec.moe is not None and spec.moe.is_sparse(i))
    ls = spec.hybrid.linear
    assert hs.rows == 2 * ls.key_dim + 2 * ls.value_dim + 2 * ls.num_value_heads
    assert w.wqkv.shape[:2] == (len(hs.attn_layers), 2 * w.q_dim + 2 * w.kv_dim)
    assert (w.quant is not None) == shape.endswith("bit") and hs.packed == (spec.hybrid.linear.layout == "qkvz")
    state = stacked_cache(w, cache, 6, 256)
    assert state.kc.shape == (len(hs.attn_layers), w.kv_heads, 256, w.head_dim)
    lin_caches = [c for c in cache if c.__class__.__name__ == "LinearAttnCache"]
    assert mx.array_equal(state.rec[1], lin_caches[1].recurrent[0])
    assert mx.array_equal(state.conv[2], lin_caches[2].conv_state[0])
    dec = MegakernelDecoder(w)  # the launch's shapes are made without a GPU
    assert dec.kernel_name == "decode_megakernel_hybrid" + ("_q" if w.quant is not None else "")
    assert dict(dec.template)["QKVZ"] == hs.packed and dec.steps == 6 * spec.num_hidden_layers + 1


def test_hybrid_stack_keeps_one_copy_of_the_weights():
    # after stacking, the model reads views of the stacks: the memory in use grows only by the small
    # arrays the kernel takes besides (conv weights, gates, the layer table; 16 KB here). A dense
    # feed-forward's gate/up reshaped from a (2, I, H) view was a copy the model kept (0.5 MB here,
    # 3 GB on qwen3.5-4b)
    from metalgen.decode.stacked import stack_weights

    model = load("dummy:tiny-qwen3.5")[0]
    mx.eval(model.parameters())
    # an array of a few bytes kept alive first. Once in a whole-suite run on the H200 (2026-11-26) the
    # stacking grew active memory by 1.6 MB, not in a rerun; the likely cause (not verified there): MLX's
    # CUDA allocator serves arrays of a few bytes from a pool whose first block a process allocates on
    # first use, and the stacking's small arrays would count it
    small = mx.array([1], mx.int32) + 1
    mx.eval(small)
    before = mx.get_active_memory()
    w = stack_weights(model, rebind=True)
    assert mx.get_active_memory() - before < 64 * 1024
    assert w.wgu.shape == (4, 2 * 256, 128)


def test_hybrid_stack_rejects_what_the_kernel_cannot_turn():
    from metalgen.decode.stacked import unsupported_reason

    model = load("dummy:tiny-qwen3.5")[0]
    assert unsupported_reason(model) is None
    hy = model.model.spec.hybrid
    import dataclasses

    model.model.spec = dataclasses.replace(model.model.spec, hybrid=dataclasses.replace(hy, rotary_dims=24))
    assert "rotary dims" in unsupported_reason(model)
    linear_only = dataclasses.replace(hy, layer_types=("linear_attention",) * len(hy.layer_types))
    model.model.spec = dataclasses.replace(model.model.spec, hybrid=linear_only)
    assert "without attention layers" in unsupported_reason(model)


def _hybrid_gpu(mode):
    import kernels_metal

    if mode.startswith("megakernel") and kernels_metal.backend() != "cuda":
        pytest.skip("CUDA only")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", HYBRID_TINY + ["qwen3.5-0.8b"])
@pytest.mark.parametrize("mode", ["fused", "megakernel"])
def test_gpu_hybrid_paths_match_plain(shape, mode, router_gaps):
    # Gated DeltaNet and gated attention layers on the fast paths, bf16, teacher-forced against plain:
    # each step within 2e-2 of plain or no further from float32 than plain bf16 is (routing near-ties
    # excused in the sparse stacks, as for the MoE decoders)
    _hybrid_gpu(mode)
    model = load(f"dummy:{shape}")[0]
    vs_plain, fast32, plain32 = step_errors_vs_float32(model, mode, prompt_tokens=100, steps=48)
    print(f"{shape} {mode}: vs plain {max(vs_plain):.4f}; vs float32 {max(fast32):.4f} (plain bf16 {max(plain32):.4f})")
    ok = [v < 2e-2 or f <= 1.25 * p for v, f, p in zip(vs_plain, fast32, plain32)]
    # (four sparse layers of 8 experts route nearly tied somewhere at most steps: the near-tie excuse is
    # asked for only where a step is off)
    if model.spec.moe is None or all(ok):
        assert all(ok)
    else:
        assert_close_except_near_ties(ok, router_gaps)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", ["tiny-qwen3-next-4bit", "tiny-qwen3.5-8bit"])
def test_gpu_hybrid_quantized_megakernel_matches_plain(shape, router_gaps):
    # a one-token prompt: MLX's own 4-bit GEMM of a longer prefill cannot JIT on the 2026-11 H200 image
    # (conftest.mlx_jit_gap); its GEMV can
    _hybrid_gpu("megakernel")
    model = load(f"dummy:{shape}")[0]
    with mlx_jit_gap():
        errs = step_errors(model, "megakernel", prompt_tokens=1, steps=48)
    print(f"{shape} megakernel (quantized): vs plain {' '.join(f'{e:.3f}' for e in errs)}")
    if model.spec.moe is None or max(errs) < 2e-2:
        assert max(errs) < 2e-2
    else:
        assert_close_except_near_ties([e < 2e-2 for e in errs], router_gaps)


@pytest.mark.gpu
def test_gpu_hybrid_megakernel_equals_fused_bitwise():
    # one body, two ways to run it: the same bits (the conv taps and states advance alike)
    _hybrid_gpu("megakernel")
    assert largest_gap_between(load("dummy:tiny-qwen3.5")[0], ("fused", "megakernel"), 90, 20) == 0.0


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-qwen3.5", "tiny-qwen2-moe"])  # (qwen2-moe: q/k/v biases)
def test_stacking_on_a_worker_leaves_no_lazy_parameter(name):
    # a server's worker stacks on its own thread-local stream; a parameter it left lazy (a norm's, a bias's or
    # a q/k norm's view) could only be evaluated on that thread, and another engine sharing the model
    # (Qwen3-Omni's text and speech) failed to evaluate the parameters on a GPU
    import threading

    from metalgen.decode.stacked import stack_weights

    model = load(f"dummy:{name}")[0]
    mx.eval(model.parameters())

    def work():
        with mx.stream(mx.new_thread_local_stream(mx.default_device())):
            stack_weights(model, rebind=True)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    mx.eval(model.parameters())  # raised "There is no Stream(..) in current thread"
