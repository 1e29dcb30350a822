"""Qwen3-Omni's Code2Wav against transformers' Qwen3OmniMoeCode2Wav (the tiny random model of
tests/omni_reference.py): whole and chunked decodes, streaming, the weight conversion."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mlx.core as mx  # noqa: E402

from metalgen.models.qwen3_omni.code2wav import (  # noqa: E402
    Code2Wav,
    Code2WavArgs,
    _conv_shapes,
    sanitize_code2wav_weights,
)
from omni_reference import build_tiny_omni, tiny_config_dict  # noqa: E402

PREFIX = "code2wav."


def checkpoint(torch_model) -> dict:
    """The model's state dict as the loader hands it over: every key, PyTorch layouts, as mx arrays."""
    return {k: mx.array(v.detach().numpy()) for k, v in torch_model.state_dict().items()}


@pytest.fixture(scope="module")
def ref():
    """(transformers' Code2Wav, ours with its weights)."""
    # torch's worker threads spin against MLX's on a small CPU (5-10x slower on 2 cores)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    omni = build_tiny_omni()
    weights = sanitize_code2wav_weights(checkpoint(omni))
    ours = Code2Wav(Code2WavArgs.from_dict(tiny_config_dict()["code2wav_config"]))
    ours.load_weights([(k[len(PREFIX):], v) for k, v in weights.items() if k.startswith(PREFIX)], strict=True)
    yield omni.code2wav, ours
    torch.set_num_threads(threads)


def random_codes(batch: int, frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2048, (batch, frames, 16)).astype(np.int64)


def torch_codes(codes: np.ndarray):
    # transformers takes (B, Q, T); ours is (B, T, Q)
    return torch.from_numpy(codes).transpose(1, 2).contiguous()


def assert_close(got: np.ndarray, want: np.ndarray):
    assert got.shape == want.shape
    corr = np.corrcoef(got.ravel(), want.ravel())[0, 1]
    assert corr > 0.9999, corr
    assert np.abs(got - want).max() < 1e-5


def test_args_read_both_rope_spellings():
    published = {"codebook_size": 2048, "hidden_size": 1024, "num_quantizers": 16, "decoder_dim": 1536,
                 "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "model_type": "", "unknown": 1,
                 "rope_parameters": {"rope_theta": 10000, "rope_type": "default"}}
    args = Code2WavArgs.from_dict(published)
    assert args.to_spec().rope.theta == 10000.0
    assert args.to_spec().head_dim == 64
    older = {k: v for k, v in published.items() if k != "rope_parameters"}
    assert Code2WavArgs.from_dict({**older, "rope_theta": 5000.0}).to_spec().rope.theta == 5000.0
    # 1920 samples a frame (80 ms at 24 kHz), 8*60 + 5*12 + 4*3 + 3 of them cut at the start
    assert (args.total_upsample, args.start_trim) == (1920, 555)


@pytest.mark.parametrize("batch,frames", [(1, 7), (2, 40), (1, 330)])
def test_whole_decode_matches_reference(ref, batch, frames):
    theirs, ours = ref
    codes = random_codes(batch, frames, seed=frames)
    with torch.no_grad():
        want = theirs(torch_codes(codes))[:, 0].numpy()
    got = ours(mx.array(codes))
    assert got.dtype == mx.float32
    assert got.shape == (batch, frames * ours.total_upsample - ours.start_trim)
    assert_close(np.array(got), want)


