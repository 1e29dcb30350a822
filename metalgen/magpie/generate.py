"""Magpie TTS generation loop: text ids + a baked speaker -> codec codes (C, T).

This follows NeMo 3.0.0's `MagpieTTSModel.infer_batch` (which `generate_speech`, the `do_tts`
path, matches for a single chunk) with `use_local_transformer_for_inference=True` and
`use_kv_cache_for_inference: false`, the default: every step reruns the decoder on the whole
sequence `[speaker context ; BOS block ; codes so far]`. Per step:

1. decoder forward, CFG as two rows (row 1: zero text memory with only position 0 unmasked,
   zero speaker context), the attention prior of the previous step on its layers;
2. the next step's attention prior, from this step's (prior-modified) cross-attention;
3. the local transformer draws the C * S codes of the step, one per LT step, with CFG applied to
   every LT head's logits, forbidden special ids masked and EOS banned before `min_frames`;
4. EOS: the first stacked frame where the drawn codes or the argmax of the CFG-combined
   `final_proj` logits show AUDIO_EOS (`eos_detection`, default "argmax_or_multinomial_any").

docs/magpie.md section 2 lists the NeMo facts this follows. This loop is the reference (slow, host
side); `stream_codes` runs NeMo's KV-cached mode from `metalgen.magpie.frames` unless asked to
recompute.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from .chunking import ChunkProgress, ChunkState, ChunkWindow

# NeMo 3.0.0 hard-codes these in get_most_attended_text_timestep / construct_inference_prior
# (later NeMo versions read a sink threshold from the inference parameters).
SINK_SKIP_COUNT = 8  # a text position attended this often is stepped over when searching
SINK_PENALTY_COUNT = 10  # ... and this often pushes the prior of it and all before it to epsilon
SHORT_TEXT = 5  # texts of at most this many tokens get a flat prior (all ones)
IGNORED_TAIL = 3  # the last text positions never chosen as the attended one
N_SPECIAL = 8  # special audio ids codebook_size + 0..7

_EOS_METHODS = {
    "argmax_any": ("argmax", "any"),
    "argmax_or_multinomial_any": ("both", "any"),
    "argmax_all": ("argmax", "all"),
    "argmax_or_multinomial_all": ("both", "all"),
    "argmax_zero_cb": ("argmax", "zero_cb"),
    "argmax_or_multinomial_zero_cb": ("both", "zero_cb"),
}


@dataclasses.dataclass
class MagpieSampling:
    """Inference parameters (NeMo's `ModelInferenceParameters` defaults; `from_config` reads the
    checkpoint's `inference_parameters`). `max_frames` and `min_frames` count codec frames."""

    temperature: float = 0.7  # <= 0: argmax
    top_k: int = 80
    cfg_scale: float = 2.5
    apply_prior: bool = True
    prior_epsilon: float = 0.1
    prior_window: int = 5  # attention_prior_lookahead_window
    estimate_alignment_from_layers: Optional[Sequence[int]] = None  # None: every decoder layer
    apply_prior_to_layers: Optional[Sequence[int]] = None  # None: every decoder layer
    start_prior_after: int = 0  # decoder steps before the prior is first built
    min_frames: int = 4  # EOS is banned while step * S < min_frames
    max_frames: int = 500
    eos_detection: str = "argmax_or_multinomial_any"

    def __post_init__(self):
        if self.eos_detection not in _EOS_METHODS:
            raise MetalgenError(f"Magpie eos_detection_method '{self.eos_detection}' is unknown")
        if self.top_k < 1:
            raise MetalgenError("Magpie top_k must be at least 1")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], **overrides) -> "MagpieSampling":
        """From model_config.yaml's dict (its `inference_parameters`, legacy names included)."""
        ip = dict(cfg.get("inference_parameters") or {})
        names = {
            "temperature": "temperature",
            "topk": "top_k",
            "cfg_scale": "cfg_scale",
            "apply_attention_prior": "apply_prior",
            "attention_prior_epsilon": "prior_epsilon",
            "prior_epsilon": "prior_epsilon",  # legacy name
            "attention_prior_lookahead_window": "prior_window",
            "lookahead_window_size": "prior_window",  # legacy name
            "estimate_alignment_from_layers": "estimate_alignment_from_layers",
            "apply_prior_to_layers": "apply_prior_to_layers",
            "start_prior_after_n_audio_steps": "start_prior_after",
            "min_generated_frames": "min_frames",
            "max_decoder_steps": "max_frames",
            "eos_detection_method": "eos_detection",
        }
        kw = {ours: ip[theirs] for theirs, ours in names.items() if theirs in ip and ip[theirs] is not None}
        for key in ("estimate_alignment_from_layers", "apply_prior_to_layers"):
            if key in kw:
                kw[key] = [int(i) for i in kw[key]]
        kw.update(overrides)
        return cls(**kw)


