"""The server's generation engine: requests run one at a time on a worker thread, on one prompt cache that
each request trims to the prefix it shares with the one before (a chat's earlier turns, a shared system
prompt), so only the rest is prefilled. Continuous batching is issue 17's next step (docs/serve.md)."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import List, Tuple

import mlx.core as mx

from ..chat import ReusedCache
from ..errors import MetalgenError
from ..generate import stream_generate
from ..sampling import make_logits_processors, make_sampler
from .protocol import GenerationRequest, RequestError, usage
from .reasoning import opens_in_prompt


class Job:
    """One request in flight: its ids, and the events its handler reads: ("text", str), then ("done",
    finish_reason, usage) or ("error", RequestError)."""

    def __init__(self, req: GenerationRequest, ids: List[int], loop: asyncio.AbstractEventLoop,
                 in_reasoning: bool = False):
        self.req, self.ids, self.loop = req, ids, loop
        self.in_reasoning = in_reasoning  # the prompt opened a thinking block
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()  # the client went away: stop at the next token

    def put(self, *event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Engine:
    """Serves `model` as `name`; `submit` queues a request, the worker thread generates it."""

    def __init__(self, model, tokenizer, name: str, decode=None, prefill_step_size: int = 512):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.context = model.spec.max_position_embeddings
        self.prefill_step_size = prefill_step_size
        self.decode = decode
        # MLX binds an unevaluated array to the stream (of the thread) that made it, and the worker has a
        # stream of its own: the weights are evaluated here, and the cache is made by the worker
        mx.eval(model.parameters())
        self.stream = mx.new_thread_local_stream(mx.default_device())
        self.reused = None
        self.jobs: "queue.Queue[Job]" = queue.Queue()
        self.worker = threading.Thread(target=self._work, name="metalgen-engine", daemon=True)
        self.worker.start()

    def encode(self, req: GenerationRequest) -> Tuple[List[int], bool]:
        """The prompt's ids (chat messages through the template), checked against the context, and whether
        the rendered prompt opens a thinking block."""
        opened = False
        if req.kind == "chat":
            try:
                kw = dict(req.template_kwargs, add_generation_prompt=True)
                text = self.tokenizer.apply_chat_template(req.messages, tokenize=False, **kw)
            except Exception as e:  # noqa: BLE001 - a template that rejects the conversation is the client's
                raise RequestError(f"the chat template cannot render these messages: {str(e).splitlines()[0]}",
                                   param="messages")
            ids = self.tokenizer.encode(text, add_special_tokens=False)  # as tokenize=True encodes it
            opened = opens_in_prompt(text)
        else:
            ids = self.tokenizer.encode(req.prompt)
        if len(ids) >= self.context:
            raise RequestError(f"the prompt has {len(ids)} tokens, past the model's context of {self.context}",
                               param="messages" if req.kind == "chat" else "prompt")
        return ids, opened

    def submit(self, req: GenerationRequest, ids: List[int], in_reasoning: bool = False) -> Job:
        job = Job(req, ids, asyncio.get_running_loop(), in_reasoning)
        self.jobs.put(job)
        return job

    def _work(self) -> None:
        with mx.stream(self.stream):
            self.reused = ReusedCache(self.model, self.decode)
            while True:
                self._serve(self.jobs.get())

    def _serve(self, job: Job) -> None:
        if job.cancelled.is_set():
            return
        try:
            self._generate(job)
        except MetalgenError as e:
            job.put("error", e if isinstance(e, RequestError) else RequestError(str(e)))
        except Exception as e:  # noqa: BLE001 - the server survives a failed request, and says why
            job.put("error", RequestError(f"generation failed: {type(e).__name__}: {e}", 500, "server_error"))

    def _generate(self, job: Job) -> None:
        req = job.req
        new = self.reused.feed(job.ids)
        cached = len(job.ids) - len(new)
        sampler = make_sampler(req.temperature, req.top_k, req.top_p, req.min_p, req.seed)
        processors = make_logits_processors(req.repetition_penalty)
        out, finish = [], "length"
        try:
            for r in stream_generate(self.model, self.tokenizer, new, max_tokens=req.max_tokens, sampler=sampler,
                                     logits_processors=processors, stop_strings=req.stop,
                                     prefill_step_size=self.prefill_step_size, prompt_cache=self.reused.cache):
                out.append(r.token)
                if r.text:
                    job.put("text", r.text)
                if r.finish_reason:
                    finish = r.finish_reason
                if job.cancelled.is_set():
                    finish = "cancelled"
                    break
        finally:
            self.reused.commit(new, out)
        job.put("done", finish, usage(len(job.ids), len(out), cached))
