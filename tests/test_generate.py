"""Generation: the pipelined token generator, stop criteria, streaming text, statistics."""

from __future__ import annotations

import io
import json

import pytest

import mlx.core as mx

import metalgen
from metalgen import MetalgenError
from metalgen.generate import generate_step, stream_generate
from profiling import Tracer


@pytest.fixture(scope="module")
def tiny():
    return metalgen.load("dummy:tiny-qwen3", dtype="float32")


def scripted(ids):
    """A sampler that emits `ids` in order, whatever the logits say."""
    it = iter(ids)

    def sampler(logits):
        return mx.array([next(it)], mx.int32), mx.array([-1.0])

    return sampler


def collect(model, tok, script, **kw):
    kw.setdefault("max_tokens", len(script))
    return list(stream_generate(model, tok, [1, 2, 3], sampler=scripted(script), **kw))


def test_multibyte_characters_split_across_tokens_stream_cleanly(tiny):
    model, tok = tiny
    text = "héllo 🦀 世界 𝔘 👩🏽‍💻 done"
    ids = tok.encode(text)
    # The byte-level vocabulary splits some of these characters over several tokens.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    responses = collect(model, tok, ids, eos_token_ids=[])
    assert all("\ufffd" not in r.text for r in responses)
    assert "".join(r.text for r in responses) == text
    assert responses[-1].finish_reason == "length"
    assert [r.token for r in responses] == ids


def test_padding_ids_past_the_tokenizer_have_no_text(tiny):
    model, tok = tiny
    ids = tok.encode("ab") + [tok.vocab_size + 5] + tok.encode("cd")
    responses = collect(model, tok, ids, eos_token_ids=[])
    assert "".join(r.text for r in responses) == "abcd" and len(responses) == len(ids)


def test_stop_string_cuts_text_and_is_never_emitted(tiny):
    model, tok = tiny
    ids = tok.encode("Hello world. STOP and more text")
    responses = collect(model, tok, ids, stop_strings=["STOP"], eos_token_ids=[])
    assert "".join(r.text for r in responses) == "Hello world. "
    assert responses[-1].finish_reason == "stop"
    assert all("ST" not in r.text for r in responses)


def test_held_back_prefix_is_released_when_no_stop_follows(tiny):
    model, tok = tiny
    text = "a STAR is not a STOP? no: STAR"
    ids = tok.encode(text)
    responses = collect(model, tok, ids, stop_strings=["STOP!"], eos_token_ids=[])
    assert "".join(r.text for r in responses) == text


def test_eos_stops_and_is_not_printed(tiny):
    model, tok = tiny
    eos = tok.token_to_id("<|im_end|>")
    ids = tok.encode("short") + [eos] + tok.encode(" never")
    responses = collect(model, tok, ids, eos_token_ids=[eos])
    assert "".join(r.text for r in responses) == "short"
    assert responses[-1].finish_reason == "stop" and responses[-1].token == eos


def test_max_tokens_and_statistics(tiny):
    model, tok = tiny
    responses = list(stream_generate(model, tok, [1, 2, 3], max_tokens=5, eos_token_ids=[]))
    last = responses[-1]
    assert len(responses) == 5 and last.generation_tokens == 5
    assert last.finish_reason == "length" and last.prompt_tokens == 3
    assert last.prompt_tps > 0 and last.generation_tps > 0 and last.peak_memory > 0


def test_context_limit(tiny):
    model, tok = tiny
    ctx = model.spec.max_position_embeddings
    with pytest.raises(MetalgenError, match="past the model's context"):
        list(stream_generate(model, tok, [5] * ctx, max_tokens=1))
    responses = list(stream_generate(model, tok, [5] * (ctx - 4), max_tokens=100, eos_token_ids=[]))
    assert len(responses) == 4 and responses[-1].finish_reason == "length"


def test_bad_prompts(tiny):
    model, tok = tiny
    with pytest.raises(MetalgenError, match="empty"):
        list(stream_generate(model, tok, [], max_tokens=1))
    with pytest.raises(MetalgenError, match="outside the model's vocabulary"):
        list(stream_generate(model, tok, [10**7], max_tokens=1))
    with pytest.raises(MetalgenError, match="empty"):
        metalgen.generate(model, tok, "")


def test_seeded_sampling_reproducible(tiny):
    model, tok = tiny
    a = metalgen.generate(model, tok, "hi", max_tokens=16, temperature=1.0, seed=11)
    b = metalgen.generate(model, tok, "hi", max_tokens=16, temperature=1.0, seed=11)
    c = metalgen.generate(model, tok, "hi", max_tokens=16, temperature=1.0, seed=12)
    assert a == b and a != c


def test_chat_messages_use_the_template(tiny):
    model, tok = tiny
    messages = [{"role": "user", "content": "Hi"}]
    ids = metalgen.api.encode_prompt(tok, messages)
    assert tok.decode(ids).startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_one_readback_per_token(tiny):
    model, _ = tiny
    buf = io.StringIO()
    tracer = Tracer(buf)
    tokens = list(generate_step(mx.array([1, 2, 3, 4]), model, max_tokens=6, tracer=tracer))
    events = [json.loads(line) for line in buf.getvalue().splitlines()]
    syncs = [e for e in events if e.get("sync")]
    assert len(tokens) == 6
    assert [e["phase"] for e in syncs] == ["readback"] * 6
    assert sum(e["phase"] == "decode_step" for e in events) == 5


