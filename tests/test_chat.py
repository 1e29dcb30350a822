"""Multi-turn chat on one prompt cache (metalgen.chat) and `metalgen chat`."""

from __future__ import annotations

import io

import mlx.core as mx
import pytest

import metalgen
from metalgen.cache import cache_length, common_prefix, make_prompt_cache, trim_prompt_cache
from metalgen.chat import ChatSession
from metalgen.errors import MetalgenError
from metalgen.generate import generate_step


@pytest.fixture(scope="module")
def tiny():
    return metalgen.load("dummy:tiny-qwen3", dtype="float32")


def fresh_reply(model, tokenizer, messages, n):
    """Greedy tokens for the whole conversation rendered anew, on a fresh cache."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return [t for t, _ in generate_step(mx.array(ids, mx.int32), model, max_tokens=n, decode="plain")]


@pytest.mark.parametrize("decode", ["reference", "plain"])
def test_turns_feed_only_what_the_cache_lacks_and_answer_as_a_fresh_rendering(tiny, decode):
    model, tok = tiny
    chat = ChatSession(model, tok, system="Be brief.", decode=decode)
    prev = []
    for i, text in enumerate(["Hello there", "What did I just say?", "Once more"]):
        before = chat.messages + [{"role": "user", "content": text}]
        full = tok.apply_chat_template(before, add_generation_prompt=True, tokenize=True)
        replies = list(chat.send(text, max_tokens=6))
        got = [r.token for r in replies]
        assert got == fresh_reply(model, tok, before, len(got))
        # fed: what follows the longest prefix shared with the cache, the earlier rendering but perhaps its
        # last id (BPE may merge the generation prompt's "\n" with a reply's leading newlines), and the
        # reply itself where the rendering spells it otherwise than it was generated
        assert replies[-1].prompt_tokens <= len(full) - len(prev) + 1
        if i:
            assert replies[-1].prompt_tokens < len(full)
        prev = full
        assert chat.messages[-1]["role"] == "assistant" and cache_length(chat.cache) == len(chat.fed)
        assert chat.fed == (full + got)[:len(chat.fed)]


def test_a_hybrid_chat_starts_its_cache_again_where_it_cannot_trim():
    # Gated DeltaNet states cannot go back: a rendering that differs from what was fed is fed whole
    model, tok = metalgen.load("dummy:tiny-qwen3.5", dtype="float32")
    chat = ChatSession(model, tok)
    list(chat.send("Hello", max_tokens=4))
    before = chat.messages + [{"role": "user", "content": "Again"}]
    got = [r.token for r in chat.send("Again", max_tokens=4)]
    assert got == fresh_reply(model, tok, before, len(got))


def test_a_hybrid_cache_resumes_from_its_checkpoint():
    # with checkpoints (the server's), feed prefills a hybrid prompt but its last id and keeps a copy there:
    # the same prompt again (a request's next choice) and a longer one that starts with it (a chat's next
    # turn) resume from it, and generate what a fresh cache does
    from metalgen.chat import ReusedCache

    model, tok = metalgen.load("dummy:tiny-qwen3.5", dtype="float32")
    reused = ReusedCache(model, "plain", prefill_step_size=8, checkpoints=True)
    ids = tok.encode("A prompt long enough to take a few prefill chunks of eight ids")

    def run(prompt):
        new = reused.feed(prompt)
        out = [r.token for r in metalgen.stream_generate(model, tok, new, max_tokens=5, prompt_cache=reused.cache)]
        reused.commit(new, out)
        return new, out

    fresh = lambda prompt: [t for t, _ in generate_step(mx.array(prompt, mx.int32), model, max_tokens=5,  # noqa: E731
                                                        decode="plain")]
    new, first = run(ids)
    assert new == ids[-1:] and reused.held == 0 and reused.prefilled == len(ids) - 1
    assert reused.checkpoint[0] == ids[:-1] and first == fresh(ids)
    new, again = run(ids)  # the cache moved on past the prompt and cannot go back: the checkpoint
    assert new == ids[-1:] and reused.held == len(ids) - 1 and reused.prefilled == len(ids) - 1
    assert again == first
    branch = ids[:-1] + tok.encode(" then something different, at some length")
    new, turn = run(branch)  # shares the checkpoint's ids, then differs from what the cache holds
    assert reused.held == len(ids) - 1 and new == branch[-1:]
    assert reused.prefilled == (len(ids) - 1) + (len(branch) - len(ids)) and turn == fresh(branch)
    longer = branch + turn + tok.encode(" and a next turn")
    new, nxt = run(longer)  # goes on from what the cache holds: no trim needed
    assert reused.held == len(branch) + len(turn) - 1 and nxt == fresh(longer)
    other = tok.encode("Something else entirely")
    new, _ = run(other)  # shares nothing with the checkpoint: a fresh cache
    assert reused.held == 0 and reused.checkpoint[0] == other[:-1]
    # without checkpoints (metalgen chat's), a hybrid cache starts again and feeds the prompt whole
    plain = ReusedCache(model, "plain")
    assert plain.feed(ids) == ids and plain.checkpoint is None


def test_trim_prompt_cache():
    model = metalgen.load("dummy:tiny-qwen3", dtype="float32")[0]
    for decode in ("plain", "reference"):
        cache = make_prompt_cache(model, decode=decode)
        model.hidden(mx.array([[1, 2, 3, 4, 5]], mx.int32), cache=cache)
        assert trim_prompt_cache(cache, 2) == 2 and cache_length(cache) == 3
        assert trim_prompt_cache(cache, 10) == 3 and cache_length(cache) == 0
    hybrid = metalgen.load("dummy:tiny-qwen3.5")[0]
    cache = make_prompt_cache(hybrid, decode="plain")
    hybrid.hidden(mx.array([[1, 2, 3]], mx.int32), cache=cache)
    assert trim_prompt_cache(cache, 1) == 0


def test_common_prefix_and_empty_message(tiny):
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    with pytest.raises(MetalgenError, match="empty"):
        list(ChatSession(*tiny).send("  "))


def test_chat_command_reads_turns_until_exit(monkeypatch, capsys):
    from metalgen.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n\n/reset\nAgain\n/exit\nnever read\n"))
    assert main(["chat", "--model", "dummy:tiny-qwen3", "--max-tokens", "3", "--verbose"]) == 0
    err = capsys.readouterr().err
    assert err.count("new prompt tokens") == 2  # two turns; the empty line and /reset are not turns


@pytest.fixture(scope="module")
def short_context():
    """dummy:tiny-qwen3 with its context cut from 2048 to 256 positions, so that a conversation reaches it
    in a few hundred decode steps (the context is the spec's max_position_embeddings)."""
    import dataclasses

    model, tok = metalgen.load("dummy:tiny-qwen3", dtype="float32")
    model.model.spec = dataclasses.replace(model.spec, max_position_embeddings=256)
    return model, tok


@pytest.mark.parametrize("decode", ["reference", "plain"])
def test_a_conversation_past_the_context_is_a_clear_error(short_context, decode):
    model, tok = short_context
    chat = ChatSession(model, tok, decode=decode)
    replies = list(chat.send("word " * 120, max_tokens=400))
    assert replies[-1].finish_reason == "length" and 200 < cache_length(chat.cache) <= 256  # cut at the context
    with pytest.raises(MetalgenError, match=r"after \d+ in the prompt cache, past the model's context of 256"):
        list(chat.send("word " * 120))


def test_a_reply_stopped_early_leaves_the_conversation_consistent(tiny):
    # the reader stops after two tokens: what the cache holds is recorded, and the next turn answers as a
    # fresh rendering of the conversation (the partial reply in it) would
    model, tok = tiny
    chat = ChatSession(model, tok, decode="reference")
    it = chat.send("Hello there", max_tokens=20)
    next(it), next(it)
    it.close()
    assert cache_length(chat.cache) == len(chat.fed) and chat.messages[-1]["role"] == "assistant"
    before = chat.messages + [{"role": "user", "content": "Go on"}]
    got = [r.token for r in chat.send("Go on", max_tokens=5)]
    assert got == fresh_reply(model, tok, before, len(got))
