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

from ..cache import StaticKVCache
from ..errors import MetalgenError
from ..sampling import make_sampler
from .chunking import ChunkRules, ChunkState, ChunkWindow
from .decoder_kernel import StackedMemory, decoder_kernel, kernel_step, stack_caches
from .lt_kernel import PackedLT, draw_codes, lt_kernel
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


class StepGraph:
    """The arithmetic of one step as a function of arrays (plus the sampler's device state), in
    the order of the module docstring. The decoder's caches are fixed-capacity (`StaticKVCache`,
    the position an array), so a fused kernel can take a step's arrays as they are.

    `__call__(h, scores, last, counter, bad, offset, keys, values, memory_kv, memory_mask)`:
    h (rows, d) the decoder state of step n, scores (L,) its alignment estimate, (last, counter)
    the prior tracker, bad (V,) the additive mask of banned ids, offset the static caches' next
    position, keys/values their buffers, memory_kv the text's per-layer cross-attention
    keys/values, memory_mask (rows, L). Returns (codes (S, C) int32, eos_at (),
    h_next, scores_next, last, counter, attended, prior_row, keys, values)."""

    def __init__(self, model, sampling: MagpieSampling, cfg: bool, rows: int, use_prior: bool, sampler,
                 lt: Optional[PackedLT] = None):
        a = model.args
        self.model, self.s, self.cfg, self.rows, self.use_prior = model, sampling, cfg, rows, use_prior
        self.sampler = sampler
        self.lt = lt  # the fused LT kernel's pack (lt_kernel.lt_kernel), or None: the eager draws
        self.C, self.S, self.V = a.num_codebooks, a.frame_stacking_factor, a.num_tokens_per_codebook
        self.eos_id = a.audio_eos_id
        self.stream_kind, self.eos_kind = _EOS_METHODS[sampling.eos_detection]
        n_layers = a.decoder.n_layers
        self.n_layers = n_layers
        self.est_layers = list(range(n_layers) if sampling.estimate_alignment_from_layers is None
                               else sampling.estimate_alignment_from_layers)
        self.prior_layers = (None if sampling.apply_prior_to_layers is None
                             else set(sampling.apply_prior_to_layers))

    def combine(self, logits: mx.array) -> mx.array:
        """CFG: (rows, ...) -> (...) as scale * cond + (1 - scale) * uncond."""
        if not self.cfg:
            return logits[0]
        g = self.s.cfg_scale
        return g * logits[0] + (1.0 - g) * logits[1]

    def draw(self, h: mx.array, bad: mx.array) -> mx.array:
        """The local transformer's C * S draws from decoder states h (rows, d) -> (S, C) int32,
        each from `metalgen.sampling`'s fused sampler (top-k, temperature, draw; argmax at 0).

        With the fused LT kernel (a GPU backend) one launch makes all of them from the sampler's state,
        the same draws at the same counters; otherwise the model's LT ops, one sampler call a code."""
        if self.lt is not None:
            codes, self.sampler.state = draw_codes(self.lt, h, bad, self.s, self.sampler.state, cfg=self.cfg)
            return codes.reshape(self.S, self.C)
        codes = eager_draws(self.model, h, bad, self.s.cfg_scale, lambda logits: self.sampler(logits)[0])
        return codes.reshape(self.S, self.C)

    def decode(self, x, prior, offset, keys, values, memory_kv, memory_mask):
        """Decoder rows x (rows, 1, d) at `offset` -> (last state (rows, d), alignment scores (L,),
        keys, values).

        With the fused kernel (FrameLoop.prefill chose it on a GPU backend: keys and values are then
        the stacked buffers, memory_kv a `decoder_kernel.StackedMemory`) one launch does the step and
        writes this row into the buffers in place; otherwise the decoder's MLX ops over StaticKVCaches."""
        if isinstance(memory_kv, StackedMemory):
            h, scores = kernel_step(x, prior, offset, keys, values, memory_kv, self.prior_layers, self.est_layers)
            return h, scores, keys, values
        caches = [StaticKVCache(k, v, offset) for k, v in zip(keys, values)]
        layer_prior = prior
        if prior is not None and self.prior_layers is not None:
            layer_prior = [prior if i in self.prior_layers else None for i in range(self.n_layers)]
        h, probs = self.model.decoder_hidden(x, memory_kv, memory_mask=memory_mask, attn_prior=layer_prior,
                                             return_attention=True, cache=caches)
        return h[:, -1], alignment_scores(probs, self.est_layers), [c.keys for c in caches], [c.values for c in caches]

    def __call__(self, h, scores, last, counter, bad, offset, keys, values, memory_kv, memory_mask):
        s, m = self.s, self.model
        L = scores.shape[0]
        prior = attended = prior_row = None
        if self.use_prior:
            prior_row, attended, state = advance_prior(scores, PriorState(last, counter), s.prior_window,
                                                       s.prior_epsilon)
            last, counter = state.last, state.counter
            prior = prior_row[None, None]  # (1, 1, L); the CFG row keeps a flat epsilon prior
            if self.rows > 1:
                prior = mx.concatenate([prior, mx.full((self.rows - 1, 1, L), s.prior_epsilon)], axis=0)
        codes = self.draw(h, bad)  # (S, C)
        eos = mx.array(self.S, dtype=mx.int32)
        if self.stream_kind == "both":
            eos = _eos_position(codes, self.eos_id, self.eos_kind, self.S)
        argmax = mx.argmax(self.combine(m.logits(h)).reshape(self.S * self.C, self.V) + bad, axis=-1)
        eos = mx.minimum(eos, _eos_position(argmax.reshape(self.S, self.C), self.eos_id, self.eos_kind, self.S))
        audio = m.embed_codes(codes.T[None])  # (1, 1, d)
        x = mx.broadcast_to(audio, (self.rows,) + audio.shape[1:])
        h, scores, keys, values = self.decode(x, prior, offset, keys, values, memory_kv, memory_mask)
        if attended is None:
            attended = mx.array(-1, dtype=mx.int32)
            prior_row = mx.zeros((L,), dtype=mx.float32)
        return codes, eos, h, scores, last, counter, attended, prior_row, keys, values


