"""Continuous batching: several sequences decoded by one forward pass a token, each weight read once for
all of them, sequences joining and leaving the running batch between steps.

`BatchGenerator` is the token level (what the server runs): `insert` a prompt, `step` the batch, `remove`
a sequence. Prompts that arrive are prefilled together, up to `prefill_batch` of them left-padded into one
fresh batched cache (metalgen.batch_cache), one chunk of at most `prefill_step_size` tokens a step ahead of
the running rows' decode, so that a long prompt does not stall the batch; when their prompts are complete
their first tokens are sampled and they join the running batch, whose KV is paged (metalgen.paged_cache:
each row its own blocks) and whose decode step runs traced layer halves (metalgen.batch_step). Given a
`PrefixCache`
(metalgen.prefix_cache), a prompt starts from the KV of its longest prefix held there and only the rest is
prefilled; prompts (once prefilled) and finished sequences go into it. `batch_generate` is the offline API
over it: prompts in, texts out.

Dense, MoE and hybrid Gated DeltaNet decoders take this path. A hybrid stack's linear layers keep each row's
conv and recurrent states (metalgen.batch_cache.BatchLinearCache while prefilled, zeros fed at a row's left
padding; metalgen.paged_cache.LinearRowStates in the batch). Those states cannot be cut at a prefix: the
prefix cache keeps a snapshot of them where a prompt's prefill ends and where a sequence finishes, and a
hybrid prompt starts only from such a snapshot, prefilled in a group of its own (its twins aside).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import mlx.core as mx

import kernels_metal as K
from profiling import NullTracer

from .batch_cache import BatchKVCache, BatchLinearCache, empty_group_caches, filter_caches
from .batch_step import BatchStep
from .errors import MetalgenError
from .generate import TokenText, process_and_sample, sample_with_top
from .paged_cache import PagedBatchCache
from .prefix_cache import PrefixCache
from .sampling import DeviceSampler, LogitsProcessor, RepetitionPenalty, Sampler, make_sampler

_NULL_TRACER = NullTracer()
# a prompt chunk of this many activations (tokens x hidden size) or more is fed a layer at a time: 512 tokens
# of a 4096-wide model (Qwen3-30B-A3B, 2048 tokens: 5.8 GB past the weights as one graph, 0.4 GB so)
LAYER_BY_LAYER_MIN = 512 * 4096


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
        cached_tokens: how many of the sequence's prompt tokens were not prefilled, their KV copied from the
            generator's prefix cache (0 without one).
    """

    uid: int
    token: int
    logprob: float
    finish_reason: Optional[str] = None
    top_logprobs: Optional[List[Tuple[int, float]]] = None
    cached_tokens: int = 0


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
    ids: List[int] = dataclasses.field(default_factory=list)  # the prompt's ids, then each token read back
    cached: int = 0  # prompt tokens whose KV came from the prefix cache
    key: Tuple[int, ...] = ()  # the prompt's ids: rows waiting with equal keys share one prefill


@dataclasses.dataclass(eq=False)
class _Prefill:
    """Arrivals being prefilled together, a chunk a step, in a batched cache of their own until done. Rows
    with the same prompt (a request's `n` choices) are fed once: `rows` are the prompts fed, one cache row
    each, and twins[g] the other rows with rows[g]'s prompt, which get a copy of its cache row and its last
    logits when the prefill ends."""

    rows: List[_Row]
    ids: mx.array  # (G, T) int32: each row's prompt, left-padded to the longest (T) with id 0
    # per layer (BatchKVCache, or BatchLinearCache for a Gated DeltaNet layer): G rows, padding as in `ids`,
    # columns 0 .. fed - 1 written
    cache: List
    fed: int = 0  # columns of `ids` in the cache
    twins: List[List[_Row]] = dataclasses.field(default_factory=list)  # per row of `rows`

    def __post_init__(self):
        if not self.twins:
            self.twins = [[] for _ in self.rows]

    @property
    def padding(self) -> List[int]:
        return self.cache[0].padding

    @property
    def members(self) -> List[_Row]:
        """Every row joining with this group: those fed and their twins."""
        return self.rows + [t for ts in self.twins for t in ts]


