"""The OpenAI request fields the server takes, checked, and the response objects it returns."""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from ..errors import MetalgenError
from ..structured import Grammar, SchemaError, grammar
from .tools import forced_prefix


class RequestError(MetalgenError):
    """A request the server refuses: HTTP `status`, OpenAI error `kind`, the offending `param`, OpenAI's
    machine-readable `code` where it has one (e.g. "invalid_api_key"), and headers of the response's own."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.status, self.kind, self.param, self.code = status, kind, param, code
        self.headers = headers  # the response's own (e.g. a 429's Retry-After)

    def body(self) -> Dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


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
    n: int = 1  # independent choices; choice i samples with seed + i
    logprobs: bool = False  # each token's logprob in the answer
    top_logprobs: int = 0  # and its this many most likely alternatives
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    tools: Optional[List[dict]] = None  # rendered into the prompt and parsed out of the reply; None: neither
    tool_prefix: str = ""  # the start of a call the reply must make ("required" or a named tool_choice)
    # the field the client set max_tokens with (None: the server's default, which the context may clamp; a
    # limit the client set must fit in the context with the prompt, as OpenAI's does, or it is a 400)
    limit_param: Optional[str] = None
    # response_format json_object / json_schema: the automaton the reply must follow (None: free text)
    response_format: Optional[Grammar] = None


def _number(body: dict, name: str, default, kind=float, lo=None, hi=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RequestError(f"'{name}' must be {'an integer' if kind is int else 'a number'}", param=name)
    if isinstance(value, float) and not math.isfinite(value):  # Python's json reads NaN and Infinity
        raise RequestError(f"'{name}' must be a finite number, got {value}", param=name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise RequestError(f"'{name}' must be {bound}, got {value}", param=name)
    return kind(value)


# fields the server does not honour yet: refused when set to anything but their neutral value, so that a
# client never gets output that silently ignores what it asked for
_NOT_YET = {"logit_bias": None}
MAX_N = 8  # choices of one request
MAX_TOP_LOGPROBS = 20  # OpenAI's bound


def _tools(body: dict) -> Tuple[Optional[List[dict]], str]:
    """The tools to render (None for none) and the forced start of the reply, from `tools` and
    `tool_choice` ("auto", "none", "required", or {"type": "function", "function": {"name": ...}})."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is not None:
        if not isinstance(tools, list):
            raise RequestError("'tools' must be a list of function tools", param="tools")
        for tool in tools:
            fn = tool.get("function") if isinstance(tool, dict) and tool.get("type", "function") == "function" else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise RequestError("each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                                   param="tools")
            if not isinstance(fn.get("parameters", {}), dict):
                raise RequestError(f"the parameters of tool '{fn['name']}' must be a JSON schema object",
                                   param="tools")
    names = [t["function"]["name"] for t in tools or []]
    if choice is None or choice == "auto":
        return (tools or None), ""
    if choice == "none":
        return None, ""  # no tools in the prompt: the model answers in text
    if not names:
        raise RequestError("'tool_choice' other than none or auto needs 'tools'", param="tool_choice")
    if choice == "required":
        return tools, forced_prefix()
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError("'tool_choice' must be none, auto, required or {\"type\": \"function\", "
                           "\"function\": {\"name\": ...}}", param="tool_choice")
    if fn["name"] not in names:
        raise RequestError(f"'tool_choice' names the function '{fn['name']}', which is not among the tools",
                           param="tool_choice")
    return tools, forced_prefix(fn["name"])


def _response_format(fmt: Any) -> Optional[Grammar]:
    """The automaton of `response_format`: None for text, any JSON object for {"type": "json_object"}, the
    schema's for {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
    (metalgen.structured: the supported subset; anything past it is refused, not ignored)."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return grammar(None)
    if kind != "json_schema":
        raise RequestError("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                           "{\"type\": \"json_schema\", \"json_schema\": {...}}", param="response_format")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise RequestError("'response_format' json_schema needs a 'json_schema' object with a 'name'",
                           param="response_format")
    try:
        return grammar(spec.get("schema", {}))  # no schema: any JSON value
    except SchemaError as e:
        raise RequestError(f"'response_format' schema: {e}", param="response_format") from None


def _message(m: Any) -> dict:
    """A chat message checked, as the template takes it: text content, and an assistant's earlier tool
    calls and a tool result's call id passed through."""
    if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool", "developer"):
        raise RequestError("each message needs a 'role' of system, user, assistant or tool", param="messages")
    content = m.get("content")
    calls = m.get("tool_calls") if m["role"] == "assistant" else None
    if isinstance(content, list):  # content parts: the text ones, joined
        if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
            raise RequestError("only text content parts are supported", param="messages")
        if any(not isinstance(p.get("text"), str) for p in content):
            raise RequestError("a text content part's 'text' must be a string", param="messages")
        content = "".join(p["text"] for p in content)
    elif content is None and calls:
        content = ""  # an assistant turn that only called tools (the template concatenates content)
    elif not isinstance(content, str):
        raise RequestError("a message's 'content' must be a string or a list of text parts", param="messages")
    # "developer" is the newer name of the system role
    out = {"role": "system" if m["role"] == "developer" else m["role"], "content": content}
    if calls:
        if not isinstance(calls, list) or any(
                not isinstance(c, dict) or not isinstance(c.get("function"), dict)
                or not isinstance(c["function"].get("name"), str) for c in calls):
            raise RequestError("an assistant message's 'tool_calls' must be a list of function calls",
                               param="messages")
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def parse_request(body: Any, kind: str, default_max_tokens: int) -> GenerationRequest:
    """Check a request body (parsed JSON) of a chat ("chat") or text ("text") completion."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("'model' is required", param="model")
    for name, neutral in _NOT_YET.items():
        value = body.get(name)
        if value is not None and value != neutral:
            raise RequestError(f"'{name}' is not supported by this server yet", param=name)
    messages = prompt = None
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("'messages' must be a non-empty list", param="messages")
        messages = [_message(m) for m in messages]
        tools, tool_prefix = _tools(body)
        logprobs = body.get("logprobs")
        if logprobs is not None and not isinstance(logprobs, bool):
            raise RequestError("'logprobs' must be a boolean", param="logprobs")
        top_logprobs = _number(body, "top_logprobs", 0, int, 0, MAX_TOP_LOGPROBS)
        if top_logprobs and not logprobs:
            raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    else:
        for name in ("tools", "tool_choice"):
            if body.get(name) is not None:
                raise RequestError(f"'{name}' is for chat completions", param=name)
        tools, tool_prefix = None, ""
        # a text completion's logprobs is the number of alternatives (0: the chosen tokens' alone)
        top_logprobs = _number(body, "logprobs", None, int, 0, MAX_TOP_LOGPROBS)
        logprobs, top_logprobs = top_logprobs is not None, top_logprobs or 0
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
        n=_number(body, "n", 1, int, 1, MAX_N), logprobs=bool(logprobs), top_logprobs=top_logprobs,
        presence_penalty=_number(body, "presence_penalty", 0.0, float, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, float, -2.0, 2.0),
        tools=tools, tool_prefix=tool_prefix, limit_param=limit if body.get(limit) is not None else None,
        response_format=_response_format(body.get("response_format")),
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def choice(req: GenerationRequest, index: int, text: Optional[str], finish: str, reasoning: Optional[str] = None,
           tool_calls: Optional[List[dict]] = None, logprobs: Optional[dict] = None) -> Dict[str, Any]:
    """One choice of an answer that did not stream (`reasoning`: a chat's thinking block; `tool_calls`:
    the calls parsed out of the reply, as message entries)."""
    if req.kind == "chat":
        message = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {"index": index, "message": message, "finish_reason": finish, "logprobs": logprobs}
    return {"index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs}


def completion(req: GenerationRequest, rid: str, choices: List[Dict[str, Any]], use: Dict[str, Any]) -> Dict[str, Any]:
    """The whole answer of a request that did not stream: its `choice`s and usage."""
    obj = "chat.completion" if req.kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": req.model, "choices": choices,
            "usage": use}


def chunk(req: GenerationRequest, rid: str, delta: Optional[Dict[str, Any]], finish: Optional[str], index: int = 0,
          first: bool = False, use: Optional[Dict[str, Any]] = None, logprobs: Optional[dict] = None) -> Dict[str, Any]:
    """One server-sent event's object of a streamed answer: choice `index`'s `delta` (a chat's
    {"content" | "reasoning_content" | "tool_calls": ...}, a text completion's {"text": ...}; `first`: a
    chat choice's first, which names the role), or with `use` alone the final usage chunk."""
    created = int(time.time())
    obj = {"id": rid, "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
           "created": created, "model": req.model}
    if use is not None:
        obj.update(choices=[], usage=use)
        return obj
    delta = dict(delta or {})
    if req.kind == "chat":
        if first:
            delta = {"role": "assistant", "content": ""} | delta
        obj["choices"] = [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]
        return obj
    obj["choices"] = [{"index": index, "text": delta.get("text", ""), "finish_reason": finish, "logprobs": logprobs}]
    return obj
