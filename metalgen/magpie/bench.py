"""`metalgen bench --tts` on a Magpie checkpoint: real-time factor, time to first audio and where a
frame's time goes.

Two kinds of run, on a fixed English sentence, speaker 0, seed fixed, CFG on by default:

- streamed, the real pipeline: `MagpieTTS.stream` (the generation loop of
  `metalgen.magpie.generate.stream_codes` and the chunked NanoCodec decoder), every chunk read back
  to the host. **frame_ms** = wall / codec frames, **RTF** = audio seconds / wall seconds (higher is
  faster), **TTFA** = the call to the first audio chunk on the host (text encoding included).
- split, the same work through the frame loop's own pieces (`metalgen.magpie.frames`: on a GPU
  backend the fused decoder-step and LT kernels) with a barrier after each part:
  **text encoder** (`encode_text` + the decoder's cross-attention keys and values, once per
  utterance), **prefill** (the decoder on the speaker context and the BOS block, once per
  utterance), **decoder step** (one new position on the self-attention cache, both CFG rows, the
  attention prior on its layers), **local transformer** (the C * S draws of a decoder step,
  CFG-combined, masked and drawn on the device, each code embedded for the next), **codec** (the
  chunked decoder's calls and read-backs). The per-frame
  figures divide a step's by the frame stacking factor; their sum is the synchronized cost of a
  frame, which the streamed loop undercuts by overlapping host and device work.

Random weights almost never draw the audio EOS, and the bench makes sure they cannot: EOS stays
banned for every frame (`min_frames` = the frame count, a MagpieSampling field), so each run makes
exactly `frames` frames. Medians of `runs` runs after one warm-up.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Dict, List

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from .streaming import CHUNK_FRAMES, CHUNK_GROWTH, FIRST_CHUNK_FRAMES, CodecStream, receptive_frames

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the quiet green forest."


@dataclasses.dataclass
class MagpieBenchResult:
    engine: str
    frames: int
    text_encoder_ms: float  # once per utterance
    prefill_ms: float  # the decoder on [speaker context ; BOS], once per utterance
    decoder_step_ms: float  # per decoder step (frame_stacking_factor frames)
    local_transformer_step_ms: float  # per decoder step: C * S draws
    decoder_frame_ms: float
    local_transformer_frame_ms: float
    codec_frame_ms: float
    split_frame_ms: float  # the three per-frame parts summed
    frame_ms: float  # streamed wall / frames
    rtf: float
    ttfa_ms: float
    peak_memory_gb: float


def _frames_for(tts, frames: int) -> int:
    """`frames` rounded up to whole decoder steps (a step makes frame_stacking_factor frames)."""
    S = tts.model.args.frame_stacking_factor
    return -(-frames // S) * S


def streamed_run(tts, text: str, frames: int, cfg: bool, seed: int, chunk_frames: int,
                 first_chunk_frames: int, growth: int = CHUNK_GROWTH, speaker: int = 0):
    """The real pipeline. Returns (wall seconds, seconds to the first chunk, samples)."""
    mx.synchronize()
    tic = time.perf_counter()
    first = None
    samples = 0
    for chunk in tts.stream(text, "en", speaker, cfg=cfg, seed=seed, chunk_frames=chunk_frames,
                            first_chunk_frames=first_chunk_frames, chunk_growth=growth, max_frames=frames,
                            min_frames=frames):
        samples += chunk.shape[0]
        if first is None:
            first = time.perf_counter()
    return time.perf_counter() - tic, first - tic, samples


class SplitParts:
    """The generation's parts as separate, synchronized calls of the frame loop's own pieces
    (`metalgen.magpie.frames`), so each part runs on the path users get: on a GPU backend the fused
    decoder-step and LT kernels, elsewhere the model's MLX ops."""

    def __init__(self, tts, ids: List[int], cfg: bool, seed: int, frames: int, speaker: int = 0):
        self.tts = tts
        self.model = tts.model
        self.a = tts.model.args
        self.s = tts.sampling_for(max_frames=frames, min_frames=frames)
        self.ids, self.cfg, self.seed, self.frames, self.speaker = ids, cfg, seed, frames, speaker

    def text(self):
        """The loop's set-up: encode_text + the decoder's per-layer cross-attention keys and values
        (CFG rows), once per utterance."""
        from .frames import FrameLoop

        self.loop = loop = FrameLoop(self.model, self.ids, self.speaker, self.s, cfg=self.cfg,
                                     max_frames=self.frames, seed=self.seed)
        self.graph = loop.graphs[bool(self.s.apply_prior)]
        # EOS banned throughout, as in the streamed run (min_frames = frames).
        self.bad = loop.bad[True]
        # A fixed prior (the layers it applies to are the graph's): the same work as a real step's.
        self.prior = (mx.full((loop.rows, 1, loop.L), self.s.prior_epsilon, dtype=mx.float32)
                      if self.s.apply_prior else None)
        return loop.memory_kv

    def prefill(self):
        """[speaker context ; BOS block] through the decoder (once per utterance), and on the kernel
        path the caches and the text's keys and values stacked for it."""
        self.h, _, self.keys, self.values, self.offset = self.loop.prefill()
        return self.h, self.keys, self.values

    def local(self) -> mx.array:
        """The local transformer's C * S draws from the decoder state -> codes (S, C) int32."""
        self.codes = self.graph.draw(self.h, self.bad)
        return self.codes

    def decoder(self) -> mx.array:
        """One decoder step on the codes just drawn -> the next state."""
        audio = self.model.embed_codes(self.codes.T[None])  # (1, 1, d)
        x = mx.broadcast_to(audio, (self.loop.rows,) + audio.shape[1:])
        self.h, _, self.keys, self.values = self.graph.decode(x, self.prior, self.offset, self.keys, self.values,
                                                              self.loop.memory_kv, self.loop.memory_mask)
        self.offset = self.offset + 1
        return self.h