@pytest.mark.parametrize("batch,frames,chunk,left", [(2, 40, 16, 5), (1, 29, 7, 0), (1, 330, 300, 25)])
def test_chunked_decode_matches_reference(ref, batch, frames, chunk, left):
    theirs, ours = ref
    codes = random_codes(batch, frames, seed=100 + frames)
    with torch.no_grad():
        want = theirs.chunked_decode(torch_codes(codes), chunk_size=chunk, left_context_size=left)[:, 0].numpy()
    got = np.array(ours.chunked(mx.array(codes), chunk, left))
    # the reference loses start_trim samples at every chunk boundary: the cases really split
    chunks = -(-frames // chunk)
    assert chunks > 1
    assert got.shape == (batch, frames * ours.total_upsample - chunks * ours.start_trim)
    assert_close(got, want)


@pytest.mark.parametrize("gapless", [False, True])
def test_stream_pieces_equal_chunked(ref, gapless):
    _, ours = ref
    codes = mx.array(random_codes(2, 40, seed=7))
    want = np.array(ours.chunked(codes, 16, 5, gapless=gapless))
    stream = ours.stream(chunk=16, left_context=5, gapless=gapless)
    pieces = []
    for start, end in [(0, 1), (1, 9), (9, 16), (16, 35), (35, 40)]:  # uneven pushes
        pieces += [np.array(p) for p in stream.push(codes[:, start:end])]
    pieces += [np.array(p) for p in stream.flush()]
    assert len(pieces) == 3
    np.testing.assert_array_equal(np.concatenate(pieces, axis=-1), want)


def test_stream_first_chunk_comes_early(ref):
    _, ours = ref
    codes = mx.array(random_codes(1, 12, seed=8))
    stream = ours.stream(first_chunk=2, chunk=8, left_context=25, gapless=True)
    sizes = [p.shape[-1] for p in stream.push(codes)] + [p.shape[-1] for p in stream.flush()]
    u = ours.total_upsample
    assert sizes == [2 * u - ours.start_trim, 4 * u, 6 * u]


def test_gapless_chunked_equals_whole_given_enough_context(ref):
    """The boundary samples the reference drops come back from the context, and with context
    wider than the decoder's reach the chunks add up to the whole decode."""
    _, ours = ref
    codes = mx.array(random_codes(1, 60, seed=9))
    whole = np.array(ours(codes))
    np.testing.assert_allclose(np.array(ours.chunked(codes, 16, 25, gapless=True)), whole, atol=1e-5)


def test_wrong_codebook_count_is_rejected(ref):
    _, ours = ref
    with pytest.raises(ValueError, match="16 codebooks"):
        ours(mx.zeros((1, 5, 8), dtype=mx.int32))
    with pytest.raises(ValueError, match="16 codebooks"):
        ours.chunked(mx.zeros((1, 16, 5), dtype=mx.int32), 4, 1)  # transformers' (B, Q, T) layout


def test_sanitize_converts_only_code2wav_convs(ref):
    theirs, _ = ref
    raw = {PREFIX + k: v for k, v in checkpoint(theirs).items()}
    raw["thinker.some.conv.weight"] = mx.zeros((4, 3, 2))
    raw[PREFIX + "pre_transformer.rotary_emb.inv_freq"] = mx.zeros((8,))
    args = Code2WavArgs.from_dict(tiny_config_dict()["code2wav_config"])
    inferred = sanitize_code2wav_weights(raw)
    given = sanitize_code2wav_weights(raw, args=args)
    assert set(inferred) == set(given) == set(raw) - {PREFIX + "pre_transformer.rotary_emb.inv_freq"}
    for k in raw:
        if k in given:
            np.testing.assert_array_equal(np.array(inferred[k]), np.array(given[k]))
    assert inferred["thinker.some.conv.weight"].shape == (4, 3, 2)
    # (in, out, k) -> (out, k, in) for a transposed conv, (out, in, k) -> (out, k, in) otherwise
    assert inferred[PREFIX + "decoder.1.block.1.conv.weight"].shape == (16, 16, 32)
    assert inferred[PREFIX + "decoder.0.conv.weight"].shape == (32, 7, 32)
    assert inferred[PREFIX + "upsample.0.1.dwconv.conv.weight"].shape == (32, 7, 1)
    # a checkpoint already in MLX layout is left alone
    again = sanitize_code2wav_weights(inferred)
    for k in inferred:
        np.testing.assert_array_equal(np.array(again[k]), np.array(inferred[k]))
    # without args the conv shapes are read off the weights, in either layout
    for layout in (raw, inferred):
        shapes = _conv_shapes(layout, PREFIX)
        assert (shapes.hidden_size, shapes.decoder_dim) == (args.hidden_size, args.decoder_dim)
        assert shapes.upsample_rates == tuple(args.upsample_rates) == (8, 5, 4, 3)
        assert shapes.upsampling_ratios == tuple(args.upsampling_ratios) == (2, 2)
    # no Code2Wav in the checkpoint (a thinker-only one): nothing to do
    assert set(sanitize_code2wav_weights({"thinker.x": mx.zeros((2,))})) == {"thinker.x"}
