"""Continuous batching: several sequences decoded by one forward pass a token, each weight read once for
all of them, sequences joining and leaving the running batch between steps.

`BatchGenerator` is the token level (what the server runs): `insert` a prompt, `step` the batch, `remove`
a sequence. A new prompt is prefilled alone (in chunks, as generate.py prefills) and its first token
sampled, then its per-layer KVCaches join the batch's left-padded caches (metalgen.batch_cache) at the
next step boundary. `batch_generate` is the offline API over it: prompts in, texts out.

Dense and MoE Qwen decoders take this path; the hybrid Gated DeltaNet stacks do not yet (their
recurrent states would need batching too) and are refused with a MetalgenError.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import mlx.core as mx

from profiling import NullTracer

from .batch_cache import filter_caches, merge_caches
from .cache import make_prompt_cache
from .errors import MetalgenError
from .generate import TokenText, decode_step, prefill, process_and_sample, sample_with_top, step_logits
from .sampling import LogitsProcessor, Sampler, make_sampler

_NULL_TRACER = NullTracer()


@dataclasses.dataclass
class BatchResponse:
    """One token of one sequence of the batch.

    Attributes:
        uid: the sequence, as `BatchGenerator.insert` named it.
        token: the token id.
        logprob: its log-probability under the model's unfiltered distribution.
        finish_reason: None while the sequence goes on; "stop" (one of its stop ids) or "length" (its
            max_tokens, or the model's context) when this is its last token.
        top_logprobs: for a sequence inserted with `top_logprobs=k`, the step's k most likely tokens as
            (id, logprob) pairs, most likely first; else None.
    """

    uid: int
    token: int
    logprob: float
    finish_reason: Optional[str] = None
    top_logprobs: Optional[List[Tuple[int, float]]] = None


@dataclasses.dataclass(eq=False)
class _Row:
    uid: int
    prompt: mx.array  # (T,) int32
    budget: int  # tokens it may generate
    sampler: Optional[Sampler]  # None: the batch's shared greedy sampler
    processors: List[LogitsProcessor]
    stop_ids: frozenset
    top_k: int = 0  # alternatives to report a token (0: none)
    history: Optional[mx.array] = None  # (T + n,) ids so far, kept only for its logits processors
    top: Optional[List[mx.array]] = None  # lazy [ids (1, k), logprobs (1, k)] of its pending token
    generated: int = 0  # tokens read back
    done: bool = False  # finished or removed: leaves the batch at the next step


def check_batchable(model) -> None:
    """Raise MetalgenError for a model whose layers cannot be batched yet (caller: go one at a time)."""
    if getattr(model.spec, "hybrid", None) is not None or getattr(model, "make_cache", None) is not None:
        raise MetalgenError("batched generation does not support Gated DeltaNet (hybrid) models yet; "
                            "generate one sequence at a time")


class BatchGenerator:
    """Decodes up to `max_batch` sequences together, one forward pass a token for all of them.

    `step()` advances every sequence by one token and returns their tokens; sequences inserted since the
    last step are prefilled (alone) and join first, finished or removed ones leave. The loop is
    double-buffered like generate_step's: the next step is enqueued before this step's tokens are read
    back, and those (B,) token ids (with their computed logprobs) are the only per-step readback.
    """

    def __init__(self, model, *, max_batch: int = 8, prefill_step_size: int = 512, tracer=_NULL_TRACER):
        check_batchable(model)
        if max_batch < 1:
            raise MetalgenError(f"max batch must be >= 1, got {max_batch}")
        self.model = model
        self.max_batch = max_batch
        self.prefill_step_size = prefill_step_size
        self.tracer = tracer  # profiling spans: prefill chunks, decode steps, readbacks
        self.steps = 0
        self.context = model.spec.max_position_embeddings
        self._uids = itertools.count()
        self._greedy = make_sampler()
        self.waiting: Deque[_Row] = collections.deque()  # inserted, not yet prefilled
        self.rows: List[_Row] = []  # the batch, in the caches' row order
        self.cache = None  # per-layer BatchKVCaches of the rows, None when empty
        # the rows' tokens not yet read back (B,), lazy: sampled by the step before, fed by the next
        self.tokens: Optional[mx.array] = None
        self.logprobs: Optional[mx.array] = None

    def insert(self, prompt: Union[Sequence[int], mx.array], max_tokens: int = 256, sampler: Optional[Sampler] = None,
               logits_processors: Sequence[LogitsProcessor] = (), stop_token_ids: Iterable[int] = (),
               top_logprobs: int = 0) -> int:
        """Queue a prompt (token ids); it joins the batch at the next `step` with room. Returns its uid.

        sampler: from `make_sampler` (greedy when None); rows may each have their own. logits_processors:
        functions `(history (T,), logits (1, V)) -> logits`, as generate_step takes them.
        stop_token_ids: ids that end the sequence (e.g. the tokenizer's EOS ids). top_logprobs: k > 0 makes
        each of its responses carry the k most likely tokens (the row is then sampled on its own)."""
        ids = prompt.tolist() if isinstance(prompt, mx.array) else list(prompt)
        if not ids:
            raise MetalgenError("the prompt is empty")
        vocab = self.model.spec.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise MetalgenError(f"prompt token id {bad[0]} is outside the model's vocabulary of {vocab}")
        if len(ids) >= self.context:
            raise MetalgenError(f"the prompt has {len(ids)} tokens, past the model's context of {self.context}")
        if max_tokens < 1:
            raise MetalgenError(f"max tokens must be >= 1 in a batch, got {max_tokens}")
        if not 0 <= top_logprobs <= vocab:
            raise MetalgenError(f"top logprobs must be in 0..{vocab}, got {top_logprobs}")
        row = _Row(next(self._uids), mx.array(ids, mx.int32), min(max_tokens, self.context - len(ids)), sampler,
                   list(logits_processors), frozenset(int(t) for t in stop_token_ids), int(top_logprobs))
        self.waiting.append(row)
        return row.uid

    def remove(self, uid: int) -> None:
        """Cancel a sequence: it leaves at the next step and reports no more tokens (unknown uids: no-op)."""
        self.waiting = collections.deque(r for r in self.waiting if r.uid != uid)
        for r in self.rows:
            if r.uid == uid:
                r.done = True

    @property
    def busy(self) -> bool:
        """Whether a sequence is waiting or still generating."""
        return bool(self.waiting) or any(not r.done for r in self.rows)

    def step(self) -> List[BatchResponse]:
        """Advance the batch by one token: finished rows leave, waiting prompts join (prefilled alone, as
        many as `max_batch` has room for), and every row's next token comes back, in the batch's order."""
        self._drop_done()
        self._admit()
        if not self.rows:
            return []
        tokens, logprobs = self.tokens, self.logprobs
        tops = [r.top for r in self.rows]  # the pending tokens' alternatives, where asked for
        if any(r.generated + 1 < r.budget for r in self.rows):
            # enqueue the next token of every row before reading this one back
            self.tokens, self.logprobs = self._decode(tokens)
            mx.async_eval(self.tokens, self.logprobs, *[a for r in self.rows if r.top for a in r.top])
        else:  # every row ends with this token
            self.tokens = self.logprobs = None
        with self.tracer.span("readback", step=self.steps, sync=True):
            tokens = tokens.tolist()
        self.steps += 1
        out = []
        for row, token, logprob, top in zip(self.rows, tokens, logprobs.tolist(), tops):
            row.generated += 1
            reason = "stop" if token in row.stop_ids else ("length" if row.generated >= row.budget else None)
            row.done = reason is not None
            alternatives = list(zip(top[0][0].tolist(), top[1][0].tolist())) if top else None
            out.append(BatchResponse(row.uid, token, logprob, reason, alternatives))
        return out

    def _drop_done(self) -> None:
        keep = [i for i, r in enumerate(self.rows) if not r.done]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        self.cache = filter_caches(self.cache, keep)
        if not keep:
            self.tokens = self.logprobs = None
            return
        idx = mx.array(keep, mx.int32)
        self.tokens, self.logprobs = self.tokens[idx], self.logprobs[idx]

    def _admit(self) -> None:
        while self.waiting and len(self.rows) < self.max_batch:
            row = self.waiting.popleft()
            cache = make_prompt_cache(self.model, decode="plain")
            # all but the prompt's last chunk, then that chunk with its first token: generate_step's steps
            rest = prefill(self.model, row.prompt, cache, self.prefill_step_size, self.tracer)
            row.history = row.prompt if row.processors else None
            if row.top_k:
                logits = step_logits(self.model, rest, cache, self.tracer, "prefill")
                token, logprob, *row.top = sample_with_top(logits, row.sampler or self._greedy, row.processors,
                                                           row.history, row.top_k, self.tracer)
            else:
                token, logprob = decode_step(self.model, rest, cache, row.sampler or self._greedy, row.processors,
                                             row.history, self.tracer, "prefill")
            self.cache = merge_caches(self.cache, cache)
            self.rows.append(row)
            if self.tokens is None:
                self.tokens, self.logprobs = token, logprob
            else:
                self.tokens = mx.concatenate([self.tokens, token])
                self.logprobs = mx.concatenate([self.logprobs, logprob])

    def _decode(self, tokens: mx.array) -> Tuple[mx.array, mx.array]:
        """Enqueue one decode step of the whole batch fed `tokens` (B,): lazy (tokens (B,), logprobs (B,))."""
        with self.tracer.span("decode_step", tokens=int(tokens.size), sync=False):
            h = self.model.hidden(tokens[:, None], cache=self.cache)  # (B, 1) -> (B, 1, hidden)
            logits = self.model.logits(h[:, -1, :])  # (B, vocab)
        with self.tracer.span("sample", sync=False):
            return self._sample(logits, tokens)

    def _sample(self, logits: mx.array, fed: mx.array) -> Tuple[mx.array, mx.array]:
        """Each row's sampler on its logits: rows without logits processors that share a sampler (the greedy
        default, or one sampler given to many) in one call on their rows, the others one (1, V) row each
        after their processors. Returns (tokens (B,), logprobs (B,)) in row order."""
        groups: Dict[int, Tuple[Sampler, List[int]]] = {}
        singles = []
        for i, row in enumerate(self.rows):
            if row.processors or row.top_k:
                singles.append(i)
            else:
                sampler = row.sampler or self._greedy
                groups.setdefault(id(sampler), (sampler, []))[1].append(i)
        order, toks, lps = [], [], []
        B = len(self.rows)
        for sampler, idx in groups.values():
            sub = logits if len(idx) == B else logits[mx.array(idx, mx.int32)]  # (G, V)
            t, lp = sampler(sub)
            order += idx
            toks.append(t)
            lps.append(lp)
        for i in singles:
            row = self.rows[i]
            if row.processors:
                row.history = mx.concatenate([row.history, fed[i : i + 1]])
            # (1, V): the processors and sampler exactly as a single generation runs them
            sampler = row.sampler or self._greedy
            if row.top_k:
                t, lp, *row.top = sample_with_top(logits[i : i + 1], sampler, row.processors, row.history, row.top_k)
            else:
                t, lp = process_and_sample(logits[i : i + 1], sampler, row.processors, row.history)
            order.append(i)
            toks.append(t)
            lps.append(lp)
        tokens = toks[0] if len(toks) == 1 else mx.concatenate(toks)
        logprobs = lps[0] if len(lps) == 1 else mx.concatenate(lps)
        if order != list(range(B)):
            back = mx.array(sorted(range(B), key=order.__getitem__), mx.int32)  # position of row i in `order`
            tokens, logprobs = tokens[back], logprobs[back]
        return tokens, logprobs


def batch_generate(model, tokenizer, prompts: Sequence, *, max_tokens: int = 256, sampler: Optional[Sampler] = None,
                   logits_processors: Sequence[LogitsProcessor] = (), stop: Sequence[str] = (),
                   max_batch: int = 32, prefill_step_size: int = 512) -> List[str]:
    """Generate a text for each prompt, decoding up to `max_batch` of them together; texts in prompt order.

    prompts: strings (encoded as is), token id lists, or chat message lists (metalgen.generate's
    prompts). Each text is what `metalgen.generate` gives for its prompt alone (for greedy sampling, the
    same tokens): it ends at an EOS id, at any string in `stop` (cut before it), or after `max_tokens`.
    `sampler` (greedy when None) and `logits_processors` apply to every prompt.
    Raises MetalgenError for a hybrid (Gated DeltaNet) model; generate those one at a time."""
    from .api import encode_prompt

    if max_tokens < 0:
        raise MetalgenError(f"max tokens must be >= 0, got {max_tokens}")
    gen = BatchGenerator(model, max_batch=max_batch, prefill_step_size=prefill_step_size)
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    if max_tokens == 0:
        return ["" for _ in ids]
    texts: Dict[int, List[str]] = {}
    outs: Dict[int, TokenText] = {}
    order = []
    for p in ids:
        uid = gen.insert(p, max_tokens, sampler, logits_processors, tokenizer.eos_token_ids)
        texts[uid], outs[uid] = [], TokenText(tokenizer, stop)
        order.append(uid)
    while gen.busy:
        for r in gen.step():
            text, reason = outs[r.uid].add(r.token, last=r.finish_reason == "length")
            texts[r.uid].append(text)
            if reason is not None and r.finish_reason is None:
                gen.remove(r.uid)  # a stop string ended it
    return ["".join(texts[uid]) for uid in order]
