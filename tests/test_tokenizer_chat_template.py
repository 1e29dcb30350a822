"""Chat templates render exactly as transformers' apply_chat_template does."""

from __future__ import annotations

import json
import os
import shutil

import jinja2
import pytest

from tokenizer import Tokenizer
from tokenizer.chat_template import CHATML_TEMPLATE

from conftest import ASSET_TOKENIZER

ASSETS = str(ASSET_TOKENIZER)


@pytest.fixture(scope="module")
def ref():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(ASSETS)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle d'une ville — returns °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "e.g. 東京 or <Paris>"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "Current time", "parameters": {"type": "object", "properties": {}}}},
]

CONVERSATIONS = {
    "user-only": [{"role": "user", "content": "Hi there!"}],
    "system-user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi-turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a color."},
        {"role": "assistant", "content": "<think>\nThe user wants a color.\n</think>\n\nBlue."},
        {"role": "user", "content": "Another one, in 日本語?"},
        {"role": "assistant", "content": "赤 (red)."},
        {"role": "user", "content": "Thanks 👍"},
    ],
    "reasoning-content": [
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "Because.", "reasoning_content": "Think it through."},
        {"role": "user", "content": "Ok."},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "Last turn reasoning."},
    ],
    "tool-calls": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Tokyo and the time?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "東京", "days": 2}}},
                {"type": "function", "function": {"name": "now", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": '{"temp": 21, "unit": "°C"}'},
        {"role": "tool", "content": "12:00"},
        {"role": "assistant", "content": "It is 21°C at 12:00."},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}]},
        {"role": "tool", "content": "22"},
    ],
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("enable_thinking", [None, True, False])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_matches_transformers(ours, ref, name, enable_thinking, add_generation_prompt):
    messages = CONVERSATIONS[name]
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    tools = TOOLS if name == "tool-calls" else None
    expected = ref.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)
    got = ours.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs)
    assert got == expected


def test_tools_without_tool_calls(ours, ref):
    messages = CONVERSATIONS["system-user"]
    expected = ref.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(messages, tools=TOOLS) == expected
    assert '"description": "e.g. 東京 or <Paris>"' in expected  # tojson: no ASCII or HTML escaping


def test_enable_thinking_false_adds_empty_think(ours):
    text = ours.apply_chat_template([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_tokenize_returns_ids(ours, ref):
    messages = CONVERSATIONS["multi-turn"]
    ids = ours.apply_chat_template(messages, tokenize=True)
    text = ours.apply_chat_template(messages)
    assert ids == ours.encode(text, add_special_tokens=False)
    assert ids[:1] == [ours.token_to_id("<|im_start|>")]
    assert ids == ref.encode(text, add_special_tokens=False)


def test_messages_are_not_modified(ours):
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "thinking": "t"}]
    snapshot = json.loads(json.dumps(messages))
    ours.apply_chat_template(messages)
    assert messages == snapshot


def test_chatml_fallback(tmp_path):
    shutil.copy(os.path.join(ASSETS, "tokenizer.json"), tmp_path / "tokenizer.json")
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.chat_template is None
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
    )
    assert tok.apply_chat_template(messages[:2]).endswith("<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")


def test_chatml_fallback_matches_transformers_rendering(ref):
    messages = [{"role": "user", "content": "héllo"}]
    from tokenizer.chat_template import render_chat

    expected = ref.apply_chat_template(messages, chat_template=CHATML_TEMPLATE, tokenize=False, add_generation_prompt=True)
    assert render_chat(CHATML_TEMPLATE, messages, add_generation_prompt=True) == expected


def test_template_sources(tmp_path, ours):
    shutil.copy(os.path.join(ASSETS, "tokenizer.json"), tmp_path / "tokenizer.json")
    named = [{"name": "default", "template": "D{{ messages|length }}"}, {"name": "tool_use", "template": "T{{ tools|length }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named, "eos_token": "<|im_end|>"}), encoding="utf-8")
    tok = Tokenizer.from_pretrained(tmp_path)
    msgs = [{"role": "user", "content": "x"}]
    assert tok.apply_chat_template(msgs) == "D1"
    assert tok.apply_chat_template(msgs, tools=TOOLS) == "T2"
    assert tok.apply_chat_template(msgs, chat_template="tool_use", tools=[TOOLS[0]]) == "T1"
    assert tok.apply_chat_template(msgs, chat_template="{{ eos_token }}|{{ bos_token is defined }}") == "<|im_end|>|False"
    # A chat_template.jinja file wins over the config's entry.
    (tmp_path / "chat_template.jinja").write_text("J{{ messages[0].content }}", encoding="utf-8")
    assert Tokenizer.from_pretrained(tmp_path).apply_chat_template(msgs) == "Jx"


def test_template_helpers(ours):
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(jinja2.exceptions.TemplateError, match="no system role"):
        ours.apply_chat_template(msgs, chat_template="{{ raise_exception('no system role') }}")
    year = ours.apply_chat_template(msgs, chat_template="{{ strftime_now('%Y') }}")
    assert year.isdigit() and len(year) == 4
    text = ours.apply_chat_template(
        msgs, chat_template="{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{% endfor %}{{ {'a': 'é'}|tojson(indent=2) }}"
    )
    assert text == '{\n  "a": "é"\n}'
    # trim_blocks / lstrip_blocks: block tags leave no newline or indentation behind.
    assert ours.apply_chat_template(msgs, chat_template="  {% if true %}\nA\n  {% endif %}\nB") == "A\nB"


def test_sandbox_blocks_unsafe_access(ours):
    with pytest.raises(jinja2.exceptions.SecurityError):
        ours.apply_chat_template([{"role": "user", "content": "x"}], chat_template="{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}")


def test_special_tokens_are_template_variables(ours):
    out = ours.apply_chat_template([], chat_template="{{ eos_token }} {{ pad_token }}", add_generation_prompt=False)
    assert out == "<|im_end|> <|endoftext|>"


def test_none_valued_keys_are_dropped(ours, ref):
    # API clients send tool_calls=None; transformers drops None keys before rendering.
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "tool_calls": None}]
    expected = ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert ours.apply_chat_template(messages, add_generation_prompt=False) == expected
