"""The server's generation engine, on a worker thread. With `max_batch` above 1 requests
join a running batch as they arrive (metalgen.batch: one forward pass a token for every request in it)
and leave it when they finish or their client goes away. With `max_batch` 1 requests run one at a time
(the default: on the fast decode path, which serves one sequence) on one prompt cache that each
request trims to the prefix it shares with the one before (a chat's earlier turns, a shared system
prompt), so only the rest is prefilled (docs/serve.md). A batch finds the longest prefix of each prompt in a
prefix cache of earlier requests' KV (metalgen.prefix_cache), bounded by `prefix_cache_gb` (for a hybrid Gated
DeltaNet stack, with snapshots of its states where prompts and sequences end)."""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from typing import Dict, List, Optional, Tuple

import mlx.core as mx

from profiling import NULL_TRACER

from ..batch import BatchGenerator
from ..chat import ReusedCache
from ..errors import MetalgenError
from ..generate import TokenText, stream_generate
from ..prefix_cache import PrefixCache
from ..sampling import make_logits_processors, make_presence_frequency_penalty, make_sampler
from ..structured import JsonConstraint, token_index
from .protocol import GenerationRequest, RequestError, usage
from .reasoning import opens_in_prompt


class JobEvents:
    """What a worker thread and a request's handler share: the events the worker puts for the handler's
    event loop, and the flag the handler sets when its client goes away."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()  # the client went away: stop at the next token (or chunk)

    def put(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the server's loop has closed (shutdown): nobody is left to read it
            pass


def _put_all(pairs) -> None:
    for events, event in pairs:
        events.put_nowait(event)


class Outbox:
    """Events the worker puts in one batched round, handed to the handlers' loop in one call when flushed.
    Why: a loop woken once an event (call_soon_threadsafe) wakes 32 times a step at 32 streams, and each time
    its thread takes the GIL from the worker, which is launching the next step; waiting to get it back costs
    the worker up to Python's switch interval (5 ms) a time."""

    def __init__(self):
        self.pending: List[Tuple[JobEvents, tuple]] = []

    def put(self, job: JobEvents, event: tuple) -> None:
        self.pending.append((job, event))

    def flush(self) -> None:
        by_loop: Dict[asyncio.AbstractEventLoop, list] = {}
        for job, event in self.pending:
            by_loop.setdefault(job.loop, []).append((job.events, event))
        self.pending = []
        for loop, pairs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, pairs)
            except RuntimeError:  # the server's loop has closed (shutdown): nobody is left to read them
                pass


DEFAULT_MAX_QUEUE = 256  # requests that may wait for the worker (`metalgen serve --max-queue`)


class InFlight:
    """An engine's jobs submitted and not yet ended, and the cap on those waiting: past the `running` the
    worker serves at once (the batch's rows, or the one job), at most `max_queue` may wait (None: no cap).
    The handlers' loop adds and admits, the worker ends jobs, hence the lock."""

    def __init__(self, running: int, max_queue: Optional[int] = DEFAULT_MAX_QUEUE):
        if max_queue is not None and max_queue < 0:
            raise MetalgenError(f"--max-queue must be >= 0, got {max_queue}")
        self.running, self.max_queue = running, max_queue
        self.jobs: set = set()
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job) -> None:
        with self.lock:
            self.jobs.add(job)

    def discard(self, job) -> None:
        with self.lock:
            self.jobs.discard(job)

    def live(self) -> int:
        """Jobs in flight whose client is still there (one whose client went away will be skipped)."""
        with self.lock:
            return sum(1 for job in self.jobs if not job.cancelled.is_set())

    def waiting(self) -> int:
        """Jobs waiting for the worker now."""
        return max(0, self.live() - self.running)

    def admit(self) -> None:
        """Refuses a new request (429, with Retry-After) when it would have to wait and `max_queue` jobs wait
        already; a request of n choices is taken while one place is left. Called on the handlers' loop right
        before the request's jobs are submitted, so that nothing comes between the check and the submission."""
        if self.max_queue is None:
            return
        live = self.live()
        if live >= self.running + self.max_queue:
            waiting = max(0, live - self.running)
            raise RequestError(f"the server is busy: {waiting} requests are waiting, its limit (--max-queue "
                               f"{self.max_queue}); retry later", 429, "requests", code="rate_limit_exceeded",
                               headers={"Retry-After": "1"})