def test_chunked_prefill_trace_and_equivalence(tiny):
    model, _ = tiny
    prompt = mx.array(list(range(10, 50)))
    buf = io.StringIO()
    chunked = [t for t, _ in generate_step(prompt, model, max_tokens=4, prefill_step_size=16,
                                           tracer=Tracer(buf))]
    whole = [t for t, _ in generate_step(prompt, model, max_tokens=4)]
    assert chunked == whole
    prefill = [json.loads(l) for l in buf.getvalue().splitlines() if '"prefill"' in l]
    assert [e["tokens"] for e in prefill] == [16, 16, 8]


@pytest.mark.parametrize("penalty", [1.3, 0.05])
def test_logits_processors_and_sampling_run_on_the_stacked_path(tiny, penalty):
    # the repetition penalty and a seeded top-p draw after a stacked decode path (reference: the CPU's
    # stacked path) give the plain path's tokens, with one readback a token; a penalty far below 1 makes the
    # recent tokens near-certain picks, so there the draw must differ from one without the penalty
    from metalgen.sampling import make_logits_processors, make_sampler

    model, _ = tiny
    prompt = mx.array([5, 9, 5, 9, 5, 9, 17], mx.int32)
    runs = {}
    for mode in ("plain", "reference", "reference_nopen"):
        buf = io.StringIO()
        procs = [] if mode.endswith("nopen") else make_logits_processors(penalty, 8)
        runs[mode] = [t for t, _ in generate_step(
            prompt, model, max_tokens=24, sampler=make_sampler(0.8, top_p=0.9, seed=3), logits_processors=procs,
            decode=mode.split("_")[0], tracer=Tracer(buf))]
        syncs = [json.loads(line)["phase"] for line in buf.getvalue().splitlines() if json.loads(line).get("sync")]
        assert syncs == ["readback"] * 24
    assert runs["plain"] == runs["reference"]
    if penalty < 1:
        assert runs["reference"] != runs["reference_nopen"]
        assert len(set(runs["reference"])) < len(set(runs["reference_nopen"]))


@pytest.mark.parametrize("decode", ["plain", "reference"])
def test_penalty_over_the_samplers_own_recent_tokens_equals_the_history(tiny, decode):
    # a lone repetition penalty: the sampler keeps the recent tokens in its state (no history concatenated a token);
    # the same penalty behind a second processor runs as MLX operations over the history. Same tokens (float32
    # logits: the processor's arithmetic is the kernel's), with the ring on the prompt's last tokens at the start
    from metalgen.sampling import make_repetition_penalty, make_sampler

    model, _ = tiny
    prompt = mx.array([5, 9, 5, 9, 5, 9, 17, 3, 3, 8, 21], mx.int32)
    rp = make_repetition_penalty(0.1, 6)
    kept, given = make_sampler(0.9, top_p=0.95, seed=11), make_sampler(0.9, top_p=0.95, seed=11)
    ring = [t for t, _ in generate_step(prompt, model, max_tokens=30, sampler=kept, logits_processors=[rp],
                                        decode=decode)]
    history = [t for t, _ in generate_step(prompt, model, max_tokens=30, sampler=given,
                                           logits_processors=[rp, lambda h, logits: logits], decode=decode)]
    assert kept.window == 6 and given.window == 0
    assert ring == history
    free = [t for t, _ in generate_step(prompt, model, max_tokens=30, sampler=make_sampler(0.9, top_p=0.95, seed=11),
                                        decode=decode)]
    assert ring != free  # the penalty acted


@pytest.mark.parametrize("decode", ["plain", "reference"])
def test_top_logprobs_are_the_log_softmax_top_k_and_change_nothing_else(tiny, decode):
    # each step's k alternatives are the top k of log_softmax(logits) (numpy over the full logits of the
    # same prefix), the chosen token and its logprob are as without them, and a step still reads back once
    import numpy as np

    from metalgen.cache import make_prompt_cache

    model, tok = tiny
    prompt = [5, 9, 17, 23]
    plain = list(generate_step(mx.array(prompt), model, max_tokens=4, decode=decode))
    buf = io.StringIO()
    withtop = list(generate_step(mx.array(prompt), model, max_tokens=4, decode=decode, top_logprobs=5,
                                 tracer=Tracer(buf)))
    assert [(t, lp) for t, lp, _ in withtop] == pytest.approx(plain)
    assert [json.loads(line)["phase"] for line in buf.getvalue().splitlines()
            if json.loads(line).get("sync")] == ["readback"] * 4
    for n, (_, _, top) in enumerate(withtop):
        ids = prompt + [t for t, _, _ in withtop[:n]]
        logits = np.array(model.logits(model.hidden(mx.array([ids]), cache=make_prompt_cache(model, decode="plain"))
                                       [:, -1, :])[0], dtype=np.float64)
        lsm = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert [i for i, _ in top] == np.argsort(-lsm)[:5].tolist()
        assert [v for _, v in top] == pytest.approx(lsm[np.argsort(-lsm)[:5]], abs=1e-4)
    responses = list(stream_generate(model, tok, prompt, max_tokens=3, top_logprobs=2))
    assert all(len(r.top_logprobs) == 2 for r in responses)
    assert all(r.top_logprobs is None for r in stream_generate(model, tok, prompt, max_tokens=2))
    with pytest.raises(MetalgenError, match="top logprobs must be in"):
        list(stream_generate(model, tok, prompt, max_tokens=2, top_logprobs=-1))
