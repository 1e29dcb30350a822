"""make_sampler and the logits processors."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx

from metalgen import MetalgenError
from metalgen.sampling import make_logits_processors, make_repetition_penalty, make_sampler


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
