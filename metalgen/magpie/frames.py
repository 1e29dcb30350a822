"""Magpie's fast frame loop: KV-cached decoder, everything on the device, double-buffered.

This is NeMo's `use_kv_cache_for_inference` mode of `infer_batch` (greedy codes equal NeMo 3.0.0's
in that mode): each decoder position is computed once, under the attention prior of its own step,
and kept in the self-attention cache; the cross-attention keys and values of the text are computed
once per utterance. NeMo's default recomputes the whole sequence every step instead
(`metalgen.magpie.generate`'s reference loop), so later positions see earlier ones as recomputed
under the newest prior; the two modes give different (equally valid) codes.

Per step n, all of it lazy device work:

1. the next attention prior from step n's cross-attention probabilities (alignment estimate,
   attended text position, sink counter: `advance_prior`),
2. the local transformer's C * S draws from step n's decoder state (CFG on every head, forbidden
   ids masked, EOS banned before `min_frames`), with `metalgen.sampling`'s fused sampler,
3. the EOS position in the stacked step from the drawn codes and from the argmax of the
   CFG-combined `final_proj` logits,
4. the decoder on the embedded codes, which gives step n+1's state and probabilities.

Step n+1 is enqueued (`mx.async_eval`) before step n's codes and EOS position are read back, so the
host builds the next graph while the device runs the current one; those two small arrays are the
only per-step readback.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, List, Optional, Tuple

import mlx.core as mx
import numpy as np

from ..errors import MetalgenError
from ..sampling import make_sampler
from .generate import (
    _EOS_METHODS,
    IGNORED_TAIL,
    SHORT_TEXT,
    SINK_PENALTY_COUNT,
    SINK_SKIP_COUNT,
    MagpieSampling,
    _forbidden_mask,
)


@dataclasses.dataclass
class PriorState:
    """The alignment tracker of NeMo's inference for the conditional row, on the device:
    `last` (the previously attended text position, a scalar int32) and `counter` (L,) int32 (how
    often each text position was the attended one)."""

    last: mx.array
    counter: mx.array


def advance_prior(
    scores: mx.array, state: PriorState, window: int, eps: float
) -> Tuple[mx.array, mx.array, PriorState]:
    """One step of NeMo's `get_most_attended_text_timestep` + `construct_inference_prior` for one
    row, as device ops (no readback).

    scores (L,): the step's alignment estimate. Returns (prior row (L,) float32, attended position
    (scalar int32), the new state). The rules, as `generate._attended_position` / `_prior_row` on
    the host: step over a sink at `last`, search [last, last + window) clipped to L - 3 (empty:
    L - 1), count it; ones at max(1, a - 1) and a .. min(a + window, L - 1) (all ones when
    L <= 5); every position counted at least SINK_PENALTY_COUNT times pushes itself and all
    before it back to eps."""
    L = scores.shape[0]
    idx = mx.arange(L, dtype=mx.int32)
    last = state.last + (state.counter[state.last] >= SINK_SKIP_COUNT).astype(mx.int32)
    end = mx.minimum(last + window, L - IGNORED_TAIL)
    inside = (idx >= last) & (idx < end)
    best = mx.argmax(mx.where(inside, scores, -mx.inf)).astype(mx.int32)
    attended = mx.where(end > last, best, L - 1)
    counter = state.counter + (idx == attended).astype(mx.int32)

    if L <= SHORT_TEXT:
        row = mx.ones((L,), dtype=mx.float32)
    else:
        on = (idx == mx.maximum(attended - 1, 1)) | ((idx >= attended) & (idx <= mx.minimum(attended + window, L - 1)))
        row = mx.where(on, 1.0, eps).astype(mx.float32)
    # The furthest position attended too often (-1 if none) resets everything up to it.
    sink = mx.max(mx.where(counter >= SINK_PENALTY_COUNT, idx, -1))
    row = mx.where(idx <= sink, eps, row).astype(mx.float32)
    return row, attended, PriorState(attended, counter)


def _eos_position(codes: mx.array, eos_id: int, kind: str, S: int) -> mx.array:
    """codes (S, C) -> the first stacked frame that signals EOS as a scalar int32, S if none."""
    hit = codes == eos_id
    if kind == "any":
        per_frame = hit.any(axis=1)
    elif kind == "all":
        per_frame = hit.all(axis=1)
    else:  # zero_cb: codebook 0 only
        per_frame = hit[:, 0]
    first = mx.argmax(per_frame.astype(mx.int32)).astype(mx.int32)
    return mx.where(per_frame.any(), first, S)


@dataclasses.dataclass
class Step:
    """One enqueued step: its codes (S, C) int32, its EOS position (scalar, S when none), and
    the decoder's state and cross-attention probabilities at the next position."""

    codes: mx.array
    eos_at: mx.array
    hidden: mx.array
    probs: List[Optional[mx.array]]
    attended: Optional[mx.array] = None
    prior_row: Optional[mx.array] = None


