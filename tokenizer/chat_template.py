"""Chat templates: render a conversation with its model's Jinja template.

Rendering has to match transformers' ``apply_chat_template`` character for character,
since the model was trained on that exact text. So the environment is set up the
same way: a sandbox (templates come from model repositories and are untrusted code),
``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, a ``tojson`` that
does not HTML-escape and keeps non-ASCII, ``raise_exception`` and ``strftime_now``.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Mapping

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# What a model folder without a template gets: ChatML, the format Qwen models speak.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Older names a message's reasoning may come under; templates (Qwen3's) read the first.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes '<', '>', '&' and "'", which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Namespace(jinja2.utils.Namespace):
    """``namespace()`` that refuses underscore attributes, so a template can't reach internals."""

    def __init__(*args, **kwargs):
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attribute {name!r} on a namespace")


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile a chat template once (templates are reused for every request)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env.from_string(source)


def _plain(value: Any) -> Any:
    # A fresh copy made of JSON-like types only: the template can't mutate the caller's
    # messages, and can't reach methods of arbitrary objects.
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _prepare_message(message: Mapping) -> dict:
    if not isinstance(message, Mapping):
        raise TypeError(f"chat messages must be dicts, got {type(message).__name__}: {message!r}")
    # Keys set to None are dropped: API clients send content=None / tool_calls=None, and
    # templates test for a key's presence, not for None.
    msg = {k: _plain(v) for k, v in message.items() if v is not None}
    reasoning = next((msg[k] for k in _REASONING_KEYS if k in msg), None)
    if reasoning is not None:
        msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
    return msg


def select_template(templates: str | dict[str, str] | None, name: str | None, has_tools: bool) -> str:
    """Pick the template source: a named one, the tool-use one when tools are given, or the default.

    ``name`` may also be a template source itself (anything that is not a known name).
    """
    if name is not None:
        if isinstance(templates, dict) and name in templates:
            return templates[name]
        return name
    if templates is None:
        return CHATML_TEMPLATE
    if isinstance(templates, str):
        return templates
    if has_tools and "tool_use" in templates:
        return templates["tool_use"]
    if "default" in templates:
        return templates["default"]
    raise ValueError(f"no default chat template among the named templates {sorted(templates)}; pass chat_template=NAME")


def render_chat(
    source: str,
    messages: list[Mapping],
    *,
    tools: list[Mapping] | None = None,
    documents: list[Mapping] | None = None,
    add_generation_prompt: bool = True,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render ``messages`` with the template ``source`` the way transformers does.

    ``variables`` are extra template variables (the tokenizer's special tokens such as
    ``eos_token``, and caller options such as ``enable_thinking``).
    """
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, Mapping):
                raise TypeError(f"tools must be JSON-schema dicts, got {type(tool).__name__}")
    if documents is not None:
        for doc in documents:
            if not isinstance(doc, Mapping):
                raise TypeError(f"documents must be dicts, got {type(doc).__name__}")
    template = compile_template(source)
    return template.render(
        messages=[_prepare_message(m) for m in messages],
        tools=_plain(tools),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **_plain(dict(variables or {})),
    )
