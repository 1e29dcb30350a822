"""`metalgen bench --tts`: the Qwen3-TTS frame loop's speed, optionally next to the same loop
driven step by step through mlx-lm's Qwen3 model on the same weight arrays.

Per frame (80 ms of audio at 12 Hz): one talker step (forward, codec head, codebook-0 draw), 15
code-predictor steps (forwards, heads, draws, codebook embeddings) and the streamed speech
decoder's share (chunks of `chunk_frames` frames with 25 frames of left context, as
`TTSModel.stream` decodes). EOS is suppressed, so every run makes exactly `frames` frames.

Two kinds of timed run per engine, each a median over `runs` runs after one warm-up:

- streamed: the real pipeline (double-buffered frame loop, chunks decoded and read back as they
  complete). Gives the total ms per frame (wall / frames, prefill and flush included), the
  real-time factor (audio seconds / wall seconds) and the time to first audio (start of the
  prefill to the first chunk on the host).
- split: the same work with a barrier after each part, so each part can be timed on its own:
  talker ms/frame, code-predictor ms/frame, decoder ms/frame. Their sum is the synchronized cost;
  the streamed total is lower where the host's work overlaps the device's.

mlx-lm is imported only for compare="mlx-lm".
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Dict, List, Optional

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from ..sampling import make_repetition_penalty
from .api import FIRST_CHUNK_FRAMES
from .frames import FrameGenerator, SamplingConfig

TEXT = "The quick brown fox jumps over the lazy dog, and the speech engine reads it aloud."
LEFT_CONTEXT = 25


@dataclasses.dataclass
class TTSBenchResult:
    engine: str
    frames: int
    talker_ms: float  # per frame, split run
    predictor_ms: float  # the 15 code-predictor steps of one frame, split run
    decoder_ms: float  # streamed speech decoding, per frame, split run
    split_total_ms: float  # talker + predictor + decoder (synchronized)
    frame_ms: float  # streamed run: wall / frames
    rtf: float  # audio seconds / wall seconds, streamed run
    ttfa_ms: float  # time to first audio chunk, streamed run
    peak_memory_gb: float


# ---- the two engines -------------------------------------------------------------------------


class MetalgenEngine:
    """Our frame loop: FrameGenerator (kernels_metal sampler, the talker and code predictor on the
    decode path `decode` picks: the CUDA megakernel under "auto" where it runs)."""

    name = "metalgen"

    def __init__(self, tts, prompt, sampling: SamplingConfig, decode: Optional[str] = "auto"):
        self.tts = tts
        self.prompt = prompt
        self.sampling = sampling
        self.decode = decode

    def generator(self, seed: int):
        return FrameGenerator(self.tts.model, self.prompt, self.sampling, seed=seed, decode=self.decode)

    def frames(self, seed: int):
        return self.generator(seed).frames()

    def split_parts(self, seed: int):
        """(prefill, predictor, talker) closures over one generator's state."""
        gen = self.generator(seed)
        st = {}

        def prefill():
            st["last"], logits = gen.prefill()
            st["code0"] = gen._pick0(logits, None, 0)
            st["history"] = st["code0"]
            return [st["code0"], st["last"]]

        def predictor():
            codes, total, _ = gen.predict(st["last"], st["code0"])
            st["total"] = total
            return codes

        def talker(step: int):
            st["last"], logits = gen.talk(gen.talker_input(st["total"], step))
            st["code0"] = gen._pick0(logits, st["history"], step + 1)
            st["history"] = mx.concatenate([st["history"], st["code0"]])
            return [st["code0"], st["last"]]

        return prefill, predictor, talker


