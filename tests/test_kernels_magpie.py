"""Magpie's local-transformer draw chain (kernels_metal.magpie_lt_draws, bodies/magpie_lt.body): its reference
equals the model's own LT loop (Model.local_start / local_step / local_embed, CFG, the mask, the sampler at
successive counters), greedy and sampled, with and without CFG and an in-projection; the kernel's sources."""

import copy

import mlx.core as mx
import numpy as np
import pytest

import kernels_metal as K
from kernels_metal import reference as ref
from kernels_metal import source as S
from metalgen.magpie import dummy
from metalgen.magpie.lt_kernel import pack_lt
from metalgen.models.magpie.model import MagpieArgs, Model


def _model(lt_hidden=None, seed=0):
    """magpie-tiny in float32 with every LT parameter random (norm scales and biases too, so a
    mistake in either shows), optionally with an LT of another width (then with its in-projection)."""
    cfg = copy.deepcopy(dummy.SHAPES["magpie-tiny"]["config"])
    if lt_hidden:
        cfg["local_transformer_hidden_dim"] = lt_hidden
    args = MagpieArgs.from_config(cfg, shapes=dummy.tensor_shapes("magpie-tiny"))
    model = Model(args)
    rng = np.random.default_rng(seed)
    from mlx.utils import tree_flatten, tree_unflatten

    new = []
    for name, p in tree_flatten(model.parameters()):
        if not mx.issubdtype(p.dtype, mx.floating):
            new.append((name, p))
            continue
        v = rng.standard_normal(p.shape).astype(np.float32)
        scale = 0.1 if "norm" in name else (0.5 if "embedding" in name else 0.2)
        v = 1.0 + scale * v if "norm" in name else scale * v
        new.append((name, mx.array(v)))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())
    return model


def _model_loop(model, h, bad, cfg_scale, temperature, top_k, state):
    """StepGraph.draw's eager loop (frames.eager_draws) with the reference sampler at successive counters."""
    from metalgen.magpie.frames import eager_draws

    st = [state]

    def sample(logits):
        code, _, st[0] = ref.sample(logits, temperature, top_k, 1.0, 0.0, st[0])
        return code

    return eager_draws(model, h, bad, cfg_scale, sample), st[0]


def _bad(V, rng):
    # forbid a random tenth of the ids (as the frame loop forbids specials and, early, EOS)
    return mx.array(np.where(rng.random(V) < 0.1, -np.inf, 0.0).astype(np.float32))


@pytest.mark.parametrize("lt_hidden", [None, 48])
def test_reference_equals_the_model_loop(lt_hidden):
    model = _model(lt_hidden)
    packed = pack_lt(model)
    w = packed.weights
    assert (w.in_w is not None) == bool(lt_hidden)
    rng = np.random.default_rng(1)
    V = model.args.num_tokens_per_codebook
    d = model.args.decoder.d_model
    seen = set()
    for trial, (rows, temperature, top_k) in enumerate([(2, 0.0, 80), (1, 0.0, 80), (2, 0.8, 80), (1, 1.0, 0),
                                                        (2, 0.7, 5), (2, 0.0, 80)]):
        h = mx.array(rng.standard_normal((rows, d)).astype(np.float32))
        bad = _bad(V, rng)
        state = K.make_sample_state(1000 + trial)
        want, want_state = _model_loop(model, h, bad, 2.5, temperature, top_k, state)
        got, got_state = ref.magpie_lt_draws(h, w, bad, 2.5, temperature, top_k, state)
        np.testing.assert_array_equal(np.array(got), np.array(want))
        np.testing.assert_array_equal(np.array(got_state), np.array(want_state))
        assert int(got_state[1]) == packed.n
        assert not np.isinf(np.array(bad)[np.array(got)]).any()  # forbidden ids never drawn
        seen.update(np.array(got).tolist())
    assert len(seen) > 16  # the draws vary (a stuck row would pass the comparisons trivially)


def test_public_function_runs_the_reference_on_the_cpu():
    if K.backend() != "cpu":
        pytest.skip("the CPU backend's dispatch")
    model = _model()
    packed = pack_lt(model)
    h = mx.array(np.random.default_rng(2).standard_normal((2, model.args.decoder.d_model)).astype(np.float32))
    bad = mx.zeros((model.args.num_tokens_per_codebook,), mx.float32)
    st = K.make_sample_state(7)
    a, sa = K.magpie_lt_draws(h, packed.weights, bad, 2.5, 0.7, 80, st, packed.scratch)
    b, sb = ref.magpie_lt_draws(h, packed.weights, bad, 2.5, 0.7, 80, st)
    np.testing.assert_array_equal(np.array(a), np.array(b))
    np.testing.assert_array_equal(np.array(sa), np.array(sb))


