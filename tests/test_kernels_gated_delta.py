"""The gated delta rule (kernels_metal.gated_delta and its reference forms): the recurrence against
an independent float64 loop, the chunked prefill form against the recurrence, continuation from a
returned state, dtypes."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

import kernels_metal as K
from kernels_metal import reference as ref


def inputs(L, Hk, Hv, Dk, Dv, seed, B=1, dtype=mx.float32, state=True):
    rng = np.random.default_rng(seed)

    def a(*s):
        return mx.array(rng.standard_normal(s).astype(np.float32))

    q, k, v = a(B, L, Hk, Dk).astype(dtype), a(B, L, Hk, Dk).astype(dtype), a(B, L, Hv, Dv).astype(dtype)
    g = -mx.abs(a(B, L, Hv)) * 0.3  # log decays <= 0
    beta = mx.sigmoid(a(B, L, Hv))
    s0 = a(B, Hv, Dk, Dv) * 0.1 if state else None
    return q, k, v, g, beta, s0


def numpy_rule(q, k, v, g, beta, s0):
    """float64, one head at a time, written from the rule's definition."""
    q, k, v, g, beta = (np.array(t.astype(mx.float32), dtype=np.float64) for t in (q, k, v, g, beta))
    B, L, Hk, Dk = q.shape
    Hv, Dv = v.shape[2:]
    S = np.zeros((B, Hv, Dk, Dv)) if s0 is None else np.array(s0, dtype=np.float64)
    out = np.zeros((B, L, Hv, Dv))
    for b in range(B):
        for h in range(Hv):
            kh = h // (Hv // Hk)
            for t in range(L):
                qt = q[b, t, kh] / np.sqrt((q[b, t, kh] ** 2).sum() + 1e-6) / np.sqrt(Dk)
                kt = k[b, t, kh] / np.sqrt((k[b, t, kh] ** 2).sum() + 1e-6)
                S[b, h] *= np.exp(g[b, t, h])
                S[b, h] += np.outer(kt, beta[b, t, h] * (v[b, t, h] - kt @ S[b, h]))
                out[b, t, h] = qt @ S[b, h]
    return out, S


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("L,Hk,Hv,Dk,Dv,state", [(1, 2, 4, 16, 8, True), (9, 2, 2, 8, 16, False),
                                                 (12, 1, 3, 16, 16, True)])
def test_recurrence_matches_float64(L, Hk, Hv, Dk, Dv, state):
    x = inputs(L, Hk, Hv, Dk, Dv, seed=L + Hv, B=2, state=state)
    out, S = ref.gated_delta_recurrent(*x)
    want, want_S = numpy_rule(*x)
    assert rel(out, want) < 1e-5 and rel(S, want_S) < 1e-5


@pytest.mark.parametrize("L", [2, 63, 64, 65, 130, 200])
def test_chunked_equals_recurrence(L):
    x = inputs(L, 2, 4, 32, 16, seed=L)
    a, sa = ref.gated_delta_recurrent(*x)
    b, sb = ref.gated_delta_chunked(*x)
    assert rel(b, a) < 1e-4 and rel(sb, sa) < 1e-4


def test_chunk_size_does_not_matter():
    x = inputs(100, 1, 2, 16, 16, seed=7)
    a, sa = ref.gated_delta_chunked(*x, chunk=64)
    b, sb = ref.gated_delta_chunked(*x, chunk=16)
    assert rel(b, a) < 1e-4 and rel(sb, sa) < 1e-4


def test_continuation_from_the_returned_state():
    q, k, v, g, beta, s0 = inputs(90, 2, 4, 16, 8, seed=3)
    whole, s_whole = K.gated_delta(q, k, v, g, beta, s0)
    first, s1 = K.gated_delta(q[:, :70], k[:, :70], v[:, :70], g[:, :70], beta[:, :70], s0)
    rest = []
    s = s1
    for t in range(70, 90):  # then token by token, as decode does
        o, s = K.gated_delta(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], beta[:, t:t + 1], s)
        rest.append(o)
    got = mx.concatenate([first] + rest, axis=1)
    assert rel(got, whole) < 1e-4 and rel(s, s_whole) < 1e-4


def test_bf16_inputs_give_bf16_out_and_a_float32_state():
    x = inputs(20, 2, 2, 16, 16, seed=11, dtype=mx.bfloat16, state=False)
    out, S = K.gated_delta(*x)
    assert out.dtype == mx.bfloat16 and S.dtype == mx.float32
    want, _ = ref.gated_delta_recurrent(*inputs(20, 2, 2, 16, 16, seed=11, state=False))
    assert rel(out.astype(mx.float32), want) < 3e-2  # bf16 inputs, float32 arithmetic
