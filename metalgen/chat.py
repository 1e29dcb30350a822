"""Multi-turn chat on one prompt cache: each turn feeds only what the cache does not already hold.

A turn renders the whole conversation with the chat template, keeps the cached positions that this
rendering shares with what was fed before (the template may render an earlier reply differently from
how it was generated: Qwen3's drops the thinking block), trims the rest, and feeds the remainder. On a
backend with a fast decode path the cache is that path's own (`make_prompt_cache`), so every turn
prefills and decodes in place.
"""

from __future__ import annotations

from typing import Iterator, List, Optional

import mlx.core as mx

from .cache import (cache_length, can_trim_prompt_cache, common_prefix, copy_prompt_cache, make_prompt_cache,
                    trim_prompt_cache)
from .errors import MetalgenError
from .generate import GenerationResponse, check_prompt, prefill, stream_generate
from .sampling import make_logits_processors, make_sampler


class ReusedCache:
    """One prompt cache reused from request to request: `feed(ids)` trims it to the longest prefix it
    shares with `ids` and returns the ids still to be fed; `commit(...)` records what it then holds.

    With `checkpoints`, a cache that cannot be trimmed (a hybrid stack's Gated DeltaNet states have no
    positions to cut) keeps a checkpoint instead: `feed` prefills all of a prompt but its last id itself
    and keeps a copy of the cache there, which a later prompt that starts with those ids (a request's
    next choice, a chat's next turn) resumes from, rather than from nothing. The checkpoint costs one
    more copy of the attention layers' keys and values (the states are shared until they change). After
    `feed`, `held` is the positions it kept from before (the trimmed cache's or the checkpoint's) and
    `prefilled` counts the ids it fed itself, since the start."""

    def __init__(self, model, decode: Optional[str] = None, prefill_step_size: int = 512,
                 checkpoints: bool = False):
        self.model, self.decode = model, decode
        self.prefill_step_size = prefill_step_size
        self.checkpoints = checkpoints
        self.checkpoint = None  # (ids, cache copy) of an untrimmable cache
        self.held = 0
        self.prefilled = 0
        self.reset()

    def reset(self) -> None:
        self.cache = make_prompt_cache(self.model, decode=self.decode or "auto")
        self.fed: List[int] = []  # the ids the cache holds, in order

    def feed(self, ids: List[int]) -> List[int]:
        """Trim the cache for `ids` (at least one id is left to feed); the ids to feed."""
        keep = min(common_prefix(self.fed, ids), len(ids) - 1)
        # past `keep`: the ids that differ, and whatever a generation stopped before its commit fed
        drop = cache_length(self.cache) - keep
        if trim_prompt_cache(self.cache, drop) != drop:
            keep = self._resume(ids)  # a cache that cannot go back (Gated DeltaNet layers)
        self.fed = list(ids[:keep])
        self.held = keep
        rest = list(ids[keep:])
        if self.checkpoints and len(rest) > 1 and not can_trim_prompt_cache(self.cache):
            check_prompt(self.model, ids)  # before feeding any of it, as stream_generate would
            self._prefill(rest[:-1])
            self.fed += rest[:-1]
            copy = copy_prompt_cache(self.cache)
            self.checkpoint = (list(self.fed), copy) if copy is not None else None
            rest = rest[-1:]
        return rest

    def _resume(self, ids: List[int]) -> int:
        """The checkpoint's copy when its ids begin `ids` (and leave one to feed), else a fresh cache; the
        positions it holds."""
        if self.checkpoint is not None:  # only ever made with checkpoints on
            held, copy = self.checkpoint
            if len(held) < len(ids) and ids[: len(held)] == held:
                self.cache = copy_prompt_cache(copy)  # a copy again: the checkpoint serves the next one too
                return len(held)
        self.reset()
        return 0

    def _prefill(self, ids: List[int]) -> None:
        """Feed all of `ids` through the model into the cache: generate.prefill's chunks, then the rest it
        leaves for a decode step."""
        rest = prefill(self.model, mx.array(ids, mx.int32), self.cache, self.prefill_step_size)
        self.model.hidden(rest[None], cache=self.cache, layer_by_layer=True)
        mx.eval([c.state for c in self.cache])
        self.prefilled += len(ids)

    def commit(self, fed: List[int], generated: List[int]) -> None:
        """After a generation from `fed` (feed's answer): the cache holds those, then the generated tokens
        that the loop fed (the last one only where it was fed ahead of a stop)."""
        self.fed = (self.fed + fed + generated)[:cache_length(self.cache)]


class ChatSession:
    """A conversation with `model`. `send(text)` streams the reply as GenerationResponses and records it.

    Args:
        system: an optional system message, first in every rendering.
        decode: the decode path (metalgen.decode modes; None is "auto").
        temperature, top_k, top_p, min_p, repetition_penalty, repetition_context_size, seed: sampling,
            as `metalgen.stream` takes them (the seed seeds the first turn; later turns continue it).
    """

    def __init__(self, model, tokenizer, *, system: Optional[str] = None, decode: Optional[str] = None,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                 repetition_penalty: Optional[float] = None, repetition_context_size: int = 20,
                 seed: Optional[int] = None, prefill_step_size: int = 512):
        self.model, self.tokenizer = model, tokenizer
        self.system = system
        self.sampler = make_sampler(temperature, top_k, top_p, min_p, seed)
        self.processors = make_logits_processors(repetition_penalty, repetition_context_size)
        self.prefill_step_size = prefill_step_size
        self.reused = ReusedCache(model, decode, prefill_step_size)
        self.reset()

    @property
    def cache(self):
        return self.reused.cache

    @property
    def fed(self) -> List[int]:
        return self.reused.fed

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.reused.reset()

    def send(self, text: str, *, max_tokens: int = 256, stop=()) -> Iterator[GenerationResponse]:
        """Add a user message and stream the reply; the reply joins the conversation when it ends."""
        if not text.strip():
            raise MetalgenError("the message is empty")
        messages = self.messages + [{"role": "user", "content": text}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        new = self.reused.feed(ids)
        reply, out = "", []
        try:
            for r in stream_generate(self.model, self.tokenizer, new, max_tokens=max_tokens, sampler=self.sampler,
                                     logits_processors=self.processors, stop_strings=stop,
                                     prefill_step_size=self.prefill_step_size, prompt_cache=self.cache):
                reply += r.text
                out.append(r.token)
                yield r
        finally:  # also when the reader stops early: the reply so far joins the conversation
            self.reused.commit(new, out)
            if out:
                self.messages = messages + [{"role": "assistant", "content": reply}]