class MlxLmTwin:
    """The same frame loop driven through mlx-lm: `mlx_lm.models.qwen3.Model` for the talker and
    for the code predictor, holding our weight arrays, mlx-lm's KVCache, mlx-lm's sampler
    (plain MLX: top-k, categorical). The talker's M-RoPE becomes mlx-lm's plain RoPE, which
    equals it for text-only positions (docs/tts.md)."""

    name = "mlx-lm"

    def __init__(self, tts, prompt, sampling: SamplingConfig):
        try:
            from mlx_lm.models import qwen3
            from mlx_lm.models.cache import KVCache
            from mlx_lm.sample_utils import make_sampler
        except ImportError:
            raise MetalgenError("--compare mlx-lm needs mlx-lm: pip install 'metalgen[bench]'")
        import mlx.nn as nn
        from mlx.utils import tree_flatten

        self.KVCache = KVCache
        self.tts = tts
        self.prompt = prompt
        self.sampling = sampling
        # the same penalty arithmetic as our frame loop (mlx-lm's keeps only a 20-token window)
        self.penalize = (make_repetition_penalty(sampling.repetition_penalty, sampling.max_frames)
                         if sampling.repetition_penalty != 1.0 else None)
        talker = tts.model.talker
        cp = talker.code_predictor
        self.talker_lm = self._twin(qwen3, talker.args, talker.model, talker.model.codec_embedding.weight,
                                    talker.codec_head.weight, tree_flatten)
        cp_args = cp.args
        self.cp_lm = self._twin(qwen3, cp_args, cp.model, cp.lm_head[0].weight, cp.lm_head[0].weight,
                                tree_flatten)
        # 15 heads (mlx-lm's model has one) and the optional projection, as mlx nn.Linear layers
        # on the same arrays.
        self.heads = []
        for head in cp.lm_head:
            lin = nn.Linear(1, 1, bias=False)
            lin.weight = head.weight
            self.heads.append(lin)
        self.proj = None
        if "small_to_mtp_projection" in cp:
            self.proj = nn.Linear(1, 1, bias=True)
            self.proj.weight = cp.small_to_mtp_projection.weight
            self.proj.bias = cp.small_to_mtp_projection.bias
        self.cp_embed = cp.model.codec_embedding  # mlx nn.Embedding modules
        self.groups = talker.args.num_code_groups
        vocab = talker.args.vocab_size
        eos = talker.args.codec_eos_token_id
        mask = np.zeros((vocab,), np.float32)
        mask[max(0, vocab - 1024):] = -np.inf
        mask[eos] = -np.inf  # EOS suppressed: every run makes exactly `frames` frames
        self.suppress = mx.array(mask)

        def lm_sampler(temp, top_k, top_p):
            return make_sampler(temp, top_p=top_p if 0 < top_p < 1 else 0.0, top_k=top_k)

        self.sample0 = lm_sampler(sampling.temperature, sampling.top_k, sampling.top_p)
        self.sample_sub = lm_sampler(sampling.sub_temperature, sampling.sub_top_k, sampling.sub_top_p)

    @staticmethod
    def _twin(qwen3, args, stack, embed_weight, head_weight, tree_flatten):
        spec = stack.spec
        lm_args = qwen3.ModelArgs(
            model_type="qwen3", hidden_size=spec.hidden_size, num_hidden_layers=spec.num_hidden_layers,
            intermediate_size=spec.intermediate_size, num_attention_heads=spec.num_attention_heads,
            rms_norm_eps=spec.rms_norm_eps, vocab_size=spec.vocab_size,
            num_key_value_heads=spec.num_key_value_heads, max_position_embeddings=spec.max_position_embeddings,
            head_dim=spec.head_dim, tie_word_embeddings=False, rope_theta=float(args.rope_theta),
        )
        twin = qwen3.Model(lm_args)
        weights = [(f"model.{k}", v) for k, v in tree_flatten(stack.parameters())
                   if k.startswith(("layers.", "norm."))]
        weights += [("model.embed_tokens.weight", embed_weight), ("lm_head.weight", head_weight)]
        twin.load_weights(weights, strict=True)
        twin.eval()
        return twin

    @staticmethod
    def _draw(sampler, logits):
        logits = logits.astype(mx.float32)
        return sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))

    def _pick0(self, logits, history):
        logits = logits.astype(mx.float32)
        if history is not None and self.penalize is not None:
            logits = self.penalize(history, logits)
        return self._draw(self.sample0, logits + self.suppress).astype(mx.int32)  # (1,)

    def _frame(self, last_hidden, code0):
        e0 = self.talker_lm.model.embed_tokens(code0[None])
        cache = [self.KVCache() for _ in self.cp_lm.layers]
        x = mx.concatenate([last_hidden, e0], axis=1)
        if self.proj is not None:
            x = self.proj(x)
        h = self.cp_lm.model(None, cache, input_embeddings=x)
        logits = self.heads[0](h[:, -1, :])
        codes, total = [code0], e0
        for g in range(1, self.groups):
            token = self._draw(self.sample_sub, logits).astype(mx.int32)
            codes.append(token)
            e = self.cp_embed[g - 1](token[None])
            total = total + e
            if g < self.groups - 1:
                x = e if self.proj is None else self.proj(e)
                h = self.cp_lm.model(None, cache, input_embeddings=x)
                logits = self.heads[g](h[:, -1, :])
        return mx.concatenate(codes), total

    def _talker(self, x, cache):
        h = self.talker_lm.model(None, cache, input_embeddings=x)
        return h[:, -1:, :], self.talker_lm.lm_head(h[:, -1, :])

    def _extra(self, step):
        t = self.prompt.trailing
        return t[:, step : step + 1] if step < t.shape[1] else self.prompt.pad

    def _step(self, logits, last, history, step, cache):
        code0 = self._pick0(logits, history)
        codes, total = self._frame(last, code0)
        hidden, next_logits = self._talker(total + self._extra(step), cache)
        history = code0 if history is None else mx.concatenate([history, code0])
        return dict(codes=codes, next_logits=next_logits, hidden=hidden, history=history)

    def frames(self, seed: int):
        """As FrameGenerator.frames: frame n+1 is enqueued before frame n is read back."""
        mx.random.seed(seed)
        cache = [self.KVCache() for _ in self.talker_lm.layers]
        last, logits = self._talker(self.prompt.embeddings, cache)
        pending = self._step(logits, last, None, 0, cache)
        mx.async_eval(pending["codes"], pending["next_logits"])
        for step in range(self.sampling.max_frames):
            cur = pending
            if step + 1 < self.sampling.max_frames:
                pending = self._step(cur["next_logits"], cur["hidden"], cur["history"], step + 1, cache)
                mx.async_eval(pending["codes"], pending["next_logits"])
            yield np.array(cur["codes"])

    def split_parts(self, seed: int):
        st = {}

        def prefill():
            mx.random.seed(seed)
            st["cache"] = [self.KVCache() for _ in self.talker_lm.layers]
            st["last"], logits = self._talker(self.prompt.embeddings, st["cache"])
            st["code0"] = self._pick0(logits, None)
            st["history"] = st["code0"]
            return [st["code0"], st["last"]]

        def predictor():
            codes, st["total"] = self._frame(st["last"], st["code0"])
            return codes

        def talker(step: int):
            st["last"], logits = self._talker(st["total"] + self._extra(step), st["cache"])
            st["code0"] = self._pick0(logits, st["history"])
            st["history"] = mx.concatenate([st["history"], st["code0"]])
            return [st["code0"], st["last"]]

        return prefill, predictor, talker


