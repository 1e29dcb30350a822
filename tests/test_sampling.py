"""make_sampler and the logits processors."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx

from metalgen import MetalgenError
import kernels_metal as K
from kernels_metal import reference as ref_kernels
from metalgen.sampling import make_logits_processors, make_repetition_penalty, make_sampler, sample_processed


def fresh_logits(vocab=257, seed=0):
    return mx.array(np.random.default_rng(seed).normal(size=(1, vocab)).astype(np.float32) * 3)


def test_greedy_is_argmax_with_logprob():
    logits = fresh_logits()
    tok, lp = make_sampler(0.0)(logits)
    ref = np.array(logits[0])
    assert tok.item() == int(ref.argmax())
    log_softmax = ref - np.log(np.exp(ref - ref.max()).sum()) - ref.max()
    assert lp.item() == pytest.approx(log_softmax.max(), abs=1e-5)


def test_same_seed_same_draws_different_seed_differs():
    logits = fresh_logits()

    def draws(seed):
        s = make_sampler(1.0, seed=seed)
        return [s(logits)[0].item() for _ in range(40)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_top_k_one_is_greedy():
    logits = fresh_logits(seed=3)
    s = make_sampler(1.5, top_k=1, seed=0)
    assert {s(logits)[0].item() for _ in range(20)} == {int(np.array(logits).argmax())}


def test_filters_keep_draws_inside_the_allowed_set():
    logits = fresh_logits(seed=4)
    top5 = set(np.argsort(-np.array(logits[0]))[:5].tolist())
    s = make_sampler(1.0, top_k=5, seed=1)
    assert {s(logits)[0].item() for _ in range(60)} <= top5


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=1.0)],
)
def test_bad_settings_are_user_errors(kwargs):
    with pytest.raises(MetalgenError):
        make_sampler(**kwargs)


def test_repetition_penalty_matches_transformers():
    torch = pytest.importorskip("torch")
    from transformers import RepetitionPenaltyLogitsProcessor

    logits = fresh_logits(vocab=50, seed=5)
    history = [3, 7, 7, 11, 42]
    ours = make_repetition_penalty(1.3, context_size=20)(mx.array(history), mx.array(logits))
    ref = RepetitionPenaltyLogitsProcessor(1.3)(
        torch.tensor([history]), torch.tensor(np.array(logits))
    )
    np.testing.assert_allclose(np.array(ours), ref.numpy(), rtol=1e-6)


def test_repetition_context_window_only_covers_recent_tokens():
    logits = mx.ones((1, 10))
    out = make_repetition_penalty(2.0, context_size=2)(mx.array([1, 2, 3]), logits)
    assert np.array(out)[0].tolist() == [1, 1, 0.5, 0.5, 1, 1, 1, 1, 1, 1]


def test_processors_list():
    assert make_logits_processors(None) == []
    assert make_logits_processors(1.0) == []
    assert len(make_logits_processors(1.1)) == 1
    with pytest.raises(MetalgenError):
        make_logits_processors(0.0)


@pytest.mark.parametrize("settings", [dict(temperature=0.0), dict(temperature=0.8, top_p=0.9, seed=3),
                                      dict(temperature=0.7, top_k=20, min_p=0.05, seed=4)])
def test_penalty_folded_into_the_sampler_equals_the_processor_before_it(settings):
    # generation hands a lone repetition penalty to the sampler's launch; the draws are those of the
    # processor applied first (float32 logits: the processor's own rounding is exact there)
    rng = np.random.default_rng()
    logits = mx.array(rng.normal(size=(1, 300)).astype(np.float32) * 3)
    top = np.argsort(-np.array(logits[0]))[:6].tolist()  # penalize the likeliest: the draw must change
    history = mx.array(rng.integers(0, 300, 30).tolist() + top + top[:2], dtype=mx.int32)
    rp = make_repetition_penalty(4.0, context_size=10)
    fused, plain = make_sampler(**settings), make_sampler(**settings)
    for _ in range(6):
        t1, l1 = sample_processed(logits, fused, [rp], history)
        t2, l2 = plain(rp(history, mx.array(logits)))
        assert t1.tolist() == t2.tolist()
        assert l1.item() == pytest.approx(l2.item(), abs=1e-5)
    if settings["temperature"] == 0.0:
        assert t1.item() not in top[:2]  # the unpenalized argmax was top[0]


@pytest.mark.parametrize("prompt_len", [3, 40])
def test_state_ring_penalizes_the_last_tokens_as_an_explicit_history(prompt_len):
    # a state given a window (with_recent) keeps the last W tokens (the prompt's, then each draw's), the penalty reads them:
    # the draws equal those given the end of the growing history explicitly, and the ring holds that end
    rng = np.random.default_rng()
    V, W = 64, 8
    logits = mx.array(rng.normal(size=(1, V)).astype(np.float32) * 3)
    prompt = mx.array(rng.integers(0, V, prompt_len), mx.int32)
    seed = int(rng.integers(1 << 30))
    ring = ref_kernels.with_recent(ref_kernels.make_sample_state(seed), prompt, W)
    plain = ref_kernels.make_sample_state(seed)
    assert ref_kernels.ring_size(ring) == W and ref_kernels.ring_size(plain) == 0
    history = prompt
    for step in range(20):
        tr, lr, ring = ref_kernels.sample(logits, 1.0, 0, 1.0, 0.0, ring, None, 0.05)
        tp, lp, plain = ref_kernels.sample(logits, 1.0, 0, 1.0, 0.0, plain, history[-W:], 0.05)
        assert tr.tolist() == tp.tolist() and lr.item() == pytest.approx(lp.item(), abs=1e-6)
        history = mx.concatenate([history, tr])
        kept = sorted(i for i in ref_kernels.recent_ids(ring).tolist() if i >= 0)
        assert kept == sorted(history[-W:].tolist())
        assert ring[:3].tolist() == plain[:3].tolist()  # seed, counter and the token word as without a ring


def test_sampler_keeps_recent_tokens_for_its_penalty():
    # DeviceSampler.keep_recent: the lone penalty then needs no history, and draws as with one
    rng = np.random.default_rng()
    logits = mx.array(rng.normal(size=(1, 300)).astype(np.float32) * 3)
    prompt = mx.array(rng.integers(0, 300, 30), mx.int32)
    rp = make_repetition_penalty(0.2, context_size=10)
    kept, given = make_sampler(0.8, top_p=0.95, seed=5), make_sampler(0.8, top_p=0.95, seed=5)
    kept.keep_recent(prompt, rp.context_size)
    assert kept.window == 10 and given.window == 0
    history = prompt
    for _ in range(12):
        t1, l1 = sample_processed(logits, kept, [rp], None)
        t2, l2 = sample_processed(logits, given, [rp], history)
        assert t1.tolist() == t2.tolist() and l1.item() == pytest.approx(l2.item(), abs=1e-5)
        assert kept.last_token().tolist() == t1.tolist()
        history = mx.concatenate([history, t1])


def test_ring_needs_a_window_and_one_row():
    with pytest.raises(ValueError):
        ref_kernels.with_recent(ref_kernels.make_sample_state(1), mx.array([1, 2]), 0)
    ring = ref_kernels.with_recent(ref_kernels.make_sample_state(1), mx.array([1, 2]), 4)
    with pytest.raises(ValueError):
        K.sample(mx.zeros((2, 16)), 0.0, 0, 1.0, 0.0, ring, None, 1.3)


def test_penalize_ignores_ids_outside_the_vocabulary_and_counts_repeats_once():
    logits = mx.array([[2.0, -2.0, 4.0, 1.0], [1.0, 1.0, 1.0, -1.0]])
    recent = mx.array([[0, 0, 1, -1], [3, 7, 3, 2]], dtype=mx.int32)
    out = np.array(ref_kernels.penalize(logits, recent, 2.0))
    assert out.tolist() == [[1.0, -4.0, 4.0, 1.0], [1.0, 1.0, 0.5, -2.0]]


@pytest.mark.skipif(K.backend() == "cpu", reason="the GPU sampler kernel against its reference")
@pytest.mark.parametrize("B,V", [(1, 151936), (3, 151936), (2, 1000), (64, 5000)])
def test_gpu_sampler_kernel_equals_the_reference(B, V):
    # one scratch for all calls (its barrier and arrival words carry over launches); every setting's
    # tokens equal the reference's but where a row's top-p edge falls within float rounding (rare)
    rng = np.random.default_rng()
    logits = mx.array(rng.normal(size=(B, V)) * 2.5).astype(mx.bfloat16)
    recent = mx.array(rng.integers(-5, V + 5, (B, 24)), dtype=mx.int32)
    scratch = K.make_sample_scratch(B, V)
    state = K.make_sample_state(int(rng.integers(1 << 30)))
    mismatches = 0
    for temp, k, p, m, pen in [(0.0, 0, 1.0, 0.0, 1.0), (0.0, 0, 1.0, 0.0, 1.3), (0.7, 0, 1.0, 0.0, 1.0),
                               (0.7, 0, 0.9, 0.0, 1.1), (0.7, 50, 1.0, 0.0, 1.0), (1.0, 40, 0.8, 0.02, 1.2),
                               (0.7, 0, 1.0, 0.05, 1.0), (0.5, 1, 1.0, 0.0, 1.0)]:
        for _ in range(3):
            tok, lp, nxt = K.sample(logits, temp, k, p, m, state, recent, pen, scratch)
            again, _, _ = K.sample(logits, temp, k, p, m, state, recent, pen, scratch)
            rt, rl, rn = ref_kernels.sample(logits, temp, k, p, m, state, recent, pen)
            assert tok.tolist() == again.tolist()  # reproducible: the cross-group sums are integers
            # the same counter; the third word each side's own token of row 0 (which may differ at a top-p edge)
            assert nxt.tolist()[2] == tok.tolist()[0] and rn.tolist()[2] == rt.tolist()[0]
            assert np.array_equal(np.delete(np.array(nxt), 2), np.delete(np.array(rn), 2))
            same = np.array(tok) == np.array(rt)
            mismatches += int((~same).sum())
            assert np.allclose(np.array(lp)[same], np.array(rl)[same], atol=1e-4)
            state = nxt
    assert mismatches <= max(1, B // 16)


@pytest.mark.skipif(K.backend() == "cpu", reason="the GPU sampler kernel against its reference")
@pytest.mark.parametrize("V", [151936, 1000])
def test_gpu_sampler_ring_equals_the_reference(V):
    # the kernel reads the penalty's ids from the state's ring and writes each draw into it, as the reference: the
    # same tokens, and the same state words (ring and slot included) after every step
    rng = np.random.default_rng()
    scratch = K.make_sample_scratch(1, V)
    prompt = mx.array(rng.integers(0, V, 5), mx.int32)
    state = K.with_recent(K.make_sample_state(int(rng.integers(1 << 30))), prompt, 12)
    for temp, p, pen in [(0.0, 1.0, 1.3), (0.7, 0.9, 1.1), (1.0, 1.0, 0.05)] * 6:
        logits = mx.array(rng.normal(size=(1, V)) * 2.5).astype(mx.bfloat16)
        tok, lp, nxt = K.sample(logits, temp, 0, p, 0.0, state, None, pen, scratch)
        rt, rl, rn = ref_kernels.sample(logits, temp, 0, p, 0.0, state, None, pen)
        assert tok.tolist() == rt.tolist()
        assert np.allclose(np.array(lp), np.array(rl), atol=1e-4)
        assert nxt.tolist() == rn.tolist()
        state = nxt


@pytest.mark.skipif(K.backend() == "cpu", reason="the GPU sampler kernel against its reference")
@pytest.mark.parametrize("B,V", [(1, 151936), (2, 5000)])
def test_gpu_sampler_on_tied_logits_equals_the_reference(B, V):
    # logits on a grid of 33 values: each bin of a radix pass holds many copies of one key, so the descents of top-k
    # and top-p stop where the chosen bin's keys are all one (sample.body), the edge's ties kept whole. Ties are
    # exact, so every token must equal the reference's
    rng = np.random.default_rng()
    logits = mx.array(rng.integers(-16, 17, (B, V)) / 4.0).astype(mx.bfloat16)
    scratch = K.make_sample_scratch(B, V)
    state = K.make_sample_state(int(rng.integers(1 << 30)))
    for temp, k, p in [(0.7, 0, 0.9), (1.0, 0, 0.5), (0.7, 2000, 1.0), (0.7, 3000, 0.6), (1.3, 500, 0.95)]:
        for _ in range(2):
            tok, lp, nxt = K.sample(logits, temp, k, p, 0.0, state, None, 1.0, scratch)
            rt, rl, _ = ref_kernels.sample(logits, temp, k, p, 0.0, state)
            assert tok.tolist() == rt.tolist(), (temp, k, p)
            assert np.allclose(np.array(lp), np.array(rl), atol=1e-4)
            state = nxt


def test_presence_and_frequency_penalties_match_numpy():
    # OpenAI's definition, over the generated tokens only: logit -= frequency * count + presence * (count > 0)
    from metalgen.sampling import PresenceFrequencyPenalty, make_presence_frequency_penalty

    logits = fresh_logits(seed=4)
    history = [7, 7, 3, 250, 3, 3, 9, 7, 1, 1]  # the first 4 are the prompt's
    out = PresenceFrequencyPenalty(0.5, -0.75, prompt_tokens=4)(mx.array(history, mx.int32), logits)
    counts = np.bincount(history[4:], minlength=logits.shape[-1]).astype(np.float32)
    want = np.array(logits) - (-0.75 * counts + 0.5 * (counts > 0))
    assert np.allclose(np.array(out), want, atol=1e-6)
    assert np.array(out)[0, 250] == np.array(logits)[0, 250]  # only in the prompt: not penalized
    # nothing generated yet: unchanged; both 0: no processor at all (the sampler's fast path stays)
    assert np.array_equal(np.array(PresenceFrequencyPenalty(1, 1, 4)(mx.array(history[:4]), logits)),
                          np.array(logits))
    assert make_presence_frequency_penalty(0, 0, 4) == [] and len(make_presence_frequency_penalty(0, 1, 4)) == 1


@pytest.mark.skipif(K.backend() == "cpu", reason="the GPU sampler kernel against its reference")
@pytest.mark.parametrize("V", [151936, 3000])
def test_gpu_rows_with_their_own_settings_equal_the_reference_and_each_row_alone(V):
    rng = np.random.default_rng()
    settings = [(0.0, 0, 1.0, 0.0, 1.0, 0), (0.7, 0, 0.9, 0.0, 1.1, 20), (1.0, 40, 0.8, 0.02, 1.2, 5),
                (0.8, 0, 1.0, 0.05, 1.0, 0), (0.6, 1, 1.0, 0.0, 1.0, 0), (0.9, 50, 1.0, 0.0, 1.3, 12)]
    B = len(settings)
    logits = mx.array(rng.normal(size=(B, V)) * 2.5).astype(mx.bfloat16)
    recent = mx.array(rng.integers(-3, V, (B, 20)), dtype=mx.int32)
    seeds = rng.integers(1 << 30, size=B)
    states = mx.array([[int(s), int(rng.integers(100)), 0] for s in seeds], dtype=mx.uint32)
    scratch = K.make_sample_scratch(B, V)
    mismatches = 0
    for _ in range(3):
        tok, lp, nxt = K.sample_rows(logits, settings, states, recent, scratch)
        rt, rl, rn = ref_kernels.sample_rows(logits, settings, states, recent)
        assert nxt.tolist() == rn.tolist()
        mismatches += int((np.array(tok) != np.array(rt)).sum())
        for b, (t, k, p, m, pen, w) in enumerate(settings):  # stream 0: what the row's sampler draws alone
            alone, lone_lp, _ = K.sample(logits[b : b + 1], t, k, p, m, states[b, :2], recent[b, 20 - w:] if w else None,
                                         pen)
            assert alone.item() == tok[b].item() and abs(lone_lp.item() - lp[b].item()) < 1e-5
        states = nxt
    assert mismatches <= 1
