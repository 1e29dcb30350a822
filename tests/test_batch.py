"""metalgen.batch: the BatchGenerator's tokens against each sequence generated alone (rows of different
prompt lengths, one joining mid-way, one leaving early, one cancelled, per-row samplers and logits
processors), one readback a step, batch_generate's texts, and what it refuses."""

from __future__ import annotations

import io
import json

import mlx.core as mx
import numpy as np
import pytest

import metalgen
from metalgen.batch import BatchGenerator, batch_generate
from metalgen.errors import MetalgenError
from metalgen.generate import generate_step
from metalgen.sampling import make_logits_processors, make_sampler
from profiling import Tracer

from checkpoints import BATCH_CONFIGS, tiny_model


def alone(model, prompt, n, sampler=None, processors=()):
    """The tokens metalgen.generate's generator gives for `prompt` by itself."""
    return [t for t, _ in generate_step(mx.array(prompt, mx.int32), model, max_tokens=n, sampler=sampler,
                                        logits_processors=processors)]


def run(gen, late=None):
    """Step `gen` until it is idle: {uid: tokens}, {uid: finish reason}; `late` = (step, fn) calls fn(gen)
    before that step (a sequence inserted or removed mid-way)."""
    tokens, reasons, step = {}, {}, 0
    while gen.busy:
        if late and step == late[0]:
            late[1](gen)
        for r in gen.step():
            assert r.uid not in reasons, "a finished or removed sequence went on"
            tokens.setdefault(r.uid, []).append(r.token)
            if r.finish_reason:
                reasons[r.uid] = r.finish_reason
        step += 1
    return tokens, reasons


@pytest.mark.parametrize("kind", sorted(BATCH_CONFIGS))
def test_batched_tokens_equal_each_sequence_alone(kind):
    """A seeded sampled row, greedy rows of prompt lengths 4 (leaving after 3 tokens), 6 and 11, and a greedy
    row with a repetition penalty: the tokens each one gets alone. max_batch 4 makes the last row wait and
    join mid-way, when the short one has left. (The rows are sampled in groups, out of row order.)"""
    model = tiny_model(BATCH_CONFIGS[kind])
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 512, n).tolist() for n in (9, 4, 15, 6, 11)]
    budgets = [10, 3, 8, 9, 7]
    settings = [{"seed": 5}, {}, {"penalty": 1.5}, {}, {}]

    def sampling(s):
        sampler = make_sampler(1.0, seed=s["seed"]) if "seed" in s else None
        return sampler, make_logits_processors(s.get("penalty"), 8)

    gen = BatchGenerator(model, max_batch=4)
    uids = [gen.insert(p, n, *sampling(s)) for p, n, s in zip(prompts, budgets, settings)]
    tokens, reasons = run(gen)
    for uid, p, n, s in zip(uids, prompts, budgets, settings):
        assert tokens[uid] == alone(model, p, n, *sampling(s)), (kind, uid)
        assert reasons[uid] == "length"
    assert len(set(tokens[uids[0]])) > 3  # the sampled row really samples


def test_stop_ids_cancellation_and_a_late_join():
    model = tiny_model(BATCH_CONFIGS["qwen3"])
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 512, n).tolist() for n in (5, 8, 13)]
    ref = [alone(model, p, 12, make_sampler(1.0, seed=i)) for i, p in enumerate(prompts)]
    stop = ref[0][4]  # row 0 stops at the first place this id comes up
    gen = BatchGenerator(model)
    a = gen.insert(prompts[0], 12, make_sampler(1.0, seed=0), stop_token_ids=[stop])
    b = gen.insert(prompts[1], 12, make_sampler(1.0, seed=1))
    state = {}

    def late(g):  # before step 3: row b is cancelled, row c joins
        g.remove(b)
        state["c"] = g.insert(prompts[2], 12, make_sampler(1.0, seed=2))

    tokens, reasons = run(gen, (3, late))
    c = state["c"]
    assert tokens[a] == ref[0][: ref[0].index(stop) + 1] and reasons[a] == "stop"
    assert tokens[b] == ref[1][:3] and b not in reasons
    assert tokens[c] == ref[2] and reasons[c] == "length"


