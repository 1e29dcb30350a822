"""Generation, in three layers: `prefill` and `decode_step`, the token generator
`generate_step` that pipelines them, and `stream_generate`, which turns tokens into a stream of
responses with text, stop handling and statistics.

The loop is double-buffered: step n+1 is enqueued (`mx.async_eval`) before token n is read
back, so the device never waits on the host, and the token id is the only per-step readback.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import mlx.core as mx

from profiling import NullTracer

from .cache import cache_length, make_prompt_cache
from .errors import MetalgenError
from .sampling import DeviceSampler, LogitsProcessor, Sampler, lone_penalty, make_sampler, sample_processed

_NULL_TRACER = NullTracer()


@dataclasses.dataclass
class GenerationResponse:
    """One generated token and the text it completed.

    Attributes:
        text: the new text since the previous response (may be empty while a multi-byte
            character or a possible stop string is incomplete).
        token: the token id.
        logprob: its log-probability under the model's unfiltered distribution.
        prompt_tokens, prompt_tps: prompt length and prefill speed (tokens/s).
        generation_tokens, generation_tps: tokens generated so far and decode speed.
        peak_memory: peak device memory so far, in GB.
        finish_reason: None while generating, then "stop" (EOS or stop string) or "length".
        top_logprobs: with `stream_generate(top_logprobs=k)`, the k most likely tokens at this step as
            (id, logprob) pairs, most likely first (logprobs as `logprob`'s); else None.
    """

    text: str
    token: int
    logprob: float
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: Optional[str] = None
    top_logprobs: Optional[List[Tuple[int, float]]] = None


def prefill(model, prompt: mx.array, cache, step_size: int, tracer=_NULL_TRACER) -> mx.array:
    """Feed all but the last `step_size` (or fewer) prompt tokens through the model in chunks,
    filling `cache`; returns the tokens still to be fed (by the first decode step)."""
    while prompt.size > step_size:
        with tracer.span("prefill", tokens=step_size, sync=True):
            model.hidden(prompt[None, :step_size], cache=cache, layer_by_layer=True)
            mx.eval([c.state for c in cache])
        prompt = prompt[step_size:]
    return prompt


def decode_step(
    model,
    inputs: mx.array,
    cache,
    sampler: Sampler,
    processors: Sequence[LogitsProcessor],
    history: Optional[mx.array],
    tracer=_NULL_TRACER,
    phase: str = "decode_step",
) -> Tuple[mx.array, mx.array]:
    """Enqueue one step: logits of the last input position, processors, sampler.

    inputs: (L,) token ids not yet in the cache. Returns lazy (token (1,), logprob (1,)).
    `phase` names the trace event: the step that feeds the prompt's last chunk is prefill.
    """
    logits = step_logits(model, inputs, cache, tracer, phase)
    return process_and_sample(logits, sampler, processors, history, tracer)


def step_logits(model, inputs: mx.array, cache, tracer=_NULL_TRACER, phase: str = "decode_step") -> mx.array:
    """Enqueue the forward pass of `inputs` (L,) ids not yet in the cache: lazy logits (1, V) of the last one."""
    with tracer.span(phase, tokens=int(inputs.size), sync=False):
        # (1, L, hidden) -> last position only -> logits (1, vocab)
        # a prompt's last chunk, like the others, a layer at a time; a decode step stays one graph
        h = model.hidden(inputs[None], cache=cache, layer_by_layer=inputs.size > 1)
        return model.logits(h[:, -1, :])


def top_logprobs(logits: mx.array, k: int) -> Tuple[mx.array, mx.array]:
    """The `k` most likely tokens of each row of `logits` (B, V): lazy (ids (B, k) int32, logprobs (B, k)
    float32), most likely first. On the device, so that a step reads back 2k numbers, not V."""
    lf = logits.astype(mx.float32)
    lp = lf - mx.logsumexp(lf, axis=-1, keepdims=True)
    ids = mx.argpartition(-lp, k - 1, axis=-1)[:, :k]  # the k largest, unordered
    vals = mx.take_along_axis(lp, ids, axis=-1)
    order = mx.argsort(-vals, axis=-1)
    return mx.take_along_axis(ids, order, axis=-1).astype(mx.int32), mx.take_along_axis(vals, order, axis=-1)


def sample_with_top(logits: mx.array, sampler: Sampler, processors: Sequence[LogitsProcessor],
                    history: Optional[mx.array], k: int, tracer=_NULL_TRACER):
    """`process_and_sample` that also returns the `k` most likely tokens: lazy (token (1,), logprob (1,),
    top ids (1, k), top logprobs (1, k)). The processors run here, not folded into the sampler, so that
    the alternatives come from the same (penalized, untempered) logits as the sampler's logprob."""
    with tracer.span("sample", sync=False):
        for processor in processors:
            logits = processor(history, logits)
        token, logprob = sampler(logits)
        return (token, logprob) + top_logprobs(logits, k)


def process_and_sample(logits: mx.array, sampler: Sampler, processors: Sequence[LogitsProcessor],
                       history: Optional[mx.array], tracer=_NULL_TRACER) -> Tuple[mx.array, mx.array]:
    """Enqueue the logits processors and the sampler on `logits` (1, V): lazy (token (1,), logprob (1,))."""
    with tracer.span("sample", sync=False):
        return sample_processed(logits, sampler, processors, history)


def generate_step(
    prompt: mx.array,
    model,
    *,
    max_tokens: int = 256,
    sampler: Optional[Sampler] = None,
    logits_processors: Sequence[LogitsProcessor] = (),
    prompt_cache=None,
    prefill_step_size: int = 512,
    tracer=_NULL_TRACER,
    decode: Optional[str] = None,
    top_logprobs: int = 0,
) -> Iterator[Tuple]:
    """Yield (token id, logprob) pairs, at most `max_tokens` of them; with `top_logprobs` k > 0,
    (token id, logprob, top) triples, top the k most likely tokens of the step as (id, logprob) pairs.

    Args:
        prompt: (T,) prompt token ids.
        sampler: from `make_sampler`; greedy by default.
        logits_processors: functions `(history (T,), logits (1, V)) -> logits`.
        prompt_cache: per-layer caches to fill (fresh ones by default); reusable afterwards.
        prefill_step_size: prompt tokens per prefill chunk.
        decode: the decode path after prefill (metalgen.decode: "auto", "plain", "fused",
            "megakernel", "reference"); None is "auto". Logits processors and the sampler run
            on the device after any path. A caller's prompt_cache decides for itself: one from
            `make_prompt_cache(model)` where a fast path runs (a StackedPromptCache) decodes on its
            decoder in place; per-layer caches on the plain path (or the compiled path of the
            hybrid stacks, which advances them in place).
        top_logprobs: how many alternatives each step reports (0: none, and no work for them).
    """
    sampler = sampler or make_sampler()
    k = int(top_logprobs)
    # Without a caller's cache the prompt goes into per-layer caches, copied once into the stacked
    # path's cache after the prefill (make_step). Prefilling straight into the stacked cache (what a
    # caller's StackedPromptCache does) was measured at 16384 tokens (2026-11-24, H200, qwen3-0.6b): the
    # same time to first token (133 vs 131 ms) but 8.20 GB peak against 4.47 (docs/decode.md, "Prompt
    # caches"); until that is fixed, a single generation keeps the copy.
    cache = prompt_cache if prompt_cache is not None else make_prompt_cache(model, decode="plain")
    processors = list(logits_processors)
    history = prompt if processors else None
    rp = lone_penalty(processors, sampler) if not k else None
    if rp is not None:
        # the sampler keeps the recent tokens in its device state and adds each draw itself: no history to
        # concatenate a token (a launch on the device, a copy that grows with the generation)
        sampler.keep_recent(prompt, rp.context_size)
        history = None
    stacked = getattr(cache, "decoder", None) is not None  # a StackedPromptCache: decoded on in place
    if stacked:
        cache.reserve(cache.offset + int(prompt.size) + max_tokens)

    rest = prefill(model, prompt, cache, prefill_step_size, tracer)
    top = None  # lazy (ids (1, k), logprobs (1, k)) of the pending token when k > 0
    if k:
        y, logprob, *top = sample_with_top(step_logits(model, rest, cache, tracer, "prefill"), sampler, processors,
                                           history, k, tracer)
    else:
        y, logprob = decode_step(model, rest, cache, sampler, processors, history, tracer, "prefill")
    mx.async_eval(y, logprob, *(top or ()))
    if stacked:
        cache.release()  # the prompt's last step holds what it reads; the cache need not
    fast = None
    if max_tokens > 1 and stacked:
        from .decode.path import step_on

        fast = step_on(model, cache.decoder, cache.state)
    elif max_tokens > 1:
        from .decode import make_step

        # a caller's per-layer cache must hold the turn afterwards: only a path that advances it in place
        fast = make_step(model, cache, int(prompt.size), max_tokens, decode, in_place=prompt_cache is not None)
        if fast is not None and prompt_cache is None:
            cache = None  # a stacked path holds the KV cache from here on
    # the fast path's next input: the sampler's own device copy of the token where it keeps one (the megakernel's
    # every group reads its input token; read from the unified-memory pool that y shares with the CPU's readback,
    # docs/decode.md "Small arrays in unified memory")
    feeds = fast is not None and isinstance(sampler, DeviceSampler)
    feed = sampler.last_token() if feeds else y
    n = 0
    while n < max_tokens:
        if n + 1 < max_tokens:
            # Enqueue step n+1 on the device before reading token n back.
            if history is not None:
                history = mx.concatenate([history, y])
            next_top = None
            if fast is not None:
                with tracer.span("decode_step", tokens=1, sync=False):
                    logits = fast(feed)
            elif k:
                logits = step_logits(model, y, cache, tracer)
            if k:
                next_y, next_logprob, *next_top = sample_with_top(logits, sampler, processors, history, k, tracer)
            elif fast is not None:
                next_y, next_logprob = process_and_sample(logits, sampler, processors, history, tracer)
            else:
                next_y, next_logprob = decode_step(model, y, cache, sampler, processors, history,
                                                   tracer)
            next_feed = sampler.last_token() if feeds else next_y
            mx.async_eval(next_y, next_logprob, *(next_top or ()))
        with tracer.span("readback", step=n, sync=True):
            token = y.item()
        if top:
            yield token, logprob.item(), list(zip(top[0][0].tolist(), top[1][0].tolist()))
        else:
            yield token, logprob.item()
        n += 1
        if n < max_tokens:
            y, logprob, top, feed = next_y, next_logprob, next_top, next_feed


class _StopText:
    """Holds back text that could still grow into a stop string."""

    def __init__(self, stop_strings: Sequence[str]):
        self.stops = [s for s in stop_strings if s]
        self.text = ""
        self.emitted = 0

    def push(self, segment: str) -> Tuple[str, bool]:
        """Add decoded text; return (text safe to emit now, whether a stop string was hit)."""
        self.text += segment
        if not self.stops:
            out, self.emitted = self.text[self.emitted :], len(self.text)
            return out, False
        longest = max(len(s) for s in self.stops)
        start = max(0, self.emitted - longest + 1)
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            cut = min(hits)
            out = self.text[self.emitted : cut]
            self.emitted = len(self.text)
            return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text) - self.emitted), 0, -1):
                if self.text.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        end = len(self.text) - hold
        out, self.emitted = self.text[self.emitted : end], end
        return out, False

    def flush(self) -> str:
        out, self.emitted = self.text[self.emitted :], len(self.text)
        return out