# --------------------------------------------------------------------------------------- helpers


def _forbidden_mask(V: int, codebook_size: int, eos_id: int, forbid_eos: bool) -> mx.array:
    """(V,) bool: the special ids never drawn (all but AUDIO_EOS, and EOS too when `forbid_eos`)."""
    ids = np.arange(V)
    bad = (ids >= codebook_size) & (ids < codebook_size + N_SPECIAL)
    if not forbid_eos:
        bad &= ids != eos_id
    return mx.array(bad)


def _draw(logits: mx.array, temperature: float, top_k: int, key: Optional[mx.array]) -> int:
    """One code from logits (V,) already masked: NeMo keeps every logit >= the k-th largest
    (ties kept), then argmax when temperature <= 0, else a draw from softmax(logits / T)."""
    if temperature <= 0:
        return int(mx.argmax(logits).item())
    k = min(top_k, logits.shape[-1])
    kth = mx.sort(logits)[-k]
    kept = mx.where(logits < kth, -mx.inf, logits)
    return int(mx.random.categorical(kept / temperature, key=key).item())


def _eos_frame(codes: np.ndarray, eos_id: int, kind: str) -> Optional[int]:
    """First stacked frame (codes (C, S)) that signals EOS, or None."""
    hit = codes == eos_id
    if kind == "any":
        per_frame = hit.any(axis=0)
    elif kind == "all":
        per_frame = hit.all(axis=0)
    else:  # zero_cb
        per_frame = hit[0]
    idx = np.flatnonzero(per_frame)
    return int(idx[0]) if idx.size else None


def _attended_position(scores: np.ndarray, last: int, counter: Dict[int, int], text_len: int, window: int) -> int:
    """NeMo's get_most_attended_text_timestep for one row: search [last, last + window) clipped
    to text_len - 3, after stepping over an attention sink at `last`; updates `counter`."""
    if counter.get(last, 0) >= SINK_SKIP_COUNT:
        last += 1
    end = min(last + window, text_len - IGNORED_TAIL)
    seg = scores[last:end]
    attended = text_len - 1 if seg.size == 0 else last + int(np.argmax(seg))
    counter[attended] = counter.get(attended, 0) + 1
    return attended


def _prior_row(attended: int, counter: Dict[int, int], text_len: int, window: int, eps: float) -> np.ndarray:
    """NeMo's construct_inference_prior for one row: epsilon everywhere, 1 at attended - 1
    (not below 1), attended, and the next `window` positions (clipped to the end); positions
    attended too often push themselves and everything before back to epsilon."""
    row = np.full((text_len,), eps, dtype=np.float32)
    if text_len <= SHORT_TEXT:
        row[:] = 1.0
    else:
        row[max(1, attended - 1)] = 1.0
        row[attended] = 1.0
        for d in range(1, window + 1):
            row[min(attended + d, text_len - 1)] = 1.0
    for pos, n in counter.items():
        if n >= SINK_PENALTY_COUNT:
            row[: pos + 1] = eps
    return row


# --------------------------------------------------------------------------------------- loop


def generate_codes(
    model,
    text_ids,
    speaker: Union[int, mx.array],
    sampling: Optional[MagpieSampling] = None,
    cfg: bool = True,
    max_frames: Optional[int] = None,
    seed: Optional[int] = None,
    record: Optional[Dict[str, Any]] = None,
    recompute: bool = False,
) -> np.ndarray:
    """Codes (C, T) int64 for one utterance: `stream_codes`'s pieces joined."""
    return join_codes(model, stream_codes(model, text_ids, speaker, sampling, cfg, max_frames, seed, record,
                                          recompute))