class FrameLoop:
    """The cached generation of one utterance. `pieces()` yields (C, k) int64 code pieces.

    `model`: `metalgen.models.magpie.model.Model`; `text_ids` (L,) with text EOS last; `speaker`: a
    baked speaker index or a context (1, T_ctx, d); `cfg`: classifier-free guidance."""

    def __init__(self, model, text_ids, speaker, sampling: Optional[MagpieSampling] = None, cfg: bool = True,
                 max_frames: Optional[int] = None, seed: Optional[int] = None):
        self.model = model
        self.s = s = sampling or MagpieSampling()
        a = model.args
        if "local_transformer" not in model or a.local_transformer_type != "autoregressive":
            raise MetalgenError("Magpie generation needs an autoregressive local transformer")
        self.C, self.S, self.V = a.num_codebooks, a.frame_stacking_factor, a.num_tokens_per_codebook
        self.eos_id = a.audio_eos_id
        self.stream_kind, self.eos_kind = _EOS_METHODS[s.eos_detection]
        self.limit = int(s.max_frames if max_frames is None else max_frames)
        self.cfg = cfg
        n_layers = a.decoder.n_layers
        self.est_layers = list(range(n_layers) if s.estimate_alignment_from_layers is None
                               else s.estimate_alignment_from_layers)
        self.prior_layers = None if s.apply_prior_to_layers is None else set(s.apply_prior_to_layers)
        self.n_layers = n_layers

        ids = np.asarray(text_ids, dtype=np.int64).reshape(1, -1)
        self.L = L = ids.shape[1]
        memory = model.encode_text(mx.array(ids))  # (1, L, d)
        ctx = speaker if isinstance(speaker, mx.array) else model.speaker_context(speaker)  # (1, Tc, d)
        if cfg:
            # Row 1 is the unconditional branch: zero text with only position 0 valid, zero context.
            memory = mx.concatenate([memory, mx.zeros_like(memory)], axis=0)
            self.memory_mask = mx.array(np.stack([np.ones(L, bool), np.arange(L) == 0]))
            ctx = mx.concatenate([ctx, mx.zeros_like(ctx)], axis=0)
        else:
            self.memory_mask = None
        self.rows = ctx.shape[0]
        self.ctx = ctx
        self.memory_kv = model.decoder_memory(memory)
        self.cache = model.decoder.make_cache()
        # temperature <= 0 is NeMo's argmax; the fused sampler is greedy at temperature 0.
        self.sampler = make_sampler(max(0.0, float(s.temperature)), int(s.top_k), seed=seed)
        # Additive masks: forbidden specials always, EOS too while it is banned.
        self.bad = [mx.where(_forbidden_mask(self.V, a.codebook_size, self.eos_id, f), -mx.inf, 0.0)
                    for f in (False, True)]
        self.prior_state = PriorState(mx.array(1, dtype=mx.int32), mx.zeros((L,), dtype=mx.int32))
        self.prior: Optional[mx.array] = None  # (rows, 1, L) for the next decoder call

    # ------------------------------------------------------------------------------- pieces

    def _layer_prior(self):
        if self.prior is None or self.prior_layers is None:
            return self.prior
        return [self.prior if i in self.prior_layers else None for i in range(self.n_layers)]

    def _decode(self, x: mx.array) -> Tuple[mx.array, List[Optional[mx.array]]]:
        """Decoder rows x (rows, T, d) appended to the cache -> (last hidden (rows, d), probabilities)."""
        want = self.s.apply_prior
        out = self.model.decoder_hidden(x, self.memory_kv, memory_mask=self.memory_mask,
                                        attn_prior=self._layer_prior(), return_attention=want, cache=self.cache)
        h, probs = out if want else (out, [None] * self.n_layers)
        return h[:, -1], probs

    def prefill(self) -> Tuple[mx.array, List[Optional[mx.array]]]:
        """[speaker context ; BOS block] through the decoder (no prior yet)."""
        bos = mx.full((1, self.C, self.S), self.model.args.audio_bos_id, dtype=mx.int32)
        audio = self.model.embed_codes(bos)  # (1, 1, d)
        audio = mx.broadcast_to(audio, (self.rows,) + audio.shape[1:])
        return self._decode(mx.concatenate([self.ctx, audio], axis=1))

    def _combine(self, logits: mx.array) -> mx.array:
        """CFG: (rows, ...) -> (...) as scale * cond + (1 - scale) * uncond."""
        if not self.cfg:
            return logits[0]
        g = self.s.cfg_scale
        return g * logits[0] + (1.0 - g) * logits[1]

    def _draw_codes(self, h: mx.array, forbid_eos: bool) -> mx.array:
        """The local transformer's C * S draws from decoder states h (rows, d) -> (S, C) int32."""
        m = self.model
        bad = self.bad[int(forbid_eos)]
        cache = m.make_local_cache()
        x = m.local_start(h)  # (rows, 1, hid)
        codes = []
        for j in range(self.C * self.S):  # j = stacked frame i * C + codebook c
            logits = self._combine(m.local_step(x, j, cache=cache)) + bad  # (V,)
            code, _ = self.sampler(logits[None])  # (1,)
            codes.append(code)
            x = m.local_embed(mx.broadcast_to(code, (self.rows,)), j)
        return mx.concatenate(codes).reshape(self.S, self.C)

    def step(self, n: int, h: mx.array, probs: List[Optional[mx.array]]) -> Step:
        """Enqueue-able graph of step n from the decoder's state h (rows, d) and probabilities."""
        s, m = self.s, self.model
        attended = prior_row = None
        if s.apply_prior and n >= s.start_prior_after:
            # Heads, then estimate layers, averaged; the conditional row's last query only.
            scores = mx.stack([probs[i][0, :, -1].mean(axis=0) for i in self.est_layers]).mean(axis=0)  # (L,)
            prior_row, attended, self.prior_state = advance_prior(scores, self.prior_state, s.prior_window,
                                                                  s.prior_epsilon)
            prior = mx.full((self.rows, 1, self.L), s.prior_epsilon, dtype=mx.float32)
            self.prior = mx.concatenate([prior_row[None, None], prior[1:]], axis=0) if self.rows > 1 else prior_row[None, None]
        forbid_eos = n * self.S < s.min_frames
        codes = self._draw_codes(h, forbid_eos)  # (S, C)
        eos = mx.array(self.S, dtype=mx.int32)
        if self.stream_kind == "both":
            eos = _eos_position(codes, self.eos_id, self.eos_kind, self.S)
        argmax = mx.argmax(self._combine(m.logits(h)).reshape(self.S * self.C, self.V) + self.bad[int(forbid_eos)],
                           axis=-1).reshape(self.S, self.C)
        eos = mx.minimum(eos, _eos_position(argmax, self.eos_id, self.eos_kind, self.S))
        audio = m.embed_codes(codes.T[None])  # (1, 1, d)
        h_next, probs_next = self._decode(mx.broadcast_to(audio, (self.rows,) + audio.shape[1:]))
        return Step(codes, eos, h_next, probs_next, attended, prior_row)

    def pieces(self, record: Optional[dict] = None) -> Iterator[np.ndarray]:
        """Yields (C, k) int64 pieces, each final: the frames of a step up to (not including) its
        EOS frame. `record`, when a dict, gets "attended" and "priors" per step and "end_frame"."""
        steps = self.limit // self.S
        if record is not None:
            record.update(attended=[], priors=[], end_frame=None, steps=0)
        if steps < 1:
            return
        h, probs = self.prefill()
        cur = self.step(0, h, probs)
        mx.async_eval(cur.codes, cur.eos_at, cur.hidden)
        for n in range(steps):
            nxt = None
            if n + 1 < steps:
                nxt = self.step(n + 1, cur.hidden, cur.probs)
                mx.async_eval(nxt.codes, nxt.eos_at, nxt.hidden)
            codes = np.array(cur.codes, dtype=np.int64).T  # (C, S)
            eos = int(cur.eos_at.item())
            if record is not None:
                record["steps"] = n + 1
                if cur.attended is not None:
                    record["attended"].append(int(cur.attended.item()))
                    record["priors"].append(np.array(cur.prior_row))
            keep = min(eos, self.limit - n * self.S)
            if keep > 0:
                yield codes[:, :keep]
            if eos < self.S:
                if record is not None:
                    record["end_frame"] = n * self.S + eos
                return
            cur = nxt