class Job(JobEvents):
    """One request in flight (one choice of it): its ids, and the events its handler reads: ("text", str)
    (each after its tokens' ("token", id, logprob, top alternatives) where the request asks for logprobs),
    then ("done", finish_reason, usage) or ("error", RequestError)."""

    def __init__(self, req: GenerationRequest, ids: List[int], loop: asyncio.AbstractEventLoop,
                 in_reasoning: bool = False):
        super().__init__(loop)
        self.req, self.ids = req, ids
        self.in_reasoning = in_reasoning  # the prompt opened a thinking block


class _Running:
    """A job in the batch: its text so far (detokenized, stop strings held back) and its token count."""

    def __init__(self, job: Job, tokenizer):
        self.job = job
        self.text = TokenText(tokenizer, job.req.stop)
        self.generated = 0
        self.cached = 0  # prompt tokens whose KV came from the prefix cache


class Engine:
    """Serves `model` as `name`; `submit` queues a request, the worker thread generates it (up to
    `max_batch` requests decoded together; batched, a prefix cache of up to `prefix_cache_gb` GiB of earlier
    requests' KV, 0 for none). `admit` refuses a request while `max_queue` jobs wait already (InFlight)."""

    def __init__(self, model, tokenizer, name: str, decode=None, prefill_step_size: int = 512, max_batch: int = 1,
                 prefix_cache_gb: float = 1.0, max_queue: Optional[int] = DEFAULT_MAX_QUEUE, tracer=NULL_TRACER):
        if max_batch < 1:
            raise MetalgenError(f"--max-batch must be >= 1, got {max_batch}")
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.context = model.spec.max_position_embeddings
        self.prefill_step_size = prefill_step_size
        self.decode = decode
        self.max_batch = max_batch
        # the generation's spans (prefill chunks, decode steps, readbacks) and, batched, each round's handling of
        # the tokens ("deliver": detokenizing and the handlers' events); the worker thread alone writes them
        self.tracer = tracer
        self.peak_batch = 0  # the most requests decoded together so far
        # prompt tokens run through the model so far (cached prefixes and the prompt shared by a request's n
        # choices not counted): in batches past, and in the running one (its generator counts)
        self._prefilled = 0
        if not prefix_cache_gb >= 0:
            raise MetalgenError(f"--prefix-cache-gb must be >= 0, got {prefix_cache_gb}")
        self.prefix_cache = (PrefixCache(int(prefix_cache_gb * 2**30)) if self.max_batch > 1 and prefix_cache_gb > 0
                             else None)
        # MLX binds an unevaluated array to the stream (of the thread) that made it, and the worker has a
        # stream of its own: the weights are evaluated here, and the cache is made by the worker
        mx.eval(model.parameters())
        self.stream = mx.new_thread_local_stream(mx.default_device())
        self.reused = None
        self.jobs: "queue.Queue[Job]" = queue.Queue()
        self._submitting = threading.Lock()  # held while a request's jobs are queued (`submit`)
        # jobs submitted and not yet ended (a done or error event put), for `state` (what a request stuck in the
        # engine would show as) and for the cap on the queue
        self.in_flight = InFlight(self.max_batch, max_queue)
        self._gen: Optional[BatchGenerator] = None  # the running batch (batched mode)
        self._current: Optional[Job] = None  # the job generating now (one at a time)
        self._outbox: Optional[Outbox] = None  # a batched round's events, while it runs
        self.worker = threading.Thread(target=self._work, name="metalgen-engine", daemon=True)
        self.worker.start()

    def encode(self, req: GenerationRequest) -> Tuple[List[int], bool]:
        """The prompt's ids (chat messages through the template), checked against the context, and whether
        the rendered prompt opens a thinking block."""
        opened = False
        if req.kind == "chat":
            try:
                kw = dict(req.template_kwargs, add_generation_prompt=True)
                if req.tools:
                    kw["tools"] = req.tools
                # a tool_choice that forces a call starts the reply with the call (tools.forced_prefix)
                text = self.tokenizer.apply_chat_template(req.messages, tokenize=False, **kw) + req.tool_prefix
            except Exception as e:  # noqa: BLE001 - a template that rejects the conversation is the client's
                raise RequestError(f"the chat template cannot render these messages: {str(e).splitlines()[0]}",
                                   param="messages")
            ids = self.tokenizer.encode(text, add_special_tokens=False)  # as tokenize=True encodes it
            opened = opens_in_prompt(text)
        else:
            ids = self.tokenizer.encode(req.prompt)
        if len(ids) >= self.context:
            raise RequestError(f"the prompt has {len(ids)} tokens, past the model's context of {self.context}",
                               param="messages" if req.kind == "chat" else "prompt", code="context_length_exceeded")
        # a limit the client set must fit (OpenAI's rule); the server's default is clamped to the context instead
        if req.limit_param is not None and len(ids) + req.max_tokens > self.context:
            raise RequestError(f"'{req.limit_param}' {req.max_tokens} and the prompt's {len(ids)} tokens exceed the "
                               f"model's context of {self.context} (ask for at most {self.context - len(ids)})",
                               param=req.limit_param, code="context_length_exceeded")
        return ids, opened

    def admit(self) -> None:
        """Raises RequestError (429) while the queue is full (`max_queue` jobs waiting)."""
        self.in_flight.admit()

    def submit(self, req: GenerationRequest, ids: List[int], in_reasoning: bool = False, n: int = 1) -> List[Job]:
        """Queue a request's `n` choices, one job each (with a seed, choice i samples with seed + i). They are
        queued together, so that the worker takes them in one round: batched, they join one prefill group and
        the prompt is fed once for all (metalgen.batch: rows with one prompt share its prefill); one at a time,
        they run one after another, each choice after the first starting from the prompt's KV that the one
        before left in the prompt cache."""
        loop = asyncio.get_running_loop()
        jobs = [Job(req if req.seed is None or i == 0 else dataclasses.replace(req, seed=req.seed + i), ids, loop,
                    in_reasoning) for i in range(n)]
        with self._submitting:  # the worker drains the queue only between two requests' submissions
            for job in jobs:
                self.in_flight.add(job)
                self.jobs.put(job)
        return jobs

    def state(self) -> Dict[str, int]:
        """The engine's load now (for /debug/engine and the fault tests): "jobs" submitted and not yet ended,
        "queued" for the worker, "rows" in the batch (ended ones until the next step) or the one job of one at a
        time, and "waiting" to join the batch (being prefilled included); all zero: idle. "prefilled_tokens": the prompt
        tokens run through the model since the start (a prefix found cached, and the prompt that a request's n
        choices share, fed once). Read from another thread, so a snapshot, not a lock."""
        gen = self._gen
        prefilled = self._prefilled + (gen.prefilled if gen is not None else 0)
        rows = len(gen.rows) if gen is not None else int(self._current is not None)
        waiting = 0
        if gen is not None:
            group = getattr(gen, "prefilling", None)  # (read once: the worker may clear it meanwhile)
            waiting = len(gen.waiting) + (len(group.members) if group is not None else 0)
        return {"jobs": len(self.in_flight), "queued": self.jobs.qsize(), "rows": rows, "waiting": waiting,
                "max_batch": self.max_batch, "peak_batch": self.peak_batch, "max_queue": self.in_flight.max_queue,
                "prefilled_tokens": prefilled}

    def _end(self, job: Job, *event) -> None:
        """A job's last event ("done", finish, usage) or ("error", RequestError): it leaves the live set."""
        self.in_flight.discard(job)
        self._put(job, *event)

    def _put(self, job: Job, *event) -> None:
        if self._outbox is not None:
            self._outbox.put(job, event)
        else:
            job.put(*event)

    def _work(self) -> None:
        with mx.stream(self.stream):
            if self.max_batch > 1:
                return self._work_batched()  # for the server's life
            # checkpoints: a hybrid stack's n choices and a chat's next turn resume from the prompt's state
            self.reused = ReusedCache(self.model, self.decode, self.prefill_step_size, checkpoints=True)
            while True:
                self._serve(self.jobs.get())

    # -- batched: jobs join and leave a running batch --------------------------------------------------

    def _work_batched(self) -> None:
        running: Dict[int, _Running] = {}
        self._gen = self._new_batch()
        while True:
            try:
                self._round(self._gen, running)
            except Exception as e:  # noqa: BLE001 - the worker outlives any fault: its batch fails, and says why
                error = e if isinstance(e, RequestError) else RequestError(
                    f"generation failed: {type(e).__name__}: {e}", 500, "server_error")
                for r in running.values():
                    self._end(r.job, "error", error)
                running.clear()
                if self.prefix_cache is not None:
                    self.prefix_cache.clear()  # what the failed step inserted may never be computed
                self._prefilled += self._gen.prefilled
                self._gen = self._new_batch()

    def _round(self, gen: BatchGenerator, running: Dict[int, "_Running"]) -> None:
        """Arrivals join, cancelled jobs leave, then one step of the batch (if anything is left to run); the
        round's events reach the handlers' loop together at its end."""
        self._outbox = Outbox()
        try:
            self._round_events(gen, running)
        finally:
            outbox, self._outbox = self._outbox, None
            outbox.flush()

    def _round_events(self, gen: BatchGenerator, running: Dict[int, "_Running"]) -> None:
        if not gen.busy and (gen.rows or getattr(gen, "prefilling", None) is not None):
            # rows that ended (or a prefill group all cancelled) leave now, caches and all, rather than when
            # the next request comes
            gen.step()
        for job in self._arrivals(block=not gen.busy):
            self._join(gen, job, running)
        for uid, r in list(running.items()):
            if r.job.cancelled.is_set():  # the client went away: out of the batch before the next token
                gen.remove(uid)
                self._finish(running.pop(uid), "cancelled")
        if not gen.busy:
            return
        responses = gen.step()
        self.peak_batch = max(self.peak_batch, len(responses))
        with self.tracer.span("deliver", rows=len(responses), sync=False):
            self._deliver(gen, running, responses)

    def _deliver(self, gen: BatchGenerator, running: Dict[int, "_Running"], responses) -> None:
        """A step's tokens to their jobs: logprob events, text (stop strings held back), ends."""
        for resp in responses:
            r = running[resp.uid]
            r.generated += 1
            r.cached = resp.cached_tokens
            self._put_token(r.job, resp.token, resp.logprob, resp.top_logprobs)
            text, finish = r.text.add(resp.token, last=resp.finish_reason == "length")
            if text:
                self._put(r.job, "text", text)
            if finish is not None:
                if resp.finish_reason is None:
                    gen.remove(resp.uid)  # a stop string ended it
                self._finish(running.pop(resp.uid), finish)

    def _processors(self, req: GenerationRequest, prompt_tokens: int) -> list:
        """The request's logits processors; `prompt_tokens`: how many ids of their history precede the reply."""
        processors = make_logits_processors(req.repetition_penalty) + make_presence_frequency_penalty(
            req.presence_penalty, req.frequency_penalty, prompt_tokens)
        if req.response_format is not None:
            # last: the mask decides what may come after any penalty (built on the worker: a new processor a job)
            index = token_index(self.tokenizer, self.model.spec.vocab_size)  # about 1 s, the first time only
            processors.append(JsonConstraint(req.response_format, index))
        return processors

    def _put_token(self, job: Job, token: int, logprob: float, top) -> None:
        """A token's logprob event, where asked for (the EOS that ends a reply is not part of it)."""
        if job.req.logprobs and token not in self.tokenizer.eos_token_ids:
            self._put(job, "token", token, logprob, top)

    def _new_batch(self) -> BatchGenerator:
        return BatchGenerator(self.model, max_batch=self.max_batch, prefill_step_size=self.prefill_step_size,
                              prefix_cache=self.prefix_cache, tracer=self.tracer)

    def _arrivals(self, block: bool) -> List[Job]:
        """The jobs queued since the last step (waiting for one when the batch is idle)."""
        jobs: List[Job] = [self.jobs.get()] if block else []
        with self._submitting:  # never between two choices of a request: they join in one round
            while True:
                try:
                    jobs.append(self.jobs.get_nowait())
                except queue.Empty:
                    return jobs

    def _join(self, gen: BatchGenerator, job: Job, running: Dict[int, "_Running"]) -> None:
        if job.cancelled.is_set():  # its client went away while it was queued
            self._end(job, "done", "cancelled", usage(len(job.ids), 0, 0))
            return
        req = job.req
        try:
            sampler = make_sampler(req.temperature, req.top_k, req.top_p, req.min_p, req.seed)
            uid = gen.insert(job.ids, req.max_tokens, sampler, self._processors(req, len(job.ids)),
                             self.tokenizer.eos_token_ids, req.top_logprobs if req.logprobs else 0)
        except MetalgenError as e:
            self._end(job, "error", e if isinstance(e, RequestError) else RequestError(str(e)))
            return
        except Exception as e:  # noqa: BLE001 - one request's failure must not lose the others of its round
            self._end(job, "error", RequestError(f"generation failed: {type(e).__name__}: {e}", 500, "server_error"))
            return
        running[uid] = _Running(job, self.tokenizer)

    def _finish(self, r: "_Running", finish: Optional[str]) -> None:
        # (a job cancelled before its first token reports none cached: it was never prefilled)
        self._end(r.job, "done", finish, usage(len(r.job.ids), r.generated, r.cached))

    # -- one at a time, on a reused prompt cache ---------------------------------------------------------

    def _serve(self, job: Job) -> None:
        if job.cancelled.is_set():  # its client went away while it was queued
            self._end(job, "done", "cancelled", usage(len(job.ids), 0, 0))
            return
        self._current = job
        try:
            self._generate(job)
        except MetalgenError as e:
            self._end(job, "error", e if isinstance(e, RequestError) else RequestError(str(e)))
        except Exception as e:  # noqa: BLE001 - the server survives a failed request, and says why
            self._end(job, "error", RequestError(f"generation failed: {type(e).__name__}: {e}", 500, "server_error"))
        finally:
            self._current = None

    def _generate(self, job: Job) -> None:
        req = job.req
        new = self.reused.feed(job.ids)
        cached = self.reused.held  # what the cache held of the prompt (feed may have fed more itself)
        self._prefilled += len(job.ids) - cached
        sampler = make_sampler(req.temperature, req.top_k, req.top_p, req.min_p, req.seed)
        processors = self._processors(req, len(new))  # the history of a generation on the cache starts at `new`
        out, finish = [], "length"
        try:
            for r in stream_generate(self.model, self.tokenizer, new, max_tokens=req.max_tokens, sampler=sampler,
                                     logits_processors=processors, stop_strings=req.stop,
                                     prefill_step_size=self.prefill_step_size, prompt_cache=self.reused.cache,
                                     top_logprobs=req.top_logprobs if req.logprobs else 0, tracer=self.tracer):
                out.append(r.token)
                self._put_token(job, r.token, r.logprob, r.top_logprobs)
                if r.text:
                    job.put("text", r.text)
                if r.finish_reason:
                    finish = r.finish_reason
                if job.cancelled.is_set():
                    finish = "cancelled"
                    break
        finally:
            self.reused.commit(new, out)
        self._end(job, "done", finish, usage(len(job.ids), len(out), cached))