def test_sources():
    assert "magpie_lt" in S.KERNELS
    mega = S.CUDA_ONLY_SPECS["magpie_lt_megakernel"]
    cu = S.cuda_program(mega)
    assert "mg_grid_barrier(sw)" in cu and "__launch_bounds__(256, 2)" in cu and "mgl_draw" in cu
    metal = S.metal_program(S.SPECS["magpie_lt"])
    assert "#define MG_GRID 0" in metal and "mgl_row_dot" in metal
    assert S.SPECS["magpie_lt"].inputs == mega.inputs


@pytest.mark.parametrize("cfg", [True, False])
def test_frame_loop_on_the_lt_kernel_draws_the_same_codes(monkeypatch, cfg):
    # the frame loop's LT wiring (StepGraph.draw through lt_kernel / draw_codes, the sampler's state
    # advanced by the kernel's next_state), run on the CPU through the reference: seeded sampled codes and
    # attended positions equal the eager draws'
    from metalgen.magpie import frames
    from metalgen.magpie.generate import MagpieSampling
    from metalgen.magpie.lt_kernel import PackedLT

    m = _model()
    s = MagpieSampling(temperature=0.8, top_k=20, max_frames=12, min_frames=4)
    text = np.arange(3, 15)
    runs = []
    for use in (False, True):
        monkeypatch.setattr(frames, "lt_kernel", (lambda model: pack_lt(model)) if use else (lambda model: None))
        loop = frames.FrameLoop(m, text, 0, s, cfg=cfg, seed=3)
        assert isinstance(loop.graphs[True].lt, PackedLT) == use
        rec = {}
        codes = np.concatenate(list(loop.pieces(rec)), axis=1)
        runs.append((codes, rec["attended"]))
    assert runs[0][0].shape[1] >= 4 and len(np.unique(runs[0][0])) > 8  # sampled, not a stuck row
    np.testing.assert_array_equal(runs[1][0], runs[0][0])
    assert runs[1][1] == runs[0][1]


def test_lt_kernel_is_off_on_the_cpu():
    from metalgen.magpie.lt_kernel import lt_kernel

    if K.backend() != "cpu":
        pytest.skip("the CPU backend keeps the eager draws")
    assert lt_kernel(_model()) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_gpu_kernel_equals_the_reference(dtype):
    # the fused kernel against its reference (the same packed weights, float32 math) on the 357M shapes:
    # the chains' codes identical but for a rare float near-tie (after which a chain diverges), greedy and
    # sampled, with and without CFG; the next state advanced by the draw count
    from kernels_metal import gpu as G

    model = dummy.lt_check_model(dtype)
    packed = pack_lt(model)
    w = packed.weights
    assert G._magpie_lt_fits(w, model.args.decoder.d_model)  # the kernel runs, not its fallback
    a = model.args
    V, d = a.num_tokens_per_codebook, a.decoder.d_model
    bad = np.zeros(V, np.float32)
    bad[a.codebook_size:] = -np.inf
    bad[a.audio_eos_id] = 0.0
    bad = mx.array(bad)
    rng = np.random.default_rng(3)
    same = total = 0
    seen = set()
    for i, (rows, temperature) in enumerate([(2, 0.0), (1, 0.0), (2, 0.7), (1, 0.7)] * 3):
        h = mx.array(rng.standard_normal((rows, d)).astype(np.float32)).astype(dtype)
        # the state's padding words nonzero: the kernel carries them through as given
        st = K.make_sample_state(100 + i) + mx.array([0, 0, i, 7], mx.uint32)
        got, got_state = K.magpie_lt_draws(h, w, bad, 2.5, temperature, 80, st, packed.scratch)
        want, _ = ref.magpie_lt_draws(h, w, bad, 2.5, temperature, 80, st)
        got = np.array(got)
        assert np.array(got_state).tolist() == [100 + i, packed.n, i, 7]
        assert not np.isinf(np.array(bad)[got]).any()
        same += int(np.array_equal(got, np.array(want)))
        total += 1
        seen.update(got.tolist())
    assert same >= total - 2, f"{same} of {total} chains equal the reference"
    assert len(seen) > 64