def test_one_readback_a_step():
    model = tiny_model(BATCH_CONFIGS["qwen2"])
    buf = io.StringIO()
    gen = BatchGenerator(model, tracer=Tracer(buf))
    gen.insert([1, 2, 3], 5)
    gen.insert([4, 5, 6, 7, 8, 9], 4)
    tokens, _ = run(gen)
    events = [json.loads(line) for line in buf.getvalue().splitlines()]
    assert [e["phase"] for e in events if e.get("sync")] == ["readback"] * 5
    # a step of both rows is enqueued ahead of each readback but the last, which ends the last row
    assert [e["tokens"] for e in events if e["phase"] == "decode_step"] == [2, 2, 2, 2]
    assert sorted(len(t) for t in tokens.values()) == [4, 5]


@pytest.fixture(scope="module")
def tiny():
    return metalgen.load("dummy:tiny-qwen3", dtype="float32")


def test_batch_generate_gives_each_prompts_text_alone(tiny):
    model, tok = tiny
    prompts = ["Once upon a time", tok.encode("The sea is"), [{"role": "user", "content": "Hi"}], "A"]
    texts = metalgen.batch_generate(model, tok, prompts, max_tokens=10, max_batch=3)
    assert texts == [metalgen.generate(model, tok, p, max_tokens=10) for p in prompts]
    full = texts[0]
    stop = full[4:7]
    assert stop and metalgen.batch_generate(model, tok, prompts[:2], max_tokens=10, stop=[stop]) == [
        metalgen.generate(model, tok, p, max_tokens=10, stop=[stop]) for p in prompts[:2]]
    assert batch_generate(model, tok, ["x", "y"], max_tokens=0) == ["", ""]


def test_refusals_are_one_line_errors():
    from metalgen.dummy import dummy_config
    from metalgen.models import build_model

    with pytest.raises(MetalgenError, match="Gated DeltaNet"):
        BatchGenerator(build_model(dummy_config("tiny-qwen3.5")))
    gen = BatchGenerator(tiny_model(BATCH_CONFIGS["qwen3"]))
    for prompt, n, msg in [([], 4, "empty"), ([1, 512], 4, "id 512 is outside"), ([1] * 256, 4, "past the model's"),
                           ([1], 0, "max tokens must be >= 1")]:
        with pytest.raises(MetalgenError, match=msg):
            gen.insert(prompt, n)
    with pytest.raises(MetalgenError, match="max batch"):
        BatchGenerator(tiny_model(BATCH_CONFIGS["qwen3"]), max_batch=0)


def test_rows_that_ask_for_top_logprobs_get_those_of_their_run_alone(tiny):
    # a row with alternatives (and a presence/frequency penalty) next to plain greedy rows: each gets the
    # tokens, logprobs and alternatives it gets alone; the others carry none
    from metalgen.sampling import make_presence_frequency_penalty

    model, _ = tiny
    prompts = [[5, 9, 17, 23], [40, 41, 42], [7, 7, 7, 7, 7]]
    procs = make_presence_frequency_penalty(0.4, 1.2, prompt_tokens=3)
    want = list(generate_step(mx.array(prompts[1], mx.int32), model, max_tokens=5, logits_processors=procs,
                              top_logprobs=3))
    gen = BatchGenerator(model, max_batch=3)
    uids = [gen.insert(prompts[0], 5), gen.insert(prompts[1], 5, logits_processors=procs, top_logprobs=3),
            gen.insert(prompts[2], 5)]
    got = {u: [] for u in uids}
    while gen.busy:
        for r in gen.step():
            got[r.uid].append(r)
    assert [r.token for r in got[uids[1]]] == [t for t, _, _ in want]
    for r, (_, lp, top) in zip(got[uids[1]], want):
        assert r.logprob == pytest.approx(lp, abs=1e-5)
        assert [i for i, _ in r.top_logprobs] == [i for i, _ in top]
        assert [v for _, v in r.top_logprobs] == pytest.approx([v for _, v in top], abs=1e-5)
    assert [r.token for r in got[uids[0]]] == alone(model, prompts[0], 5)
    assert all(r.top_logprobs is None for u in (uids[0], uids[2]) for r in got[u])