# ---- timing ----------------------------------------------------------------------------------


def streamed_run(engine, decoder, frames: int, chunk: int, seed: int, first_chunk: Optional[int] = None):
    """The real pipeline: frames -> StreamingDecoder -> audio chunks on the host.
    Returns (wall seconds, time to first audio seconds, samples, frames made)."""
    from ..models.qwen3_tts.speech_decoder import StreamingDecoder

    mx.synchronize()
    tic = time.perf_counter()
    dec = StreamingDecoder(decoder, chunk, LEFT_CONTEXT, first_chunk)
    first = None
    samples = made = 0
    for frame in engine.frames(seed):
        made += 1
        for piece in dec.push(mx.array(frame[None, None].astype(np.int32))):
            audio = np.array(piece[0].astype(mx.float32))
            samples += audio.shape[0]
            if first is None:
                first = time.perf_counter()
    for piece in dec.flush():
        audio = np.array(piece[0].astype(mx.float32))
        samples += audio.shape[0]
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    return end - tic, first - tic, samples, made


def split_run(engine, decoder, frames: int, chunk: int, seed: int, first_chunk: Optional[int] = None):
    """The same work with a barrier after each part: seconds (talker, predictor, decoder) over
    the run's frames (the prefill and the first codebook-0 draw are left out)."""
    from ..models.qwen3_tts.speech_decoder import StreamingDecoder

    prefill, predictor, talker = engine.split_parts(seed)
    mx.eval(prefill())
    dec = StreamingDecoder(decoder, chunk, LEFT_CONTEXT, first_chunk)
    t_talk = t_pred = t_dec = 0.0
    for step in range(frames):
        tic = time.perf_counter()
        codes = np.array(predictor())
        t_pred += time.perf_counter() - tic
        if step + 1 < frames:  # the last frame's talker step would feed a frame never made
            tic = time.perf_counter()
            mx.eval(talker(step))
            t_talk += time.perf_counter() - tic
        tic = time.perf_counter()
        for piece in dec.push(mx.array(codes[None, None].astype(np.int32))):
            np.array(piece[0].astype(mx.float32))
        t_dec += time.perf_counter() - tic
    tic = time.perf_counter()
    for piece in dec.flush():
        np.array(piece[0].astype(mx.float32))
    t_dec += time.perf_counter() - tic
    return t_talk / max(frames - 1, 1), t_pred / frames, t_dec / frames


