"""The thinking block split from the answer (metalgen.serve.reasoning), alone and through the server."""

from __future__ import annotations

import pytest

from metalgen.serve.reasoning import ReasoningSplitter, opens_in_prompt

from live_server import live_server


def split(pieces, in_reasoning=False):
    s = ReasoningSplitter(in_reasoning)
    out = [p for piece in pieces for p in s.feed(piece)] + s.finish()
    joined = {}
    for kind, text in out:
        joined[kind] = joined.get(kind, "") + text
    return joined


@pytest.mark.parametrize("pieces", [
    ["<think>\nweigh it\n</think>\n\nThe answer."],
    ["<th", "ink>\nweigh", " it\n</", "think>", "\n\nThe", " answer."],  # tags cut anywhere
    ["\n", "<think>\nweigh it\n</think>\n\nThe answer."],  # whitespace before the block
])
def test_a_block_streamed_in_any_pieces_splits_the_same(pieces):
    assert split(pieces) == {"reasoning": "\nweigh it\n", "content": "The answer."}


def test_text_without_a_leading_block_is_all_content():
    assert split(["Hi <think> not a block", "</think> still text"]) == {
        "content": "Hi <think> not a block</think> still text"}
    assert split(["<", "b>bold</b>"]) == {"content": "<b>bold</b>"}


def test_a_block_opened_by_the_prompt_and_one_never_closed():
    assert split(["weigh</think>\n\nDone"], in_reasoning=True) == {"reasoning": "weigh", "content": "Done"}
    assert split(["<think>still thinking when max_tokens hit"]) == {"reasoning": "still thinking when max_tokens hit"}
    assert opens_in_prompt("<|im_start|>assistant\n<think>\n") and not opens_in_prompt("<think>\n\n</think>\n\n")


def test_the_server_returns_reasoning_content_streamed_and_whole(monkeypatch):
    # a scripted engine (the tiny random model never thinks): its reply text through the routes
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    import metalgen
    from metalgen.serve.app import make_app
    from metalgen.serve.engine import Engine
    from metalgen.serve.protocol import usage

    class Scripted(Engine):
        def _generate(self, job):
            for piece in ["<think>\nI", " weigh", "</th", "ink>\n\nYes", "."]:
                job.put("text", piece)
            job.put("done", "stop", usage(len(job.ids), 5, 0))

    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    with live_server(make_app(Scripted(model, tok, "t", decode="plain"))) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        kw = dict(model="t", messages=[{"role": "user", "content": "Well?"}])
        msg = client.chat.completions.create(**kw).choices[0].message
        assert msg.content == "Yes." and msg.model_extra["reasoning_content"] == "\nI weigh"
        chunks = list(client.chat.completions.create(stream=True, **kw))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        assert "".join(d.content or "" for d in deltas) == "Yes."
        assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "\nI weigh"
        # chat_template_kwargs reach the template: Qwen3's enable_thinking=False closes an empty block
        on = client.chat.completions.create(max_tokens=1, **kw).usage.prompt_tokens
        off = client.chat.completions.create(max_tokens=1, extra_body={"chat_template_kwargs": {
            "enable_thinking": False}}, **kw).usage.prompt_tokens
        assert off > on