def _timed(fn) -> float:
    tic = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - tic


def split_run(tts, ids: List[int], frames: int, cfg: bool, seed: int, chunk_frames: int,
              first_chunk_frames: int, growth: int = CHUNK_GROWTH) -> Dict[str, float]:
    """Seconds per part: text encoder (once), decoder step and local transformer (per step), codec
    (per frame)."""
    parts = SplitParts(tts, ids, cfg, seed, frames)
    S = tts.model.args.frame_stacking_factor
    steps = frames // S
    t_text = _timed(parts.text)
    t_prefill = _timed(parts.prefill)
    stream = CodecStream(tts.codec, chunk_frames, first_chunk_frames, growth=growth)
    t_dec = t_lt = t_codec = 0.0
    for n in range(steps):
        t_lt += _timed(parts.local)
        codes = np.array(parts.codes, dtype=np.int64).T  # (C, S), as stream_codes yields them
        tic = time.perf_counter()
        for _ in stream.push(codes):
            pass
        t_codec += time.perf_counter() - tic
        # every step, the last included: the generation loop runs the decoder on each step's codes
        # as part of the step (the last one's state goes unused)
        t_dec += _timed(parts.decoder)
    tic = time.perf_counter()
    for _ in stream.flush():
        pass
    t_codec += time.perf_counter() - tic
    return dict(text=t_text, prefill=t_prefill, decoder_step=t_dec / steps, local_step=t_lt / steps,
                codec_frame=t_codec / frames)


def run_magpie_bench(tts, *, frames: int = 64, runs: int = 3, seed: int = 0, cfg: bool = True,
                     chunk_frames: int = CHUNK_FRAMES, first_chunk_frames: int = FIRST_CHUNK_FRAMES,
                     growth: int = CHUNK_GROWTH, text: str = TEXT) -> Dict[str, object]:
    """Benchmark `tts` (a metalgen.magpie.MagpieTTS): the report `metalgen bench --tts` prints and
    writes as JSON. `frames` codec frames a run (rounded up to whole decoder steps)."""
    if frames < 2 or runs < 1 or chunk_frames < 1 or first_chunk_frames < 1 or growth < 1:
        raise MetalgenError("need --frames >= 2, --runs >= 1, and --chunk-frames, --first-chunk-frames and "
                            "--chunk-growth >= 1")
    frames = _frames_for(tts, frames)
    a = tts.model.args
    ids = tts.encode(text, "en")
    spf = tts.samples_per_frame
    frame_s = spf / tts.sample_rate
    walls, ttfas, splits, peaks = [], [], [], []
    for run in range(runs + 1):
        mx.reset_peak_memory()
        wall, ttfa, samples = streamed_run(tts, text, frames, cfg, seed, chunk_frames, first_chunk_frames, growth)
        if samples != frames * spf:
            raise MetalgenError(f"the streamed run made {samples} samples, expected {frames * spf}")
        split = split_run(tts, ids, frames, cfg, seed, chunk_frames, first_chunk_frames, growth)
        if run == 0:
            continue  # warm-up: compilation, allocation
        walls.append(wall)
        ttfas.append(ttfa)
        splits.append(split)
        peaks.append(mx.get_peak_memory())
    med = {k: statistics.median(sp[k] for sp in splits) * 1e3 for k in splits[0]}
    S = a.frame_stacking_factor
    wall = statistics.median(walls)
    per_frame = dict(decoder_frame_ms=med["decoder_step"] / S, local_transformer_frame_ms=med["local_step"] / S,
                     codec_frame_ms=med["codec_frame"])
    result = MagpieBenchResult(
        engine="metalgen", frames=frames, text_encoder_ms=med["text"], prefill_ms=med["prefill"],
        decoder_step_ms=med["decoder_step"],
        local_transformer_step_ms=med["local_step"], **per_frame, split_frame_ms=sum(per_frame.values()),
        frame_ms=wall / frames * 1e3, rtf=frames * frame_s / wall, ttfa_ms=statistics.median(ttfas) * 1e3,
        peak_memory_gb=max(peaks) / 1e9,
    )
    from mlx.utils import tree_flatten

    s = tts.sampling
    return {
        "kind": "magpie",
        "backend": __import__("kernels_metal").backend(),
        "device": str(mx.default_device()),
        "model": tts.name,
        "text": text,
        "text_tokens": len(ids),
        "frames": frames,
        "frame_stacking": S,
        "codebooks": a.num_codebooks,
        "runs": runs,
        "cfg": cfg,
        "cfg_scale": s.cfg_scale,
        "temperature": s.temperature,
        "top_k": s.top_k,
        "chunk_frames": chunk_frames,
        "first_chunk_frames": first_chunk_frames,
        "chunk_growth": growth,
        "left_context": receptive_frames(tts.codec.args),
        "frame_audio_ms": frame_s * 1e3,
        "seed": seed,
        "dtype": str(tts.model.final_proj.weight.dtype).replace("mlx.core.", ""),
        "weight_gb": sum(v.nbytes for _, v in tree_flatten(tts.model.parameters())) / 1e9,
        "codec_weight_gb": sum(v.nbytes for _, v in tree_flatten(tts.codec.parameters())) / 1e9,
        "results": [dataclasses.asdict(result)],
    }