def time_engine(engine, decoder, frames: int, chunk: int, runs: int, seed: int, frame_s: float,
                first_chunk: Optional[int] = None) -> TTSBenchResult:
    walls, ttfas, parts, peaks = [], [], [], []
    for run in range(runs + 1):
        mx.reset_peak_memory()
        wall, ttfa, samples, made = streamed_run(engine, decoder, frames, chunk, seed, first_chunk)
        if made != frames or samples != frames * decoder.total_upsample:
            raise MetalgenError(f"{engine.name}: made {made} frames / {samples} samples, "
                                f"expected {frames} / {frames * decoder.total_upsample}")
        split = split_run(engine, decoder, frames, chunk, seed, first_chunk)
        if run == 0:
            continue  # warm-up: compilation, allocation
        walls.append(wall)
        ttfas.append(ttfa)
        parts.append(split)
        peaks.append(mx.get_peak_memory())
    wall = statistics.median(walls)
    talk, pred, dec = (statistics.median(p[i] for p in parts) * 1e3 for i in range(3))
    return TTSBenchResult(
        engine=engine.name, frames=frames, talker_ms=talk, predictor_ms=pred, decoder_ms=dec,
        split_total_ms=talk + pred + dec, frame_ms=wall / frames * 1e3, rtf=frames * frame_s / wall,
        ttfa_ms=statistics.median(ttfas) * 1e3, peak_memory_gb=max(peaks) / 1e9,
    )


def run_tts_bench(tts, *, frames: int = 64, runs: int = 3, compare: Optional[str] = None, seed: int = 0,
                  chunk_frames: int = 12, first_chunk_frames: int = FIRST_CHUNK_FRAMES, decode: Optional[str] = "auto",
                  text: str = TEXT) -> Dict[str, object]:
    """Benchmark the TTS frame loop on `tts` (a metalgen.tts.TTSModel); compare="mlx-lm" also
    drives it through mlx-lm's Qwen3 model on the same weights. Both engines stream with the
    same chunk schedule (the first chunk after `first_chunk_frames`, doubling up to
    `chunk_frames`); `decode` is metalgen's decode path for the talker and code predictor."""
    if frames < 2 or runs < 1 or chunk_frames < 1 or first_chunk_frames < 1:
        raise MetalgenError("need --frames >= 2, --runs >= 1 and --chunk-frames >= 1")
    if compare not in (None, "mlx-lm"):
        raise MetalgenError(f"unknown comparison '{compare}' (supported: mlx-lm)")
    kind = tts.model_type
    opts = {}
    if kind == "custom_voice":
        opts = dict(speaker=tts.speakers[0], language="english")
    elif kind == "voice_design":
        opts = dict(instruct="A calm, clear voice.", language="english")
    else:
        raise MetalgenError(f"bench --tts runs CustomVoice and VoiceDesign models, not {kind}")
    prompt, _ = tts.prepare(text, **opts)
    mx.eval(prompt.embeddings, prompt.trailing, prompt.pad)
    # EOS suppressed for every frame (min_frames = frames): exactly `frames` frames a run.
    sampling = tts.sampling(max_frames=frames, min_frames=frames)
    engines = [MetalgenEngine(tts, prompt, sampling, decode)]
    if compare == "mlx-lm":
        engines.append(MlxLmTwin(tts, prompt, sampling))
    decoder = tts.speech.decoder
    frame_s = decoder.total_upsample / tts.sample_rate
    results: List[TTSBenchResult] = [
        time_engine(e, decoder, frames, chunk_frames, runs, seed, frame_s, first_chunk_frames) for e in engines
    ]
    paths = engines[0].generator(seed).paths
    from mlx.utils import tree_flatten

    out = {
        "backend": __import__("kernels_metal").backend(),
        "device": str(mx.default_device()),
        "model": tts.name,
        "prompt_tokens": int(prompt.embeddings.shape[1]),
        "frames": frames,
        "runs": runs,
        "chunk_frames": chunk_frames,
        "first_chunk_frames": first_chunk_frames,
        "paths": paths,
        "left_context": LEFT_CONTEXT,
        "frame_audio_ms": frame_s * 1e3,
        "seed": seed,
        "talker_weight_gb": sum(v.nbytes for _, v in tree_flatten(tts.model.parameters())) / 1e9,
        "results": [dataclasses.asdict(r) for r in results],
    }
    if len(results) == 2:
        a, b = results
        out["frame_ratio"] = b.frame_ms / a.frame_ms  # > 1: metalgen is faster
        out["split_ratio"] = b.split_total_ms / a.split_total_ms
        out["ttfa_ratio"] = b.ttfa_ms / a.ttfa_ms
    return out
