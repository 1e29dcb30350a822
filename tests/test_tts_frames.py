"""metalgen.tts.frames: the frame loop on each decode path. On the CPU the stacked "reference"
path (the algorithm the CUDA megakernel runs, in plain MLX ops) must give the plain path's logits
and codes; on a GPU the megakernel path is held to the same check at bf16 tolerance."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import kernels_metal as K
import metalgen.tts
from metalgen.decode import ReferenceDecoder, empty_state, stack_weights
from metalgen.tts.frames import FrameGenerator

TEXT = "Hello there, this is a test."
# fp32 matmuls run on TF32 on the CUDA backend (about 1e-3 relative, docs/architecture.md), where
# a sampled or greedy code can then flip; codes are compared exactly on the CPU only.
EXACT = K.backend() == "cpu"
FP32_TOL = 1e-4 if EXACT else 3e-3


@pytest.fixture(scope="module")
def tiny32():
    return metalgen.tts.load("dummy:qwen3-tts-tiny", dtype="float32")


def run(tts, decode, frames=12, seed=5, greedy=False, record=True):
    prompt, _ = tts.prepare(TEXT, speaker="vivian", language="english")
    over = dict(max_frames=frames, min_frames=frames)
    if greedy:
        over.update(temperature=0.0, sub_temperature=0.0)
    gen = FrameGenerator(tts.model, prompt, tts.sampling(**over), seed=seed, record_logits=record,
                         decode=decode)
    codes = np.stack(list(gen.frames()))
    return gen, codes


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_reference_path_matches_plain(tiny32):
    plain, codes_p = run(tiny32, "plain")
    ref, codes_r = run(tiny32, "reference")
    assert plain.paths == {"talker": "plain", "code_predictor": "plain"}
    assert ref.paths == {"talker": "reference", "code_predictor": "reference"}
    assert codes_p.shape == codes_r.shape == (12, 16)
    if not EXACT:
        return
    np.testing.assert_array_equal(codes_r, codes_p)  # sampled, same seed
    for a, b in zip(ref.talker_logits, plain.talker_logits):
        assert rel(a, b) < FP32_TOL
    for a, b in zip(ref.cp_logits, plain.cp_logits):
        assert a.shape == b.shape == (15, b.shape[-1])
        assert rel(a, b) < FP32_TOL


def test_reference_path_greedy_codes(tiny32):
    _, a = run(tiny32, "plain", frames=16, greedy=True, record=False)
    _, b = run(tiny32, "reference", frames=16, greedy=True, record=False)
    assert a.shape == b.shape == (16, 16)
    if EXACT:
        np.testing.assert_array_equal(a, b)


def test_reference_path_with_projection():
    # the 1.7B layout: predictor hidden != talker hidden, so small_to_mtp_projection feeds it
    tts = metalgen.tts.load("dummy:qwen3-tts-tiny", dtype="float32")
    cp = tts.model.talker.code_predictor
    assert "small_to_mtp_projection" in cp
    plain, a = run(tts, "plain", frames=6)
    ref, b = run(tts, "reference", frames=6)
    if EXACT:
        np.testing.assert_array_equal(a, b)
        assert rel(ref.cp_logits[-1], plain.cp_logits[-1]) < FP32_TOL
    assert rel(ref.cp_logits[0], plain.cp_logits[0]) < FP32_TOL


def test_auto_is_plain_on_the_cpu(tiny32):
    if K.backend() != "cpu":
        pytest.skip("CPU rule")
    gen, _ = run(tiny32, "auto", frames=2, record=False)
    assert gen.paths == {"talker": "plain", "code_predictor": "plain"}


def test_stack_without_token_embedding_takes_embeddings_only(tiny32):
    stack = tiny32.model.talker.code_predictor.model
    w = stack_weights(stack, rebind=False)
    assert w.vocab == 0 and w.embed.shape == (1, w.hidden)
    st = empty_state(w, 4)
    with pytest.raises(ValueError, match="no token embedding"):
        ReferenceDecoder(w).step(st, mx.array([1], mx.int32))
    # the same input at the same position gives the same output after a reset
    x = mx.random.normal((w.hidden,), key=mx.random.key(1))
    a = ReferenceDecoder(w).step(st, embedding=x)
    ReferenceDecoder(w).step(st, embedding=x * 2)
    st.reset()
    b = ReferenceDecoder(w).step(st, embedding=x)
    assert st.pos == 1 and mx.allclose(a, b).item()


def forced(tts, decode, steps=12, seed=3):
    """Teacher forcing: the same talker inputs and code-predictor inputs through one decode path.
    Returns (talker logits per step, code-predictor logits per step), float32 numpy. The inputs
    are bf16-representable, so a bf16 model and its float32 copy see the same values."""
    prompt, _ = tts.prepare(TEXT, speaker="vivian", language="english")
    gen = FrameGenerator(tts.model, prompt, tts.sampling(), seed=0, decode=decode)
    H = tts.model.talker.args.hidden_size
    xs = (0.1 * mx.random.normal((steps + 2, 1, 1, H), key=mx.random.key(seed))).astype(mx.bfloat16)
    last, logits = gen.prefill()
    xs = xs.astype(last.dtype)
    talker = [logits]
    for i in range(steps):
        _, logits = gen.talk(xs[i])
        talker.append(logits)
    cp = []
    for frame in range(2):  # two frames: the second one reuses the reset cache
        cache = gen.cp_begin()
        cp.append(gen.cp_step(mx.concatenate([last, xs[frame]], axis=1), 0, cache))
        for g in range(1, gen.groups - 1):
            cp.append(gen.cp_step(xs[(g + frame) % steps], g, cache))
    f32 = lambda v: np.array(v.astype(mx.float32))[0]  # noqa: E731
    return [f32(v) for v in talker], [f32(v) for v in cp]


def test_reference_path_teacher_forced(tiny32):
    pt, pc = forced(tiny32, "plain")
    rt, rc = forced(tiny32, "reference")
    assert len(pt) == 13 and len(pc) == 30
    assert max(rel(a, b) for a, b in zip(rt, pt)) < FP32_TOL
    assert max(rel(a, b) for a, b in zip(rc, pc)) < FP32_TOL


@pytest.mark.skipif(K.backend() != "cuda", reason="the megakernel runs on the CUDA backend")
@pytest.mark.parametrize("shape", ["qwen3-tts-0.6b", "qwen3-tts-1.7b"])
def test_megakernel_path_teacher_forced_on_gpu(shape):
    from mlx.utils import tree_map

    tts = metalgen.tts.load(f"dummy:{shape}")  # bf16
    pt, pc = forced(tts, "plain", steps=32)
    mt, mc = forced(tts, "megakernel", steps=32)
    gen = FrameGenerator(tts.model, tts.prepare("Hi.", speaker="vivian")[0], tts.sampling(), decode="megakernel")
    assert gen.paths == {"talker": "megakernel", "code_predictor": "megakernel"}
    # the truth: the same (bf16-rounded) weights in float32 on the plain path
    tts.model.update(tree_map(lambda a: a.astype(mx.float32), tts.model.parameters()))
    tt, tc = forced(tts, "plain", steps=32)
    worst = {}
    for name, fast, plain, truth in (("talker", mt, pt, tt), ("predictor", mc, pc, tc)):
        worst[name] = (max(rel(a, b) for a, b in zip(fast, plain)),
                       max(rel(a, b) for a, b in zip(fast, truth)),
                       max(rel(a, b) for a, b in zip(plain, truth)))
        print(f"{shape} {name}: megakernel vs plain bf16 {worst[name][0]:.4f}; vs float32: megakernel "
              f"{worst[name][1]:.4f}, plain bf16 {worst[name][2]:.4f}")
    for name, (vs_plain, fast_err, plain_err) in worst.items():
        # bf16 tolerance (issue 5: relative 2e-2), or no further from float32 than plain bf16 is
        assert vs_plain < 2e-2 or fast_err <= 1.25 * plain_err, name
