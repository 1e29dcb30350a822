"""Streamed NanoCodec decoding (metalgen/magpie/streaming.py) and MagpieTTS.stream on
dummy:magpie-tiny: chunked equals whole for several chunk schedules, the receptive field is the
context that makes it so, and stream's chunks are synthesize's waveform."""

from __future__ import annotations

import numpy as np
import pytest

from metalgen.errors import MetalgenError


@pytest.fixture(scope="module")
def tiny():
    from metalgen.magpie.dummy import load_dummy

    return load_dummy("magpie-tiny")


@pytest.fixture(scope="module")
def codes():
    return np.random.default_rng(0).integers(0, 2016, (8, 45))


def _streamed(codec, pieces, chunk, first, left=None, growth=None):
    from metalgen.magpie.streaming import CHUNK_GROWTH, stream_audio

    return list(stream_audio(codec, pieces, chunk, first, left, growth or CHUNK_GROWTH))


@pytest.mark.parametrize("chunk, first, piece, growth", [(1, None, 1, 4), (3, None, 2, 4), (7, 2, 2, 2), (7, 2, 2, 4),
                                                         (24, 4, 5, 2), (24, 1, 5, 3), (100, None, 45, 4)])
def test_chunked_equals_whole(tiny, codes, chunk, first, piece, growth):
    whole = tiny.decode(codes)
    pieces = [codes[:, i : i + piece] for i in range(0, codes.shape[1], piece)]
    out = _streamed(tiny.codec, pieces, chunk, first, growth=growth)
    assert all(o.dtype == np.float32 for o in out)
    np.testing.assert_allclose(np.concatenate(out), whole, rtol=0, atol=1e-6)
    # chunk sizes: the first, then growing `growth` times up to `chunk`, the rest at the end
    spf = tiny.samples_per_frame
    sizes = [o.shape[0] // spf for o in out]
    want, n, left = [], min(first or chunk, chunk), codes.shape[1]
    while left >= n:
        want.append(n)
        left -= n
        n = min(chunk, growth * n)
    assert sizes == want + ([left] if left else [])


def test_receptive_field_is_the_context_needed(tiny, codes):
    from metalgen.magpie.dummy import NANOCODEC
    from metalgen.magpie.streaming import receptive_frames
    from metalgen.models.magpie.codec import NanoCodecArgs

    # the published codec (8-8-4-2-2, kernels 3/7/11, dilations 1/3/5): 25 frames, 1.16 s
    assert receptive_frames(NanoCodecArgs.from_config(NANOCODEC)) == 25
    whole = tiny.decode(codes)
    r = receptive_frames(tiny.codec.args)
    exact = np.concatenate(_streamed(tiny.codec, [codes], 3, None, left=r))
    short = np.concatenate(_streamed(tiny.codec, [codes], 3, None, left=2))
    assert np.abs(exact - whole).max() <= 1e-6
    assert np.abs(short - whole).max() > 1e-2  # the check above is not vacuous


def test_stream_is_synthesize_in_chunks(tiny):
    wav, sr = tiny.synthesize("Hello there.", "en", "Aria", seed=3, max_frames=20)
    assert sr == 344 and wav.shape == (20 * 16,)
    chunks = list(tiny.stream("Hello there.", "en", "Aria", seed=3, max_frames=20, chunk_frames=8))
    assert [c.shape[0] // 16 for c in chunks] == [4, 8, 8]  # the first chunk after 4 frames
    grown = list(tiny.stream("Hello there.", "en", "Aria", seed=3, max_frames=20, chunk_frames=64))
    assert [c.shape[0] // 16 for c in grown] == [4, 16]  # then 4 times as many (CHUNK_GROWTH)
    np.testing.assert_allclose(np.concatenate(grown), wav, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(chunks), wav, rtol=0, atol=1e-6)
    fixed = list(tiny.stream("Hello there.", "en", "Aria", seed=3, max_frames=20, chunk_frames=6,
                             first_chunk_frames=None))
    assert [c.shape[0] // 16 for c in fixed] == [6, 6, 6, 2]


def test_stream_checks_before_the_first_chunk(tiny):
    # the request is checked when stream() is called, before any chunk is asked for
    with pytest.raises(MetalgenError, match="speaker 'Bob' is unknown"):
        tiny.stream("Hi.", "en", "Bob")
    for bad in (dict(chunk_frames=0), dict(first_chunk_frames=0), dict(chunk_growth=0)):
        with pytest.raises(MetalgenError, match="chunk_frames, first_chunk_frames and chunk_growth must be >= 1"):
            tiny.stream("Hi.", "en", **bad)
    with pytest.raises(MetalgenError, match="the text is empty"):
        tiny.stream("  ", "en")


def test_speaker_context_passes_through(tiny):
    # a speaker context (what voice cloning makes) is taken as is: a baked row as context gives the
    # baked speaker's audio
    import mlx.core as mx

    ctx = tiny.model.speaker_context(2)
    wav, _ = tiny.synthesize("Hello.", "en", ctx, seed=4, max_frames=6)
    baked, _ = tiny.synthesize("Hello.", "en", "John", seed=4, max_frames=6)
    np.testing.assert_array_equal(wav, baked)
    with pytest.raises(MetalgenError, match=r"speaker context must be \(1, frames, 32\)"):
        tiny.stream("Hello.", "en", mx.zeros((1, 4, 8)))


def test_compiled_chunk_decode_equals_the_eager_one(tiny, codes):
    # GPU backends stream the schedule's chunks through the decode traced by mx.compile (one trace per
    # codec, reused); forced on here: the same samples, and the flushed tail decodes eagerly
    from metalgen.magpie.streaming import CodecFrames, compiled_decode, schedule_lengths

    assert schedule_lengths(4, 64, 25, growth=2) == {4, 8 + 4, 16 + 12, 32 + 25, 64 + 25}  # chunk + its context
    assert schedule_lengths(None, 3, 2) == {3, 5} and schedule_lengths(2, 8, 0, growth=2) == {2, 4, 8}
    assert schedule_lengths(4, 64, 25) == {4, 16 + 4, 64 + 20, 64 + 25}  # growing x4, the default
    assert schedule_lengths(3, 8, 2, growth=1) == {3, 5}
    assert compiled_decode(tiny.codec) is compiled_decode(tiny.codec)
    eager = list(_streamed(tiny.codec, [codes], 8, 2))
    from metalgen.magpie.streaming import CodecStream

    stream = CodecStream(tiny.codec, 8, 2, compiled=True)
    frames = stream.decoder.decoder
    assert isinstance(frames, CodecFrames) and frames.compiled is not None
    assert frames.lengths == schedule_lengths(2, 8, stream.left_context)
    out = list(stream.push(codes)) + list(stream.flush())
    assert len(out) == len(eager)
    for a, b in zip(out, eager):
        # bit for bit on the CPU; a GPU's fused elementwise kernels may round a last bit otherwise
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)

