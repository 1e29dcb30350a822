"""NanoCodec decoding in chunks, while Magpie is still drawing frames.

NanoCodec's decoder (`CausalHiFiGANDecoder`) is causal throughout: every conv pads zeros on the
left only, the transposed convs cut their overhang on the right, the activations are pointwise.
So the samples of frame t depend on frames t - R .. t only, R being the decoder's receptive field
in frames (`receptive_frames`). Decoding frames [start - R, end) and keeping the samples of
[start, end) gives what the whole decode gives for those frames; the first chunk starts at frame
0, where the whole decode pads the same zeros. Chunked and whole decodes differ only by float
rounding (the GEMMs run over other lengths).

The chunk schedule and the bookkeeping are Qwen3-TTS's `StreamingDecoder`
(metalgen/models/qwen3_tts/speech_decoder.py): a short first chunk, then chunks growing (x4 here) up to
`chunk_frames`. `CodecFrames` adapts NanoCodec to the (B, T, Q) frames it takes.
"""

from __future__ import annotations

import math
import weakref
from typing import Callable, Dict, Iterable, Iterator, Optional, Set

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError

# Streamed chunks in codec frames (46.4 ms each at 22050 Hz): a first chunk of 4 frames (186 ms,
# two decoder steps of the current checkpoint) keeps the wait for the first audio short; each later
# chunk is 4 times the one before, up to 64 frames (3.0 s). A decode costs about the same at any of
# these lengths on a GPU (it is bound by its count of operations, and each chunk also recomputes the
# 25-frame left context), so fewer, longer chunks are faster: growing x4 instead of doubling took the
# codec from 0.79 to 0.57 ms a frame and the real-time factor from 23.7 to 26.6 (bf16, H200,
# docs/magpie.md 5.5). The player is never starved as long as generation runs at least 4x real time (the 16-frame
# second chunk must be ready while the first one plays); a slower machine passes chunk_growth=2.
FIRST_CHUNK_FRAMES = 4
CHUNK_FRAMES = 64
CHUNK_GROWTH = 4