class BatchGenerator:
    """Decodes up to `max_batch` sequences together, one forward pass a token for all of them.

    `step()` advances every sequence by one token and returns their tokens; finished or removed sequences
    leave first (their blocks freed). Sequences inserted since are prefilled together (up to
    `prefill_batch` rows, left-padded into one batched cache), at most one chunk of `prefill_step_size`
    tokens a step, enqueued ahead of the running rows' decode; a group whose prompts are complete samples
    its first tokens and joins the batch in that step (each row's KV copied into blocks of the paged cache).
    The loop is double-buffered like generate_step's: the next step is enqueued before this step's tokens
    are read back, and those (B,) token ids (with their computed logprobs) are the only
    per-step readback.
    """

    def __init__(self, model, *, max_batch: int = 8, prefill_step_size: int = 512, prefill_batch: int = 8,
                 prefix_cache: Optional[PrefixCache] = None, tracer=_NULL_TRACER):
        if max_batch < 1:
            raise MetalgenError(f"max batch must be >= 1, got {max_batch}")
        if prefill_batch < 1:
            raise MetalgenError(f"prefill batch must be >= 1, got {prefill_batch}")
        if prefill_step_size < 1:
            raise MetalgenError(f"prefill step size must be >= 1, got {prefill_step_size}")
        self.model = model
        self.max_batch = max_batch
        # tokens (padding included) a prefill chunk feeds, at most but for a last sliver of up to an eighth more
        self.prefill_step_size = prefill_step_size
        self.prefill_batch = prefill_batch  # prompts prefilled together at most
        self.tracer = tracer  # profiling spans: prefill chunks, decode steps, readbacks
        # where prompts find the KV of their longest prefix already computed, and where every prompt (once
        # prefilled) and finished sequence goes; None: every prompt is prefilled whole
        self.prefix_cache = prefix_cache
        # a hybrid stack's Gated DeltaNet states cannot be cut at a prefix: its prompts start from snapshots
        self._hybrid = getattr(model.spec, "hybrid", None) is not None
        self.steps = 0
        self.prefilled = 0  # prompt tokens fed so far (padding, cached prefixes and shared prompts not counted)
        self.context = model.spec.max_position_embeddings
        self._uids = itertools.count()
        self._greedy = make_sampler()
        self._step = BatchStep(model)  # the decode step over the paged cache, its layers traced
        # the rows sampled in one launch (_sample_fused): their device states [seed, counter, stream] (B, 3),
        # for the rows `_state_uids` in that order; the kernel's scratch (max_batch rows) by vocabulary size
        self._states: Optional[mx.array] = None
        self._state_uids: Tuple[int, ...] = ()
        self._scratch: Dict[int, object] = {}
        self.waiting: Deque[_Row] = collections.deque()  # inserted, prefill not begun
        self.prefilling: Optional[_Prefill] = None  # the group being prefilled, a chunk a step
        self.rows: List[_Row] = []  # the batch, in the caches' row order
        self.cache: Optional[PagedBatchCache] = None  # the rows' KV in blocks, None when the batch is empty
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
                   list(logits_processors), frozenset(int(t) for t in stop_token_ids), int(top_logprobs),
                   ids=[int(t) for t in ids], key=tuple(int(t) for t in ids))
        self.waiting.append(row)
        return row.uid

    def remove(self, uid: int) -> None:
        """Cancel a sequence: it leaves at the next step and reports no more tokens (unknown uids: no-op)."""
        self.waiting = collections.deque(r for r in self.waiting if r.uid != uid)
        for r in self.rows + (self.prefilling.members if self.prefilling else []):
            if r.uid == uid:
                r.done = True  # a prefilling row leaves its group at the next step

    @property
    def joining(self) -> int:
        """Sequences inserted that are not in the batch yet: waiting, or being prefilled."""
        return len(self.waiting) + (sum(not r.done for r in self.prefilling.members) if self.prefilling else 0)

    @property
    def busy(self) -> bool:
        """Whether a sequence is waiting, being prefilled or still generating."""
        return self.joining > 0 or any(not r.done for r in self.rows)

    def step(self) -> List[BatchResponse]:
        """Advance the batch by one token: finished rows leave, one chunk of the arrivals' prefill runs (a
        group whose prompts it completes joins, first tokens sampled), and every row's next token comes
        back, in the batch's order (none while only arrivals are being prefilled)."""
        self._drop_done()
        self._prefill_chunk()
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
            row.ids.append(token)
            reason = "stop" if token in row.stop_ids else ("length" if row.generated >= row.budget else None)
            row.done = reason is not None
            alternatives = list(zip(top[0][0].tolist(), top[1][0].tolist())) if top else None
            out.append(BatchResponse(row.uid, token, logprob, reason, alternatives, row.cached))
        return out

    def _drop_done(self) -> None:
        keep = [i for i, r in enumerate(self.rows) if not r.done]
        if len(keep) == len(self.rows):
            return
        if self.prefix_cache is not None:
            # each leaving row's prompt and the tokens it was fed, for a later request that goes on from them
            done = [b for b, row in enumerate(self.rows) if row.done]
            for b, slicer in zip(done, self.cache.row_slicers(done)):
                self.prefix_cache.insert(self.rows[b].ids[: self.cache.lengths[b]], slicer,
                                         self.cache.row_states(b) if self._hybrid else None)
        self.rows = [self.rows[i] for i in keep]
        self.cache.keep(keep)  # the others' blocks are free now
        if not keep:
            self.cache = None  # the pools go with the last row: memory back to idle
            self.tokens = self.logprobs = None
            self._states, self._state_uids = None, ()  # nothing to carry over: let the memory go
            return
        idx = mx.array(keep, mx.int32)
        self.tokens, self.logprobs = self.tokens[idx], self.logprobs[idx]

    def _prefill_chunk(self) -> None:
        """Enqueue one chunk of the arrivals' prefill: the group in progress (less its cancelled rows), else a
        new group from the waiting prompts if the batch has room. A chunk feeds every row of the group the
        same columns of their left-padded prompts, at most `prefill_step_size` tokens in all (the last chunk up
        to an eighth more, rather than leave a sliver for a chunk of its own); the chunk that
        ends the prompts gives each row's first token, and the group joins the running batch. A hybrid stack
        with a prefix cache feeds the prompts' last column as a chunk of its own, so that the cache gets a
        snapshot of each row's states before it: a prompt sent again (a regenerated reply, more choices)
        starts there, and is fed only its last token."""
        group = self._drop_cancelled(self.prefilling) if self.prefilling else self._group()
        self.prefilling = group
        if group is None:
            return
        G, T = group.ids.shape
        # the chunk's tokens, padding included, bound its activations: G rows of `width` columns
        width = max(1, self.prefill_step_size // G)
        start, end = group.fed, min(T, group.fed + width)
        if T - end <= width // 8:
            # a sliver left (a prompt of 129 tokens, 64 columns a chunk) joins this chunk: a chunk costs about
            # as many launches whatever its width, so a chunk of one column would cost a step for nothing
            end = T
        # hybrid: the prompts but their last tokens first, for the snapshot (the twins' prompts are equal)
        last_apart = self._hybrid and self.prefix_cache is not None
        if last_apart and end == T and start < T - 1:
            end = T - 1
        chunk = group.ids[:, start:end]  # (G, C)
        self.prefilled += sum(max(0, end - max(start, p)) for p in group.padding)  # real tokens, not padding
        with self.tracer.span("prefill", rows=G, tokens=G * (end - start), sync=False):
            # a large chunk a layer at a time, as generate.prefill feeds a prompt's chunks: a whole-stack graph
            # would keep every layer's temporaries until the device reaches them. A small one as one graph: a
            # layer at a time waits for each layer in turn (28 waits for qwen3-0.6b), and the host, which
            # launches the kernels, cannot run ahead of the device
            big = G * (end - start) * self.model.spec.hidden_size >= LAYER_BY_LAYER_MIN
            h = self.model.hidden(chunk, cache=group.cache, layer_by_layer=big)
            group.fed = end
            if end < T:
                mx.async_eval([c.state for c in group.cache])
                if last_apart and end == T - 1:
                    self._store(group.cache, [row.ids[:-1] for row in group.rows])
                return
            # rows are left-padded: the last column is every row's last prompt token
            logits = self.model.logits(h[:, -1, :])  # (G, hidden) -> (G, vocab)
        if self.prefix_cache is not None:  # their prompts now: arrivals sharing them need not wait for the end
            self._store(group.cache, [row.ids for row in group.rows])
        rows, at = group.rows, list(range(len(group.rows)))
        if any(group.twins):
            # each twin joins with a copy of its prompt's cache row and the same last logits; the rows in the
            # order they were inserted, as without sharing
            pairs = sorted(((r, g) for g, row in enumerate(group.rows) for r in [row] + group.twins[g]),
                           key=lambda pair: pair[0].uid)
            rows = [r for r, _ in pairs]
            at = [g for _, g in pairs]
            logits = logits[mx.array(at, mx.int32)]
        tokens, logprobs = self._first_tokens(logits, rows)
        self.prefilling = None
        if self.cache is None:
            self.cache = PagedBatchCache.for_model(self.model)
        self.cache.join(group.cache, at)  # each row's KV copied into blocks of its own
        self.rows += rows
        if self.tokens is None:
            self.tokens, self.logprobs = tokens, logprobs
        else:
            self.tokens = mx.concatenate([self.tokens, tokens])
            self.logprobs = mx.concatenate([self.logprobs, logprobs])

    def _group(self) -> Optional[_Prefill]:
        """Take the next prompts to prefill together from the waiting queue, None if none or no room.

        The oldest waiting prompt always goes; each later one (in arrival order, up to `prefill_batch` and
        the batch's room) joins it if the group, padded to its longest prompt, still fits one chunk
        (`prefill_step_size` tokens), or else if padding stays at most a quarter of the group's tokens.
        Why: a chunk of short prompts costs about one read of the weights however many rows it has, so
        within one chunk grouping is nearly free and the padding costs no extra step; past one chunk the
        pass is compute-bound, grouping gains little, and padding would add steps (each one delaying the
        running batch) and make a short prompt wait for a long one's prefill. A prompt left out keeps its
        place in the queue and, the oldest always going, is not passed over for long. With a prefix cache,
        the lengths weighed are what is left to prefill of each prompt past its longest cached prefix.
        A waiting prompt equal to one picked (a request's `n` choices) joins as its twin: it costs no prefill
        and no place among the `prefill_batch`, only its row of the batch, and gets a copy of the other's KV.
        A hybrid stack's prompt that starts from a cached state snapshot is fed alone (with its twins): rows
        prefilled together are fed the same columns, and its states cannot go back to where another row's
        cached prefix ends; one passed over for that keeps its place."""
        room = self.max_batch - len(self.rows)  # rows, twins included
        cap = min(self.prefill_batch, room)  # prompts fed
        if not self.waiting or room < 1:
            return None
        held: Dict[int, int] = {}  # id(row) -> the leading ids of its prompt the prefix cache holds

        def to_feed(row: _Row) -> int:
            # at least the last prompt token is fed: its logits give the first token
            n = len(row.ids)
            if self.prefix_cache is None:
                held[id(row)] = 0
            elif self._hybrid:
                held[id(row)] = self.prefix_cache.match_state(row.ids, n - 1)
            else:
                held[id(row)] = min(self.prefix_cache.match(row.ids), n - 1)
            return n - held[id(row)]

        picked = [self.waiting[0]]
        twins: Dict[Tuple[int, ...], List[_Row]] = {picked[0].key: []}  # by prompt: the rows sharing its prefill
        taken_rows = 1
        longest = real = to_feed(self.waiting[0])
        for row in itertools.islice(self.waiting, 1, None):
            if taken_rows == room:
                break
            if row.key in twins:
                twins[row.key].append(row)
                taken_rows += 1
                continue
            if len(picked) == cap:
                continue  # only twins of the picked prompts may still join
            n = to_feed(row)
            if self._hybrid and (held[id(row)] or held[id(picked[0])]):
                continue  # a hybrid prompt that starts from a snapshot is fed alone
            padded = (len(picked) + 1) * max(longest, n)
            if padded <= self.prefill_step_size or 4 * (padded - real - n) <= padded:
                picked.append(row)
                twins[row.key] = []
                taken_rows += 1
                longest, real = max(longest, n), real + n
        taken = set(map(id, picked)) | {id(t) for ts in twins.values() for t in ts}
        self.waiting = collections.deque(r for r in self.waiting if id(r) not in taken)
        T = max(len(r.ids) for r in picked)
        padding = [T - len(r.ids) for r in picked]
        # (G, T): each prompt after its padding (id 0: any id will do, the mask hides it)
        ids = mx.stack([mx.concatenate([mx.zeros((p,), mx.int32), r.prompt]) if p else r.prompt
                        for r, p in zip(picked, padding)])
        cache, fed = self._start_cache(picked, padding, [held[id(r)] for r in picked])
        for row in picked:
            for twin in twins[row.key]:
                twin.cached = row.cached
        return _Prefill(picked, ids, cache, fed, [twins[r.key] for r in picked])

    def _start_cache(self, rows: List[_Row], padding: List[int], held: List[int]) -> Tuple[List[BatchKVCache], int]:
        """The per-layer caches a group starts from, and the columns of its ids they hold. Rows are
        right-aligned (left-padded), so every row is fed the same columns: from `start`, the first column
        that some row lacks (its padding plus its cached prefix), to the end, which is the longest
        remainder of the group. Before `start`, each row's columns are its padding and then its first
        cached tokens, copied from the prefix cache; a row that holds more than that recomputes the rest
        with the others (the cost of one aligned matrix, and what the grouping weighs). Sets each row's
        `cached`. Without a cached prefix in some row, `start` is 0 and the caches are empty. A hybrid stack's
        Gated DeltaNet layers start from the rows' state snapshots at `start` (its rows then start there:
        `_group` feeds such a prompt alone)."""
        start = min(p + h for p, h in zip(padding, held))
        parts_k, parts_v, like = [], [], None
        for row, p in zip(rows, padding):
            row.cached = max(0, start - p)  # its tokens in columns p .. start - 1
            if row.cached:
                k, v = self.prefix_cache.fetch(row.ids, row.cached)  # (layers, kv_heads, cached, head_dim)
                pad = [(0, 0), (0, 0), (start - row.cached, 0), (0, 0)]
                k, v = (mx.pad(k, pad), mx.pad(v, pad)) if start > row.cached else (k, v)
                like = k, v
            else:
                k = v = None  # all padding: zeros, once a row has told the shapes
            parts_k.append(k)
            parts_v.append(v)
        if start == 0:
            return empty_group_caches(self.model, padding), 0
        # the longest prompt has no padding and start > 0 columns cached: `like` is set
        parts_k = [mx.zeros_like(like[0]) if k is None else k for k in parts_k]
        parts_v = [mx.zeros_like(like[1]) if v is None else v for v in parts_v]
        # rows (layers, kv_heads, start, head_dim) -> (layers, G, kv_heads, start, head_dim): a layer's slice
        # is that layer's batch of rows
        keys, values = mx.stack(parts_k, axis=1), mx.stack(parts_v, axis=1)
        kv = iter(range(keys.shape[0]))
        states = None
        if self._hybrid:
            # each row's snapshot: (conv (1, ...), recurrent (1, ...)) per Gated DeltaNet layer, in layer order
            snaps = [self.prefix_cache.fetch_states(row.ids, row.cached) for row in rows]
            states = iter(range(0, len(snaps[0]), 2))
        caches = []
        for layer in range(len(self.model.layers)):
            if self._hybrid and self.model.spec.hybrid.is_linear(layer):
                j = next(states)
                c = BatchLinearCache(padding, start)
                c.conv_state = mx.concatenate([snap[j] for snap in snaps])
                c.recurrent = mx.concatenate([snap[j + 1] for snap in snaps])
            else:
                i = next(kv)
                c = BatchKVCache.prefilled(keys[i], values[i], padding)
            caches.append(c)
        return caches, start

    def _drop_cancelled(self, group: _Prefill) -> Optional[_Prefill]:
        """The group without its removed rows (None if none is left), and without the left columns that are
        padding in every row kept. A prompt fed is kept while it or a twin is; a twin takes a removed row's
        place."""
        slots = [[r for r in [row] + ts if not r.done] for row, ts in zip(group.rows, group.twins)]
        keep = [i for i, live in enumerate(slots) if live]
        if len(keep) == len(group.rows):
            if any(len(live) <= len(ts) for live, ts in zip(slots, group.twins)):  # a member left
                group.rows = [live[0] for live in slots]
                group.twins = [live[1:] for live in slots]
            return group
        if not keep:
            return None
        padding = [group.padding[i] for i in keep]
        shared = min(padding)
        ids = group.ids[mx.array(keep, mx.int32)][:, shared:]  # (G', T - shared)
        if shared >= group.fed:
            # all that was fed is padding of every row kept: start again after it, in a fresh cache
            cache, fed = empty_group_caches(self.model, [p - shared for p in padding]), 0
        else:
            cache, fed = filter_caches(group.cache, keep), group.fed - shared  # drops the `shared` columns
        return _Prefill([slots[i][0] for i in keep], ids, cache, fed, [slots[i][1:] for i in keep])

    def _store(self, cache: List, ids: List[List[int]]) -> None:
        """Give the prefix cache each row b of the per-layer caches `cache`, which holds the KV of ids[b] from
        its padding on (it copies only the positions it lacks), and for a hybrid stack the snapshot of its
        Gated DeltaNet states after them. The rows share one copy of the layers' keys and values stacked,
        made when a row is first asked for its positions, and each row's positions are one copy of it:
        stacking each row's slices of every layer would cost 2 x layers launches a row (a launch costs the
        host ~10 us; 8 rows of a 28-layer model took 8 ms so)."""
        kv = [c for c in cache if isinstance(c, BatchKVCache)]
        linear = [c for c in cache if isinstance(c, BatchLinearCache)]
        @functools.cache  # made once, when a row is first asked
        def stacked() -> Tuple[mx.array, mx.array]:
            n = kv[0].offset  # (layers, G, kv_heads, n, head_dim): the columns written
            return mx.stack([c.keys[..., :n, :] for c in kv]), mx.stack([c.values[..., :n, :] for c in kv])

        def slicer_of(b: int):
            first = kv[0].padding[b]

            def slicer(begin: int, end: int) -> Tuple[mx.array, mx.array]:
                keys, values = stacked()
                cols = slice(first + begin, first + end)
                # row b's columns -> (layers, kv_heads, end - begin, head_dim), a buffer of its own
                return mx.contiguous(keys[:, b, :, cols, :]), mx.contiguous(values[:, b, :, cols, :])

            return slicer

        def states_of(b: int):
            return lambda: [a[b : b + 1] for c in linear for a in (c.conv_state, c.recurrent)]

        for b, row_ids in enumerate(ids):
            self.prefix_cache.insert(row_ids, slicer_of(b), states_of(b) if linear else None)

    def _first_tokens(self, logits: mx.array, rows: List[_Row]) -> Tuple[mx.array, mx.array]:
        """Each row's first token from its prompt's last logits (G, V), as a generation alone samples it
        (process_and_sample, or sample_with_top for a row with alternatives), one (1, V) row at a time:
        arrivals bring their own samplers, so a shared call would rarely group more than one. Returns lazy
        (tokens (G,), logprobs (G,)) in row order."""
        toks, lps = [], []
        for i, row in enumerate(rows):
            row.history = row.prompt if row.processors else None
            sampler = row.sampler or self._greedy
            if row.top_k:
                t, lp, *row.top = sample_with_top(logits[i : i + 1], sampler, row.processors, row.history,
                                                  row.top_k, self.tracer)
            else:
                t, lp = process_and_sample(logits[i : i + 1], sampler, row.processors, row.history, self.tracer)
            toks.append(t)
            lps.append(lp)
        if len(toks) == 1:
            return toks[0], lps[0]
        return mx.concatenate(toks), mx.concatenate(lps)

    def _decode(self, tokens: mx.array) -> Tuple[mx.array, mx.array]:
        """Enqueue one decode step of the whole batch fed `tokens` (B,): lazy (tokens (B,), logprobs (B,))."""
        with self.tracer.span("decode_step", tokens=int(tokens.size), sync=False):
            # each row's slot, lengths and block table for this step, padded to the rows the traced step runs
            self.cache.begin_step(self._step.rows(int(tokens.size)))
            h = self._step.hidden(tokens, self.cache)  # (B,) -> (B, 1, hidden)
            logits = self.model.logits(h[:, -1, :])  # (B, vocab)
        with self.tracer.span("sample", sync=False):
            return self._sample(logits, tokens)

    def _sample(self, logits: mx.array, fed: mx.array) -> Tuple[mx.array, mx.array]:
        """Each row's sampler on its logits: the rows of `make_sampler` samplers with at most a repetition
        penalty in one launch, each with its own settings and state (`_sample_fused`); the others one (1, V)
        row each after their processors. Returns (tokens (B,), logprobs (B,)) in row order."""
        fused, singles = [], []
        for i, row in enumerate(self.rows):
            (fused if self._fusable(row) else singles).append(i)
        order, toks, lps = [], [], []
        B = len(self.rows)
        if fused:
            t, lp = self._sample_fused(logits if len(fused) == B else logits[mx.array(fused, mx.int32)], fed, fused)
            order += fused
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


    def _fusable(self, row: _Row) -> bool:
        # a DeviceSampler's draw, with a lone repetition penalty at most, is what the rows launch does
        sampler = row.sampler or self._greedy
        if not isinstance(sampler, DeviceSampler) or row.top_k:
            return False
        return not row.processors or (len(row.processors) == 1 and isinstance(row.processors[0], RepetitionPenalty))

    def _sample_fused(self, logits: mx.array, fed: mx.array, idx: List[int]) -> Tuple[mx.array, mx.array]:
        """One sampler launch for the rows `idx` (logits (G, V), theirs): each row's settings, penalty window
        and state, so that a row with a sampler of its own draws what it would draw alone."""
        rows = [self.rows[i] for i in idx]
        settings, windows = [], []
        C = max((r.processors[0].context_size for r in rows if r.processors), default=0)
        none = mx.full((C,), -1, mx.int32) if C else None  # the window of a row without a penalty
        for i, r in zip(idx, rows):
            s = r.sampler or self._greedy
            pen = r.processors[0] if r.processors else None
            settings.append((s.temperature, s.top_k, s.top_p, s.min_p, pen.penalty if pen else 1.0,
                             pen.context_size if pen else 0))
            if C:
                if pen:
                    r.history = mx.concatenate([r.history, fed[i : i + 1]])
                    w = r.history[-C:]
                    windows.append(mx.pad(w, (C - w.shape[0], 0), constant_values=-1) if w.shape[0] < C else w)
                else:
                    windows.append(none)
        recent = mx.stack(windows) if C else None  # (G, C): each row's last ids, -1 before its history
        V = logits.shape[-1]
        if V not in self._scratch:  # one for every row count: a launch uses its first rows
            self._scratch[V] = K.make_sample_scratch(self.max_batch, V)
        tokens, logprobs, self._states = K.sample_rows(logits, settings, self._row_states(rows), recent,
                                                       self._scratch[V])
        self._state_uids = tuple(r.uid for r in rows)
        return tokens, logprobs

    def _row_states(self, rows: List[_Row]) -> mx.array:
        """The device states (G, 3) of `rows`: those sampled in the last launch carried over (their counters
        advanced on the device), a new row's from its sampler's state and a stream of its own (0 for a
        sampler's first row: it draws as alone; a shared sampler's later rows 1, 2, ...)."""
        uids = tuple(r.uid for r in rows)
        if uids == self._state_uids:
            return self._states
        old = {u: i for i, u in enumerate(self._state_uids)}
        kept = [r for r in rows if r.uid in old]
        new = [r for r in rows if r.uid not in old]
        parts = []
        if kept:
            parts.append(self._states[mx.array([old[r.uid] for r in kept], mx.int32)])
        for r in new:
            s = r.sampler or self._greedy
            stream = s.next_stream()
            parts.append(mx.concatenate([s.state[:2].astype(mx.uint32), mx.array([stream], mx.uint32)])[None])
        states = mx.concatenate(parts) if len(parts) > 1 else parts[0]
        placed = [r.uid for r in kept + new]
        if placed != list(uids):  # back into the rows' order
            at = {u: i for i, u in enumerate(placed)}
            states = states[mx.array([at[u] for u in uids], mx.int32)]
        return states


def batch_generate(model, tokenizer, prompts: Sequence, *, max_tokens: int = 256, sampler: Optional[Sampler] = None,
                   logits_processors: Sequence[LogitsProcessor] = (), stop: Sequence[str] = (),
                   max_batch: int = 32, prefill_step_size: int = 512, prefill_batch: int = 8) -> List[str]:
    """Generate a text for each prompt, decoding up to `max_batch` of them together; texts in prompt order.

    prompts: strings (encoded as is), token id lists, or chat message lists (metalgen.generate's
    prompts). Each text is what `metalgen.generate` gives for its prompt alone (for greedy sampling, the
    same tokens): it ends at an EOS id, at any string in `stop` (cut before it), or after `max_tokens`.
    `sampler` (greedy when None) and `logits_processors` apply to every prompt.
    """
    from .api import encode_prompt

    if max_tokens < 0:
        raise MetalgenError(f"max tokens must be >= 0, got {max_tokens}")
    gen = BatchGenerator(model, max_batch=max_batch, prefill_step_size=prefill_step_size,
                         prefill_batch=prefill_batch)
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