def eager_draws(model, h: mx.array, bad: mx.array, cfg_scale: float, sample) -> mx.array:
    """The local transformer's C * S draws with the model's own ops (the LT kernel's reference loop):
    h (rows, d) decoder states (rows 2: CFG, scale * conditional + (1 - scale) * unconditional), bad (V,)
    additive mask, `sample(logits (1, V)) -> code (1,)` -> codes (C * S,) in draw order j = frame * C +
    codebook. Each code's embedding is the next draw's input; the LT cache starts empty, as NeMo resets it
    every decoder step."""
    a = model.args
    rows = h.shape[0]
    cache = model.make_local_cache()
    x = model.local_start(h)  # (rows, 1, hid)
    codes = []
    for j in range(a.num_codebooks * a.frame_stacking_factor):
        logits = model.local_step(x, j, cache=cache)  # (rows, V)
        logits = cfg_scale * logits[0] + (1.0 - cfg_scale) * logits[1] if rows > 1 else logits[0]
        code = sample((logits + bad)[None])  # (1,)
        codes.append(code)
        x = model.local_embed(mx.broadcast_to(code, (rows,)), j)
    return mx.concatenate(codes)


def alignment_scores(probs: List[Optional[mx.array]], layers: List[int]) -> mx.array:
    """Cross-attention probabilities (rows, H, T, L) per layer -> the conditional row's alignment
    estimate for its last query (L,): the mean over heads, then over `layers`."""
    return mx.stack([probs[i][0, :, -1].mean(axis=0) for i in layers]).mean(axis=0)


