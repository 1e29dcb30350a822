"""The OpenAI request fields the server takes, checked, and the response objects it returns."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any, Dict, List, Optional

from ..errors import MetalgenError


class RequestError(MetalgenError):
    """A request the server refuses: HTTP `status`, OpenAI error `kind`, and the offending `param`."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error",
                 param: Optional[str] = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": None}}


@dataclasses.dataclass
class GenerationRequest:
    """What one /v1/chat/completions or /v1/completions request asks for, checked."""

    kind: str  # "chat" or "text"
    model: str
    messages: Optional[List[dict]]
    prompt: Optional[str]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: Optional[float]
    seed: Optional[int]
    stop: List[str]
    stream: bool
    include_usage: bool
    template_kwargs: dict = dataclasses.field(default_factory=dict)  # e.g. {"enable_thinking": False}


def _number(body: dict, name: str, default, kind=float, lo=None, hi=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RequestError(f"'{name}' must be {'an integer' if kind is int else 'a number'}", param=name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise RequestError(f"'{name}' must be {bound}, got {value}", param=name)
    return kind(value)


# fields the server does not honour yet: refused when set to anything but their neutral value, so that a
# client never gets output that silently ignores what it asked for
_NOT_YET = {"n": 1, "logprobs": False, "top_logprobs": None, "presence_penalty": 0, "frequency_penalty": 0,
            "tools": None, "tool_choice": None, "response_format": None, "logit_bias": None}


def parse_request(body: Any, kind: str, default_max_tokens: int) -> GenerationRequest:
    """Check a request body (parsed JSON) of a chat ("chat") or text ("text") completion."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' is required", param="model")
    for name, neutral in _NOT_YET.items():
        value = body.get(name)
        if value is not None and value != neutral and not (name == "response_format" and value == {"type": "text"}):
            raise RequestError(f"'{name}' is not supported by this server yet", param=name)
    messages = prompt = None
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list", param="messages")
        checked = []
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
                raise RequestError("each message needs a 'role' of system, user, assistant or tool", param="messages")
            content = m.get("content")
            if isinstance(content, list):  # content parts: the text ones, joined
                if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                    raise RequestError("only text content parts are supported", param="messages")
                content = "".join(str(p.get("text", "")) for p in content)
            elif not isinstance(content, str):
                raise RequestError("a message's 'content' must be a string or a list of text parts", param="messages")
            # "developer" is the newer name of the system role
            checked.append({"role": "system" if m["role"] == "developer" else m["role"], "content": content})
        messages = checked
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError("'prompt' must be a non-empty string", param="prompt")
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, limit, default_max_tokens, int, 1)
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise RequestError("'stop' must be a string or a list of at most 4 strings", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("'stream' must be a boolean", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise RequestError("'stream_options' must be an object", param="stream_options")
    penalty = body.get("repetition_penalty")
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise RequestError("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    return GenerationRequest(
        kind=kind, model=model, messages=messages, prompt=prompt, max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, float, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, float, 0.0, 1.0) or 1.0,
        top_k=_number(body, "top_k", 0, int, 0),
        min_p=_number(body, "min_p", 0.0, float, 0.0, 0.999),
        repetition_penalty=None if penalty is None else _number(body, "repetition_penalty", 1.0, float, 0.01, 10.0),
        seed=None if body.get("seed") is None else _number(body, "seed", 0, int),
        stop=stop, stream=stream, include_usage=bool(options.get("include_usage", False)),
        template_kwargs=template_kwargs,
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion(req: GenerationRequest, rid: str, text: str, finish: str, use: Dict[str, Any],
               reasoning: Optional[str] = None) -> Dict[str, Any]:
    """The whole answer of a request that did not stream (`reasoning`: a chat's thinking block)."""
    created = int(time.time())
    if req.kind == "chat":
        message = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        return {"id": rid, "object": "chat.completion", "created": created, "model": req.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": use}
    return {"id": rid, "object": "text_completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}], "usage": use}


def chunk(req: GenerationRequest, rid: str, text: Optional[str], finish: Optional[str], first: bool = False,
          use: Optional[Dict[str, Any]] = None, field: str = "content") -> Dict[str, Any]:
    """One server-sent event's object of a streamed answer (`use` alone: the final usage chunk; `field`:
    a chat delta's "content" or "reasoning_content")."""
    created = int(time.time())
    if req.kind == "chat":
        obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model}
        if use is not None:
            obj.update(choices=[], usage=use)
            return obj
        delta = {field: text} if text else {}
        if first:
            delta = {"role": "assistant", "content": ""} | delta
        obj["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        return obj
    obj = {"id": rid, "object": "text_completion", "created": created, "model": req.model}
    if use is not None:
        obj.update(choices=[], usage=use)
        return obj
    obj["choices"] = [{"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}]
    return obj