class TokenText:
    """A generated token stream turned into text as `stream_generate` emits it: `add(token)` gives the
    new text (never half a multi-byte character, nor the start of a possible stop string) and the finish
    reason the token brings: "stop" for an EOS id (its text is not emitted) or a stop string (cut with
    what follows), "length" when the caller says it is the last token, else None. Shared by
    stream_generate and the batched paths (metalgen.batch, the server)."""

    def __init__(self, tokenizer, stop_strings: Iterable[str] = (), eos_token_ids: Optional[Iterable[int]] = None):
        self.eos = set(tokenizer.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.detok = tokenizer.detokenizer()
        self.text_vocab = tokenizer.vocab_size
        self.stop = _StopText(list(stop_strings))

    def add(self, token: int, last: bool = False) -> Tuple[str, Optional[str]]:
        """The text `token` completes and its finish reason (`last`: no token follows it)."""
        if token in self.eos:
            return self.stop.push(self.detok.finalize())[0] + self.stop.flush(), "stop"
        # Model vocabularies are padded past the tokenizer's (151936 vs 151669 for Qwen); a
        # padding id has no text, as in Hugging Face's decoding.
        text, hit = self.stop.push(self.detok.add(token) if token < self.text_vocab else "")
        if hit:
            return text, "stop"
        if last:
            return text + self.stop.push(self.detok.finalize())[0] + self.stop.flush(), "length"
        return text, None


def _peak_memory_gb() -> float:
    return mx.get_peak_memory() / 1e9


def check_prompt(model, prompt: Sequence[int], held: int = 0) -> None:
    """Raise MetalgenError for a prompt `model` cannot take after `held` cached positions: empty, past the
    context (with room for one generated token), or an id outside the vocabulary."""
    if not prompt:
        raise MetalgenError("the prompt is empty")
    context = model.spec.max_position_embeddings
    if held + len(prompt) >= context:
        raise MetalgenError(
            f"the prompt has {len(prompt)} tokens" + (f" after {held} in the prompt cache" if held else "")
            + f", past the model's context of {context}"
        )
    vocab = model.spec.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise MetalgenError(f"prompt token id {bad[0]} is outside the model's vocabulary of {vocab}")


def stream_generate(
    model,
    tokenizer,
    prompt: Sequence[int],
    *,
    max_tokens: int = 256,
    sampler: Optional[Sampler] = None,
    logits_processors: Sequence[LogitsProcessor] = (),
    stop_strings: Iterable[str] = (),
    eos_token_ids: Optional[Iterable[int]] = None,
    prefill_step_size: int = 512,
    prompt_cache=None,
    tracer=_NULL_TRACER,
    decode: Optional[str] = None,
    top_logprobs: int = 0,
) -> Iterator[GenerationResponse]:
    """Generate from prompt token ids, yielding a GenerationResponse per token.

    Stops at an EOS id (default: the tokenizer's), at any of `stop_strings` (the stop string
    and what follows it are not emitted), at `max_tokens`, or at the model's context length.
    `top_logprobs` k > 0: each response carries the step's k most likely tokens (computed on the device).
    """
    prompt = list(prompt)
    held = cache_length(prompt_cache) if prompt_cache is not None else 0  # a conversation's earlier turns
    check_prompt(model, prompt, held)
    context = model.spec.max_position_embeddings
    vocab = model.spec.vocab_size
    if max_tokens < 0:
        raise MetalgenError(f"max tokens must be >= 0, got {max_tokens}")
    if not 0 <= top_logprobs <= vocab:
        raise MetalgenError(f"top logprobs must be in 0..{vocab}, got {top_logprobs}")
    budget = min(max_tokens, context - held - len(prompt))
    out = TokenText(tokenizer, stop_strings, eos_token_ids)

    mx.reset_peak_memory()
    tic = time.perf_counter()
    prompt_tps = 0.0
    n = 0
    tokens = generate_step(
        mx.array(prompt, mx.int32),
        model,
        max_tokens=budget,
        sampler=sampler,
        logits_processors=logits_processors,
        prompt_cache=prompt_cache,
        prefill_step_size=prefill_step_size,
        tracer=tracer,
        decode=decode,
        top_logprobs=top_logprobs,
    )
    token, logprob = -1, 0.0
    for n, (token, logprob, *top) in enumerate(tokens, start=1):
        if n == 1:
            prompt_time = time.perf_counter() - tic
            prompt_tps = len(prompt) / prompt_time
            tic = time.perf_counter()
        gen_tps = (n - 1) / max(time.perf_counter() - tic, 1e-9) if n > 1 else 0.0

        text, reason = out.add(token, last=n == budget)
        yield GenerationResponse(text, token, logprob, len(prompt), prompt_tps, n, gen_tps, _peak_memory_gb(), reason,
                                 top[0] if top else None)
        if reason is not None:
            return
    if n == 0:  # max_tokens == 0: nothing generated, still say why it ended
        yield GenerationResponse("", -1, 0.0, len(prompt), 0.0, 0, 0.0, _peak_memory_gb(), "length")
