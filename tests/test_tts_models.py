"""Qwen3-TTS building blocks without the reference: M-RoPE versus plain RoPE, the conv forms,
the sliding-window mask, streaming decode, the decoder's backwards-compatible extensions."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import kernels_metal as K
from kernels_metal import reference as R
from metalgen.models.qwen3_tts.speech_decoder import (
    conv1d_gemm,
    conv_transpose1d_gemm,
    sliding_window_mask,
    torch_conv_to_mlx,
)
from metalgen.models.qwen3_tts.talker import MRoPE
from metalgen.models.rope import RopeConfig, RoPE

PUBLISHED = {"rope_theta": 1000000.0,
             "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True}}


# The same products and sums: equal bits on the CPU. A GPU backend fuses x cos + y sin into one rounding where
# the CPU rounds twice (H200, 2026-11-26: 2.4e-7 and 4.8e-7 apart, values of a few units), so there the
# bound is float32 rounding of the results.
SAME_ROTATION = 0.0 if K.backend() == "cpu" else 1e-6


def _mrope_and_rope(positions=4096, dims=128):
    cfg = RopeConfig.from_config(PUBLISHED)
    return MRoPE(cfg, dims, positions), RoPE(cfg, dims, positions)


def test_mrope_text_positions_equal_plain_rope_at_published_geometry():
    """Shown, not assumed: with the three axes equal (text-only input), the talker's
    interleaved M-RoPE [24, 20, 20] is exactly 1-D RoPE over 4096 positions."""
    mrope, rope = _mrope_and_rope()
    x = mx.random.normal((1, 2, 4096, 128), key=mx.random.key(0))
    got = mrope(x, 0)
    exact = R.rope(x, rope.table, 0)  # the same cos/sin table, rotate_half
    assert float(mx.max(mx.abs(got - exact))) <= SAME_ROTATION
    # The backend's plain RoPE (on the CPU mx.fast.rope, float32 angles) agrees to float32 rounding.
    assert float(mx.max(mx.abs(got - rope(x, 0)))) < 2e-3


def test_mrope_with_offset_and_cache_positions():
    mrope, rope = _mrope_and_rope(512)
    x = mx.random.normal((1, 2, 7, 128), key=mx.random.key(1))
    assert float(mx.max(mx.abs(mrope(x, 300) - R.rope(x, rope.table, 300)))) <= SAME_ROTATION


def test_mrope_distinct_axes_differ_from_rope():
    """The test above is not vacuous: different h/w positions change the rotation, and only in
    the frequencies the interleaved section gives them."""
    mrope, rope = _mrope_and_rope(64)
    x = mx.random.normal((1, 1, 5, 128), key=mx.random.key(2))
    pos = mx.broadcast_to(mx.arange(5, dtype=mx.int32)[None, None], (3, 1, 5))
    shifted = mx.concatenate([pos[:1], pos[1:2] + 7, pos[2:]], axis=0)
    a = np.array(mrope(x, 0, pos))
    b = np.array(mrope(x, 0, shifted))
    axis = R.mrope_axis_map([24, 20, 20], True)
    changed = np.where(np.abs(a - b).max(axis=(0, 1, 2)) > 1e-6)[0] % 64
    assert set(changed.tolist()) == set(np.where(axis == 1)[0].tolist())


def test_decoder_model_defaults_unchanged():
    """DecoderModel without the new arguments builds and runs as before."""
    from metalgen.models.decoder import DecoderModel

    spec = RopeConfig(theta=10000.0)
    from metalgen.models.decoder import DecoderSpec

    s = DecoderSpec(hidden_size=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, vocab_size=50, rms_norm_eps=1e-6,
                    max_position_embeddings=64, rope=spec, qk_norm=True)
    m = DecoderModel(s)
    assert "embed_tokens" in m
    out = m(mx.array([[1, 2, 3]]))
    assert out.shape == (1, 3, 32)
    no_embed = DecoderModel(s, embed_tokens=False)
    assert "embed_tokens" not in no_embed


@pytest.mark.parametrize("k,dilation,stride", [(7, 1, 1), (7, 3, 1), (7, 9, 1), (1, 1, 1), (3, 1, 2)])
def test_conv1d_gemm_matches_mlx_conv(k, dilation, stride):
    x = mx.random.normal((2, 80, 6), key=mx.random.key(3))
    w = mx.random.normal((5, k, 6), key=mx.random.key(4))
    b = mx.random.normal((5,), key=mx.random.key(5))
    want = mx.conv1d(x, w, stride=stride, dilation=dilation) + b
    got = conv1d_gemm(x, w, b, dilation, stride)
    assert got.shape == want.shape
    assert float(mx.max(mx.abs(got - want))) < 1e-4


@pytest.mark.parametrize("k,stride", [(4, 2), (16, 8), (2, 2), (6, 3)])
def test_conv_transpose1d_gemm_matches_mlx(k, stride):
    x = mx.random.normal((2, 9, 6), key=mx.random.key(6))
    w = mx.random.normal((5, k, 6), key=mx.random.key(7))
    b = mx.random.normal((5,), key=mx.random.key(8))
    want = mx.conv_transpose1d(x, w, stride=stride) + b
    got = conv_transpose1d_gemm(x, w, b, stride)
    assert got.shape == want.shape
    assert float(mx.max(mx.abs(got - want))) < 1e-4


def test_sliding_window_mask():
    m = np.array(sliding_window_mask(10, 4))
    for i in range(10):
        for j in range(10):
            assert m[i, j] == (i - 4 < j <= i)


def test_torch_conv_weights_are_transposed():
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv1d(3, 5, 7)
            self.b = nn.ConvTranspose1d(3, 5, 4, stride=2)

    h = Holder()
    w = {"a.weight": mx.zeros((5, 3, 7)), "b.weight": mx.zeros((3, 5, 4)), "a.bias": mx.zeros((5,))}
    out = torch_conv_to_mlx(h, w)
    assert out["a.weight"].shape == (5, 7, 3) and out["b.weight"].shape == (5, 4, 3)
    again = torch_conv_to_mlx(h, out)  # already MLX layout: left alone
    assert again["a.weight"].shape == (5, 7, 3)


@pytest.fixture(scope="module")
def tiny():
    import metalgen.tts

    return metalgen.tts.load("dummy:qwen3-tts-tiny")


@pytest.mark.parametrize("chunk,left", [(1, 0), (4, 2), (5, 25), (30, 3)])
def test_streaming_decoder_equals_chunked(tiny, chunk, left):
    from metalgen.models.qwen3_tts.speech_decoder import StreamingDecoder

    dec = tiny.speech.decoder
    codes = mx.array(np.random.default_rng(0).integers(0, 2048, (1, 23, 16)).astype(np.int32))
    want = np.array(dec.chunked(codes, chunk, left)[0])
    s = StreamingDecoder(dec, chunk, left)
    got = []
    for f in range(23):
        got += [np.array(p[0]) for p in s.push(codes[:, f : f + 1])]
    got += [np.array(p[0]) for p in s.flush()]
    assert np.concatenate(got).shape == (23 * dec.total_upsample,)
    np.testing.assert_allclose(np.concatenate(got), want, atol=1e-6)


def test_chunked_with_full_context_equals_whole(tiny):
    dec = tiny.speech.decoder
    codes = mx.array(np.random.default_rng(1).integers(0, 2048, (1, 17, 16)).astype(np.int32))
    np.testing.assert_allclose(np.array(dec.chunked(codes, 5, 17)), np.array(dec(codes)), atol=1e-5)


@pytest.mark.parametrize("k, dilation, stride", [(1, 1, 1), (1, 1, 2), (3, 1, 1), (7, 3, 1), (11, 5, 1), (4, 1, 2), (5, 2, 3)])
def test_conv1d_gemm_is_mlx_conv1d(k, dilation, stride):
    # the strided-view form of the speech decoders' conv against MLX's own conv1d, on a sliced (not
    # row-contiguous) input too
    from metalgen.models.qwen3_tts.speech_decoder import conv1d_gemm

    rng = np.random.default_rng(k * 100 + dilation * 10 + stride)
    x = mx.array(rng.standard_normal((2, 70, 6)).astype(np.float32))[:, 3:64]
    w = mx.array(rng.standard_normal((5, k, 6)).astype(np.float32))
    b = mx.array(rng.standard_normal((5,)).astype(np.float32))
    got = conv1d_gemm(x, w, b, dilation, stride)
    want = mx.conv1d(x, w, stride=stride, dilation=dilation) + b
    assert got.shape == want.shape and got.shape[1] > 2
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