def receptive_frames(args) -> int:
    """How many earlier codec frames reach the samples of a frame through NanoCodec's decoder
    (`args`: NanoCodecArgs). Walked from the output back to the latent: at each rate the past
    reach in samples grows by each causal conv's (kernel - 1) * dilation, and a transposed conv of
    kernel 2r and stride r maps a reach of P samples to ceil(P / r) + 1 input frames (its output
    sample n reads input frames n // r and n // r - 1)."""
    res = max(sum((k - 1) * d + (k - 1) for d in args.resblock_dilation_sizes) for k in args.resblock_kernel_sizes)
    reach = args.out_kernel_size - 1  # post_conv
    for rate in reversed(args.up_sample_rates):
        reach += res  # the res layer after this stage's upsampler
        kernel = 2 * rate
        reach = math.ceil(reach / rate) + (kernel // rate - 1)
    return reach + args.in_kernel_size - 1  # pre_conv


_COMPILED: Dict[int, Callable] = {}  # id(codec) -> its decode traced by mx.compile


def compiled_decode(codec) -> Callable:
    """`codec.decode` traced by mx.compile (its weights as inputs), one per codec for the process, so
    the traces of earlier utterances are reused (kept until the codec is collected)."""
    key = id(codec)
    fn = _COMPILED.get(key)
    if fn is None:
        fn = mx.compile(codec.decode, inputs=codec.state)
        _COMPILED[key] = fn
        weakref.finalize(codec, _COMPILED.pop, key, None)
    return fn


def schedule_lengths(first_chunk_frames: Optional[int], chunk_frames: int, left_context: int,
                     growth: int = CHUNK_GROWTH) -> Set[int]:
    """The frame counts (context included) that the pushed chunks of a stream decode: the growing
    chunks, then the steady `chunk_frames` + context. The last, flushed chunk may be any length."""
    lengths: Set[int] = set()
    start, n = 0, min(first_chunk_frames, chunk_frames) if first_chunk_frames else chunk_frames
    while True:
        lengths.add(n + min(left_context, start))
        if start >= left_context and (n == chunk_frames or growth == 1):
            return lengths
        start, n = start + n, min(chunk_frames, growth * n)


class CodecFrames:
    """NanoCodec seen as StreamingDecoder's decoder: codes (B, T, C) frames-first ->
    waveform (B, T * samples_per_frame).

    Chunks of the `compiled_lengths` decode through `compiled_decode` (the same samples: on the CPU
    bit for bit). A chunk's decode is about 1400 MLX operations; traced once, it is not rebuilt op
    by op for every chunk and its elementwise chains fuse (benchmarks/magpie_codec_probe.py). Only
    the schedule's own lengths are traced: every new length costs a trace, and the flushed last
    chunk's length changes from utterance to utterance (it decodes eagerly; padding it to a traced
    length was measured no faster, docs/magpie.md 5.5)."""

    def __init__(self, codec, compiled_lengths: Iterable[int] = ()):
        self.codec = codec
        self.total_upsample = int(codec.args.samples_per_frame)
        self.lengths = set(compiled_lengths)
        self.compiled = compiled_decode(codec) if self.lengths else None

    def __call__(self, frames: mx.array) -> mx.array:
        codes = frames.transpose(0, 2, 1)
        if self.compiled is not None and frames.shape[1] in self.lengths:
            return self.compiled(codes)
        return self.codec.decode(codes)


class CodecStream:
    """Codes (C, k) pieces in, float32 waveform pieces out.

    `push` takes the pieces `metalgen.magpie.generate.stream_codes` yields and returns the audio of
    every chunk that became complete; `flush` returns the rest. The concatenated output equals
    `codec.decode` of all the codes (to float rounding). `first_chunk_frames` None: every chunk
    is `chunk_frames` long. `left_context` None: the decoder's receptive field, the least that
    keeps chunked equal to whole. `compiled` (None: on GPU backends): the schedule's chunks decode
    through the traced decode (CodecFrames). `growth`: each chunk after the first is this many times
    the one before, up to `chunk_frames`."""

    def __init__(self, codec, chunk_frames: int = CHUNK_FRAMES,
                 first_chunk_frames: Optional[int] = FIRST_CHUNK_FRAMES, left_context: Optional[int] = None,
                 compiled: Optional[bool] = None, growth: int = CHUNK_GROWTH):
        import kernels_metal as K

        from ..models.qwen3_tts.speech_decoder import StreamingDecoder

        if chunk_frames < 1 or (first_chunk_frames is not None and first_chunk_frames < 1) or growth < 1:
            raise MetalgenError("chunk_frames, first_chunk_frames and the chunk growth must be >= 1")
        if left_context is None:
            left_context = receptive_frames(codec.args)
        if left_context < 0:
            raise MetalgenError("left_context must be >= 0")
        self.left_context = left_context
        if compiled is None:
            compiled = K.backend() != "cpu"  # where a decode is bound by its count of launches
        lengths = schedule_lengths(first_chunk_frames, chunk_frames, left_context, growth) if compiled else ()
        self.decoder = StreamingDecoder(CodecFrames(codec, lengths), chunk_frames, left_context, first_chunk_frames,
                                        growth=growth)

    @staticmethod
    def _host(piece: mx.array) -> np.ndarray:
        return np.array(piece[0].astype(mx.float32))

    def push(self, codes) -> Iterator[np.ndarray]:
        """Add codes (C, k) (numpy or MLX ints); yield the waveform of each completed chunk."""
        codes = mx.array(np.asarray(codes, dtype=np.int32)) if not isinstance(codes, mx.array) else codes
        if codes.shape[-1] == 0:
            return
        for piece in self.decoder.push(codes.astype(mx.int32).T[None]):
            yield self._host(piece)

    def flush(self) -> Iterator[np.ndarray]:
        """The waveform of the frames not yet decoded."""
        for piece in self.decoder.flush():
            yield self._host(piece)


def stream_audio(codec, pieces: Iterable, chunk_frames: int = CHUNK_FRAMES,
                 first_chunk_frames: Optional[int] = FIRST_CHUNK_FRAMES,
                 left_context: Optional[int] = None, growth: int = CHUNK_GROWTH) -> Iterator[np.ndarray]:
    """Codes (C, k) pieces -> float32 waveform chunks, each as soon as its frames exist."""
    stream = CodecStream(codec, chunk_frames, first_chunk_frames, left_context, growth=growth)
    for codes in pieces:
        yield from stream.push(codes)
    yield from stream.flush()