class FrameLoop:
    """The cached generation of one utterance. `pieces()` yields (C, k) int64 code pieces.

    `model`: `metalgen.models.magpie.model.Model`; `text_ids` (L,) with text EOS last; `speaker`: a
    baked speaker index or a context (1, T_ctx, d); `cfg`: classifier-free guidance. `chunk`, one
    chunk of a long text as (the `chunking.ChunkState` carried across chunks, this chunk's
    `ChunkWindow`), runs NeMo's `generate_speech` for that chunk with its decoder cache reset
    (`ChunkStepGraph`; `text_ids` is then the window's). `sampler`, when given, replaces the one
    made from `seed` (`generate.stream_chunks` runs one across all the chunks).

    The step runs eagerly. Tracing it with mx.compile was measured and dropped (docs/magpie.md,
    "Speed"): fewer milliseconds a step in bf16, but minutes of tracing on first use."""

    def __init__(self, model, text_ids, speaker, sampling: Optional[MagpieSampling] = None, cfg: bool = True,
                 max_frames: Optional[int] = None, seed: Optional[int] = None,
                 chunk: Optional[Tuple[ChunkState, ChunkWindow]] = None, sampler=None):
        self.model = model
        self.s = s = sampling or MagpieSampling()
        a = model.args
        if "local_transformer" not in model or a.local_transformer_type != "autoregressive":
            raise MetalgenError("Magpie generation needs an autoregressive local transformer")
        self.C, self.S, self.V = a.num_codebooks, a.frame_stacking_factor, a.num_tokens_per_codebook
        self.limit = int(s.max_frames if max_frames is None else max_frames)
        self.steps = max(0, self.limit // self.S)
        self.cfg = cfg

        self.chunk = chunk
        if chunk is not None:
            text_ids = chunk[1].ids  # the chunk's window: history tokens, then its own
        ids = np.asarray(text_ids, dtype=np.int64).reshape(1, -1)
        self.L = L = ids.shape[1]
        memory = model.encode_text(mx.array(ids))  # (1, L, d)
        if chunk is not None:
            memory = chunk[0].splice(chunk[1], memory)  # history rows as the previous window had them
        ctx = speaker if isinstance(speaker, mx.array) else model.speaker_context(speaker)  # (1, Tc, d)
        if cfg:
            # Row 1 is the unconditional branch: zero text with only position 0 valid, zero context.
            memory = mx.concatenate([memory, mx.zeros_like(memory)], axis=0)
            self.memory_mask = mx.array(np.stack([np.ones(L, bool), np.arange(L) == 0]))
            ctx = mx.concatenate([ctx, mx.zeros_like(ctx)], axis=0)
        else:
            self.memory_mask = mx.ones((1, L), dtype=mx.bool_)  # all valid: the same as no mask
        self.rows = ctx.shape[0]
        self.ctx = ctx
        self.memory_kv = model.decoder_memory(memory)
        # Positions: the context, the BOS block and one per step must fit the learned table.
        self.capacity = ctx.shape[1] + 1 + self.steps
        table = a.decoder.max_length_causal_mask
        if "position_embeddings" in model.decoder and self.capacity > table:
            raise MetalgenError(
                f"Magpie: {self.limit} frames after a {ctx.shape[1]}-frame speaker context need "
                f"{self.capacity} decoder positions; the model has {table}"
            )
        # temperature <= 0 is NeMo's argmax; the fused sampler is greedy at temperature 0.
        if sampler is None:
            sampler = make_sampler(max(0.0, float(s.temperature)), int(s.top_k), seed=seed)
        # Additive masks: forbidden specials always, EOS too while it is banned.
        self.bad = [mx.where(_forbidden_mask(self.V, a.codebook_size, a.audio_eos_id, f), -mx.inf, 0.0)
                    for f in (False, True)]
        lt = lt_kernel(model)
        self.graphs = {p: StepGraph(model, s, cfg, self.rows, p, sampler, lt) for p in (False, True)}
        self.first_prior = None  # the prefill's prior: none but for a later chunk of a long text
        if chunk is not None:
            self.graphs = {p: ChunkStepGraph(g, *chunk) for p, g in self.graphs.items()}
            self.first_prior = self.graphs[True].fixed_prior

    def prefill(self):
        """[speaker context ; BOS block] through the decoder (no prior yet, but a later chunk's first
        prior for a long text) -> (state (rows, d), alignment scores (L,), static keys, values).

        On a GPU backend whose decoder the fused kernel takes (`decoder_kernel.decoder_kernel`), the
        prompt still runs on the MLX decoder, then its caches are copied once into the kernel's stacked
        buffers (keys and values are then one array each) and `self.memory_kv` becomes the text's
        stacked keys and values, which `StepGraph.decode` takes as the sign to step on the kernel."""
        m = self.model
        if isinstance(self.memory_kv, StackedMemory):  # a second prefill: the MLX decoder reads the list
            self.memory_kv = self.memory_kv.layers
        bos = mx.full((1, self.C, self.S), m.args.audio_bos_id, dtype=mx.int32)
        audio = m.embed_codes(bos)  # (1, 1, d)
        x = mx.concatenate([self.ctx, mx.broadcast_to(audio, (self.rows,) + audio.shape[1:])], axis=1)
        cache = m.decoder.make_cache()
        h, probs = m.decoder_hidden(x, self.memory_kv, memory_mask=self.memory_mask, return_attention=True,
                                    cache=cache, attn_prior=_layer_prior(self.first_prior, self.graphs[True]))
        scores = alignment_scores(probs, self.graphs[True].est_layers)
        packed = decoder_kernel(m)
        if packed is not None:
            keys, values = stack_caches(cache, self.capacity)
            self.memory_kv = StackedMemory.make(packed, self.memory_kv, self.memory_mask)
            return h[:, -1], scores, keys, values, mx.array(cache[0].offset, dtype=mx.int32)
        static = [StaticKVCache.from_cache(c, self.capacity) for c in cache]
        return h[:, -1], scores, [c.keys for c in static], [c.values for c in static], static[0].offset

    def pieces(self, record: Optional[dict] = None) -> Iterator[np.ndarray]:
        """Yields (C, k) int64 pieces, each final: the frames of a step up to (not including) its
        EOS frame. `record`, when a dict, gets "attended" and "priors" per step, "end_frame", "steps",
        and for a chunk of a long text "forced_end", "window", "left_offset"; a chunk's loop, run to
        its end, leaves its last attended position (and whether speech ended) in the `ChunkState`."""
        s = self.s
        chunked = self.chunk is not None
        if record is not None:
            record.update(attended=[], priors=[], end_frame=None, steps=0)
            if chunked:
                w = self.chunk[1]
                record.update(forced_end=False, window=w.ids.tolist(), left_offset=w.left_offset)
        if self.steps < 1:
            return
        h, scores, keys, values, offset = self.prefill()
        if chunked:
            last, counter = self.graphs[True].start()
        else:
            last = mx.array(1, dtype=mx.int32)
            counter = mx.zeros((self.L,), dtype=mx.int32)

        def enqueue(n, h, scores, last, counter, keys, values, offset):
            # (NeMo's generate_speech, the long-text path, has no start_prior_after.)
            use_prior = s.apply_prior and (n >= s.start_prior_after or chunked)
            bad = self.bad[int(n * self.S < s.min_frames)]
            out = self.graphs[use_prior](h, scores, last, counter, bad, offset, keys, values,
                                         self.memory_kv, self.memory_mask)
            mx.async_eval(out)
            return out

        cur = enqueue(0, h, scores, last, counter, keys, values, offset)
        end = None
        for n in range(self.steps):
            codes_a, eos_a, h, scores, last, counter, attended, prior_row, keys, values = cur
            nxt = None
            if n + 1 < self.steps:
                offset = offset + 1
                nxt = enqueue(n + 1, h, scores, last, counter, keys, values, offset)
            codes = np.array(codes_a, dtype=np.int64).T  # (C, S)
            # The stacked frame of EOS; S: none; S + 1: a chunk of a long text cut at its end.
            eos = int(eos_a.item())
            if record is not None:
                record["steps"] = n + 1
                if int(attended.item()) >= 0:
                    record["attended"].append(int(attended.item()))
                    record["priors"].append(np.array(prior_row))
            keep = min(eos, self.S, self.limit - n * self.S)
            if keep > 0:
                yield codes[:, :keep]
            if eos != self.S:
                end = n * self.S + min(eos, self.S)
                if record is not None:
                    record["end_frame"] = end
                    record["forced_end"] = eos > self.S
                break
            cur = nxt
        if chunked:
            state, window = self.chunk
            # `last` is the stopping step's: (the attended position in the window, steps near its end).
            state.last_attended = int(last[0].item()) + window.left_offset
            state.ended = window.last and end is not None


# -------------------------------------------------------------------------------------- long text


def _layer_prior(prior: Optional[mx.array], graph: StepGraph):
    """A prior (rows, 1, L) as the decoder takes it: one for every layer, or per layer (None on the
    layers outside `apply_prior_to_layers`)."""
    if prior is None or graph.prior_layers is None:
        return prior
    return [prior if i in graph.prior_layers else None for i in range(graph.n_layers)]


def advance_chunk_prior(
    scores: mx.array, state: PriorState, left: int, window: int, eps: float, rules: ChunkRules
) -> Tuple[mx.array, mx.array, PriorState]:
    """`advance_prior` for a later chunk of a long text (NeMo's get_most_attended_text_timestep with
    the chunk's window offset, then construct_multi_chunk_prior), as device ops (no readback); the
    host rules are `chunking.attended_position` / `multi_chunk_prior_row`.

    Positions count from the window's start. The last attended one, carried from the previous
    chunk, may lie left of the window: NeMo then slices and indexes with a negative number, which
    Python reads from the end, and this does the same. `state.counter` has `left` + L + 1 slots,
    slot i for position i - `left` (`left` positions left of the window, and one past its end,
    where a sink at the last position sends the search). Returns (prior row (L,) float32,
    attended position (scalar int32), the new state)."""
    L = scores.shape[0]
    eps2 = eps * eps
    idx = mx.arange(L, dtype=mx.int32)
    slots = mx.arange(state.counter.shape[0], dtype=mx.int32) - left

    def bound(i):  # a slice bound as Python reads it
        return mx.where(i < 0, mx.maximum(i + L, 0), mx.minimum(i, L))

    def at(i):  # an index as Python reads it
        return mx.where(i < 0, i + L, i)

    last = state.last + (state.counter[state.last + left] >= SINK_SKIP_COUNT).astype(mx.int32)
    start, end = bound(last), bound(mx.minimum(last + window, L - IGNORED_TAIL))
    best = mx.argmax(mx.where((idx >= start) & (idx < end), scores, -mx.inf)).astype(mx.int32)
    attended = mx.where(end > start, last + best - start, L - 1).astype(mx.int32)
    counter = state.counter + (slots == attended).astype(mx.int32)

    if L <= rules.flat_prior_max_len:
        row = mx.ones((L,), dtype=mx.float32)
    else:
        # NeMo's assignments in its order (with a position left of the window they overlap).
        w = rules.weights
        before = mx.maximum(attended - 1, 1)
        row = mx.full((L,), eps, dtype=mx.float32)
        row = mx.where(idx < before, eps2, row)
        row = mx.where(idx == before, w[0], row)
        row = mx.where(idx == at(attended), w[1], row)
        for d, weight in enumerate(w[2:], start=1):
            row = mx.where((attended + d < L) & (idx == at(attended + d)), weight, row)
        tail = attended + len(w) - 1
        row = mx.where((tail < L) & (idx >= bound(tail)), eps2, row)
    # The furthest position right of the window start attended too often (-1 if none) pushes
    # everything up to it down.
    sink = mx.max(mx.where((slots > 0) & (counter >= rules.sink_count), slots, -1))
    row = mx.where(idx <= sink, eps2, row).astype(mx.float32)
    return row, attended, PriorState(attended, counter)


class ChunkStepGraph(StepGraph):
    """One step of a chunk of a long text: NeMo's `generate_speech` for that chunk with its decoder
    cache reset before the chunk (the cached twin of `generate._stream_recompute` with a chunk).

    It takes over a built `StepGraph` (whatever that draws and decodes with stays) and changes the
    prior and the end: the first chunk keeps the single-chunk prior (`advance_prior`), later ones
    take `advance_chunk_prior`, a later chunk starts from (and without the attention prior keeps)
    `fixed_prior`, and a chunk that is not the last is cut once its alignment has been near its end
    for `rules.forced_end_after` steps. All of it is device work: the tracker's `last` is a pair of
    scalars (the attended position, counted from the window's start, and the steps since it first
    came near the end), and the cut comes back in the EOS position as S + 1 (all of the step's
    frames kept). `attended` is returned in the whole text's positions, as NeMo counts them."""

    def __init__(self, graph: StepGraph, state: ChunkState, window: ChunkWindow):
        self.__dict__.update(graph.__dict__)
        self.advance = graph.use_prior
        self.use_prior = False  # StepGraph's own (single-chunk) prior is replaced by this class's
        self.window, self.rules = window, state.rules
        self.last0 = state.last_attended - window.left_offset
        self.left = 0 if window.first else max(0, -self.last0)
        first = window.initial_prior(self.s.prior_epsilon, state.rules)
        self.fixed_prior = None if first is None else self.rows_prior(mx.array(first))
        self.step_prior = None  # the prior `decode` applies, set per step by __call__

    def rows_prior(self, row: mx.array) -> mx.array:
        """The conditional row's prior (L,) -> (rows, 1, L): the CFG row keeps a flat epsilon."""
        prior = row[None, None]
        if self.rows > 1:
            prior = mx.concatenate([prior, mx.full((self.rows - 1, 1, row.shape[0]), self.s.prior_epsilon)], axis=0)
        return prior

    def start(self) -> Tuple[Tuple[mx.array, mx.array], mx.array]:
        """The tracker before the chunk's first step: (last, steps near the end), counter."""
        last = (mx.array(self.last0, dtype=mx.int32), mx.array(0, dtype=mx.int32))
        size = self.window.ids.shape[0] + (0 if self.window.first else self.left + 1)
        return last, mx.zeros((size,), dtype=mx.int32)

    def decode(self, x, prior, offset, keys, values, memory_kv, memory_mask):
        return super().decode(x, self.step_prior, offset, keys, values, memory_kv, memory_mask)

    def __call__(self, h, scores, last, counter, bad, offset, keys, values, memory_kv, memory_mask):
        s, rules, w = self.s, self.rules, self.window
        L = scores.shape[0]
        self.step_prior = self.fixed_prior
        attended = prior_row = near = None
        if self.advance:
            pos, near = last
            if w.first:  # offset 0: the window's positions are the whole text's
                prior_row, attended, st = advance_prior(scores, PriorState(pos, counter), s.prior_window,
                                                        s.prior_epsilon)
                close = attended >= L - rules.first_near_end
            else:
                prior_row, attended, st = advance_chunk_prior(scores, PriorState(pos, counter), self.left,
                                                              s.prior_window, s.prior_epsilon, rules)
                close = attended >= L - rules.near_end
            near = mx.where((near > 0) | close, near + 1, 0).astype(mx.int32)
            last, counter = (st.last, near), st.counter
            self.step_prior = self.rows_prior(prior_row)
        out = list(super().__call__(h, scores, None, None, bad, offset, keys, values, memory_kv, memory_mask))
        self.step_prior = None
        eos = out[1]
        if near is not None and not w.last:
            eos = mx.where((eos == self.S) & (near >= rules.forced_end_after), self.S + 1, eos).astype(mx.int32)
        out[1], out[4], out[5] = eos, last, counter
        if attended is not None:
            out[6], out[7] = attended + w.left_offset, prior_row
        return tuple(out)