def join_codes(model, pieces: Iterable[np.ndarray]) -> np.ndarray:
    """(C, k) code pieces -> codes (C, T) int64 (T = 0: none)."""
    pieces = list(pieces)
    return np.concatenate(pieces, axis=1) if pieces else np.zeros((model.args.num_codebooks, 0), np.int64)


def stream_codes(
    model,
    text_ids,
    speaker: Union[int, mx.array],
    sampling: Optional[MagpieSampling] = None,
    cfg: bool = True,
    max_frames: Optional[int] = None,
    seed: Optional[int] = None,
    record: Optional[Dict[str, Any]] = None,
    recompute: bool = False,
) -> Iterator[np.ndarray]:
    """Yields the codes of one utterance as (C, k) int64 pieces, each final when yielded (the
    EOS frame and what follows it are never yielded).

    By default this is the fast loop of `metalgen.magpie.frames` (NeMo's KV-cached decoder mode).
    `recompute=True` runs NeMo's default uncached loop instead (the whole sequence every step; a
    reference, slow), whose greedy codes equal `do_tts`'s.

    `model`: `metalgen.models.magpie.model.Model`. `text_ids`: the token ids fed to the model,
    (L,) or (1, L), text EOS last and no BOS (as do_tts builds them). `speaker`: baked speaker
    index, or a speaker context (1, T_ctx, d) made from reference audio. `cfg`: classifier-free
    guidance with `sampling.cfg_scale`. `max_frames` overrides `sampling.max_frames`. `seed` seeds the draws when temperature > 0. `record`, when a dict,
    receives per-step diagnostics: "attended" (text position per step), "priors" (the prior row
    built after each step), "end_frame" (the EOS frame or None), "steps"."""
    if not recompute:
        from .frames import FrameLoop

        yield from FrameLoop(model, text_ids, speaker, sampling, cfg, max_frames, seed).pieces(record)
        return
    yield from _stream_recompute(model, text_ids, speaker, sampling, cfg, max_frames, seed, record)


def stream_chunks(
    model,
    chunks: Sequence[Sequence[int]],
    speaker: Union[int, mx.array],
    sampling: Optional[MagpieSampling] = None,
    cfg: bool = True,
    max_frames: Optional[int] = None,
    seed: Optional[int] = None,
    record: Optional[Dict[str, Any]] = None,
    recompute: Optional[bool] = None,
) -> Iterator[np.ndarray]:
    """Yields the codes of a text given as chunks (each chunk's ids: tokens + text EOS, as
    `metalgen.magpie.chunking.chunk_ids` makes them), chunk after chunk, as NeMo's `do_tts` joins
    them. One chunk is exactly `stream_codes`. Several run NeMo's multi-chunk `generate_speech`
    once per chunk with `chunking.ChunkState` carried across; `max_frames` then bounds each chunk.

    `recompute`: None or False runs the fast loop (metalgen.magpie.frames, NeMo's decoder cache reset
    before each chunk), True the recompute loop (NeMo's default: `do_tts` never turns the cache on).
    `record`, when a dict, gets "chunks": one `stream_codes` record per chunk (plus "forced_end",
    "window" and "left_offset")."""
    chunks = [list(c) for c in chunks]
    if not chunks:
        raise MetalgenError("Magpie: no text chunks to speak")
    if len(chunks) == 1:
        inner: Optional[Dict[str, Any]] = {} if record is not None else None
        yield from stream_codes(model, chunks[0], speaker, sampling, cfg, max_frames, seed, inner,
                                recompute=bool(recompute))
        if record is not None:
            record["chunks"] = [inner]
        return
    state = ChunkState()
    # One random stream across the chunks, as NeMo's global generator runs on from chunk to chunk.
    if recompute:
        key = mx.random.key(seed if seed is not None else int(np.random.SeedSequence().entropy % (2**63)))
    else:
        from ..sampling import make_sampler
        from .frames import FrameLoop

        s = sampling or MagpieSampling()
        sampler = make_sampler(max(0.0, float(s.temperature)), int(s.top_k), seed=seed)
    if record is not None:
        record["chunks"] = []
    for i, ids in enumerate(chunks):
        window = state.open(ids, last=i == len(chunks) - 1)
        inner = {} if record is not None else None
        if recompute:
            key, sub = mx.random.split(key)
            yield from _stream_recompute(model, ids, speaker, sampling, cfg, max_frames, None, inner,
                                         chunk=(state, window), key=sub)
        else:
            loop = FrameLoop(model, ids, speaker, sampling, cfg, max_frames, chunk=(state, window), sampler=sampler)
            yield from loop.pieces(inner)
        if record is not None:
            record["chunks"].append(inner)


def generate_chunks(model, chunks, speaker, sampling=None, cfg=True, max_frames=None, seed=None, record=None,
                    recompute=None) -> np.ndarray:
    """Codes (C, T) int64 of a chunked text: `stream_chunks`'s pieces joined."""
    return join_codes(model, stream_chunks(model, chunks, speaker, sampling, cfg, max_frames, seed, record,
                                           recompute))


def _stream_recompute(model, text_ids, speaker, sampling, cfg, max_frames, seed, record,
                      chunk: Optional[Tuple[ChunkState, ChunkWindow]] = None,
                      key: Optional[mx.array] = None) -> Iterator[np.ndarray]:
    """NeMo's uncached inference loop (see stream_codes). `chunk`, one chunk of a long text as
    (the state carried across chunks, this chunk's window), runs it as NeMo's `generate_speech`
    does for that chunk: `text_ids` is then ignored for the window's ids, the history rows of the
    text memory come from the previous chunk, later chunks start from a prior and use the
    multi-chunk one, and a chunk that is not the last ends on its EOS or is cut once its alignment
    has stayed near its end (chunking.ChunkProgress). `key`, when given, replaces `seed`."""
    s = sampling or MagpieSampling()
    a = model.args
    if "local_transformer" not in model or a.local_transformer_type != "autoregressive":
        raise MetalgenError("Magpie generation needs an autoregressive local transformer")
    C, S, V = a.num_codebooks, a.frame_stacking_factor, a.num_tokens_per_codebook
    eos_id = a.audio_eos_id
    stream_kind, eos_kind = _EOS_METHODS[s.eos_detection]
    limit = int(s.max_frames if max_frames is None else max_frames)
    n_layers = a.decoder.n_layers

    state, window = chunk if chunk is not None else (None, None)
    ids = np.asarray(text_ids if window is None else window.ids, dtype=np.int64).reshape(1, -1)
    L = ids.shape[1]
    memory = model.encode_text(mx.array(ids))  # (1, L, d)
    if window is not None:
        memory = state.splice(window, memory)
    # A baked speaker's row, or a context already encoded (reference-audio cloning).
    ctx = speaker if isinstance(speaker, mx.array) else model.speaker_context(speaker)  # (1, Tc, d)
    if cfg:
        memory = mx.concatenate([memory, mx.zeros_like(memory)], axis=0)
        memory_mask = mx.array(np.stack([np.ones(L, bool), np.arange(L) == 0]))
        ctx = mx.concatenate([ctx, mx.zeros_like(ctx)], axis=0)
    else:
        memory_mask = None
    rows = ctx.shape[0]
    memory_kv = model.decoder_memory(memory)  # constant over the utterance
    mx.eval(memory_kv, ctx)

    if key is None:
        key = mx.random.key(seed if seed is not None else int(np.random.SeedSequence().entropy % (2**63)))
    codes = np.full((C, S), a.audio_bos_id, dtype=np.int64)  # BOS block, then each step's (C, S)
    produced: List[np.ndarray] = []
    prior = None  # (rows, 1, L), from the previous step
    progress = None
    if window is not None:
        progress = ChunkProgress(state, window, s.prior_window, s.prior_epsilon)
        first_row = window.initial_prior(s.prior_epsilon, state.rules)
        if first_row is not None:
            # Later chunks start steered to their first new tokens; without the attention prior
            # NeMo keeps this one for the whole chunk.
            full = np.full((rows, 1, L), s.prior_epsilon, dtype=np.float32)
            full[0, 0] = first_row
            prior = mx.array(full)
    last_attended = 1
    counter: Dict[int, int] = {}
    end_frame: Optional[int] = None
    forced = False
    if record is not None:
        record.update(attended=[], priors=[], end_frame=None, steps=0)

    want_attention = s.apply_prior
    est_layers = range(n_layers) if s.estimate_alignment_from_layers is None else s.estimate_alignment_from_layers
    for step in range(limit // S):
        forbid_eos = step * S < s.min_frames
        audio = model.embed_codes(mx.array(codes[None]))  # (1, step + 1, d)
        if rows > 1:
            audio = mx.broadcast_to(audio, (rows,) + audio.shape[1:])
        x = mx.concatenate([ctx, audio], axis=1)
        if prior is None or s.apply_prior_to_layers is None:
            layer_prior = prior
        else:
            layer_prior = [prior if i in s.apply_prior_to_layers else None for i in range(n_layers)]
        out = model.decoder_hidden(x, memory_kv, memory_mask=memory_mask, attn_prior=layer_prior,
                                   return_attention=want_attention)
        h, probs = out if want_attention else (out, None)
        last = h[:, -1]  # (rows, d)
        logits = model.logits(last)  # (rows, S * C * V)
        if cfg:
            logits = (1.0 - s.cfg_scale) * logits[1] + s.cfg_scale * logits[0]
        else:
            logits = logits[0]

        # Next step's prior from this step's cross-attention (row 0 only; the CFG row stays flat).
        # (generate_speech, the chunked path, has no start_prior_after: the prior runs from step 0.)
        if s.apply_prior and (step >= s.start_prior_after or progress is not None):
            per_layer = [probs[i].mean(axis=1) for i in est_layers]  # (rows, T, L) each
            scores = np.array(mx.stack(per_layer, axis=1).mean(axis=1)[0, -1])  # (L,)
            if progress is None:
                attended = _attended_position(scores, last_attended, counter, L, s.prior_window)
                last_attended = attended
                row = _prior_row(attended, counter, L, s.prior_window, s.prior_epsilon)
            else:
                attended, row = progress.step(scores)
            full = np.full((rows, 1, L), s.prior_epsilon, dtype=np.float32)
            full[0, 0] = row
            prior = mx.array(full)
            if record is not None:
                record["attended"].append(attended)
                record["priors"].append(row)

        # The local transformer draws the step's C * S codes (j = i * C + c).
        bad = _forbidden_mask(V, a.codebook_size, eos_id, forbid_eos)
        lt_cache = model.make_local_cache()
        lt_in = model.local_start(last)  # (rows, 1, h)
        drawn = np.zeros((C * S,), dtype=np.int64)
        for j in range(C * S):
            lj = model.local_step(lt_in, j, cache=lt_cache)  # (rows, V)
            lj = (s.cfg_scale * lj[0] + (1.0 - s.cfg_scale) * lj[1]) if cfg else lj[0]
            lj = mx.where(bad, -mx.inf, lj)
            sub = None
            if s.temperature > 0:
                key, sub = mx.random.split(key)
            code = _draw(lj, s.temperature, s.top_k, sub)
            drawn[j] = code
            lt_in = model.local_embed(mx.full((rows,), code, dtype=mx.int32), j)
        step_codes = drawn.reshape(S, C).T  # (C, S)

        # EOS: the drawn codes and the argmax of the CFG-combined final_proj logits.
        f = _eos_frame(step_codes, eos_id, eos_kind) if stream_kind == "both" else None
        if end_frame is None:
            masked = mx.where(bad, -mx.inf, logits.reshape(S * C, V))
            argmax_codes = np.array(mx.argmax(masked, axis=-1)).reshape(S, C).T
            g = _eos_frame(argmax_codes, eos_id, eos_kind)
            hits = [v for v in (f, g) if v is not None]
            if hits:
                end_frame = step * S + min(hits)
            elif progress is not None and progress.forced_end:
                # A chunk that is not the last, its text spoken: cut after this step, all of it kept.
                end_frame = (step + 1) * S
                forced = True
        produced.append(step_codes)
        codes = np.concatenate([codes, step_codes], axis=1)
        kept = step_codes if end_frame is None else step_codes[:, : max(0, end_frame - step * S)]
        kept = kept[:, : max(0, limit - step * S)]
        if kept.shape[1]:
            yield kept
        if end_frame is not None:
            # NeMo runs on until 4 steps exist (the codec's minimum), then trims those extra
            # frames away again: nothing after the EOS frame is kept, so stop here.
            break

    if window is not None and window.last and end_frame is not None:
        state.ended = True
    if record is not None:
        record["end_frame"] = end_frame
        record["steps"] = len(produced)
        if window is not None:
            record.update(forced_end=forced, window=window.ids.tolist(), left_offset=window.left_offset)
