"""metalgen.batch: the BatchGenerator's tokens against each sequence generated alone (rows of different
prompt lengths, one joining mid-way, one leaving early, one cancelled, per-row samplers and logits
processors), arrivals prefilled together a chunk a step while the batch decodes (grouping, cancellation
mid-prefill), one readback a step, batch_generate's texts, and what it refuses."""

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
from metalgen.prefix_cache import PrefixCache
from metalgen.sampling import make_logits_processors, make_sampler
from profiling import Tracer

from checkpoints import BATCH_CONFIGS, BATCH_CONFIGS_HD64, HYBRID_BATCH_CONFIGS, prefill_group, tiny_model

CONFIGS = {**BATCH_CONFIGS, **HYBRID_BATCH_CONFIGS}  # dense, MoE and hybrid (Gated DeltaNet) stacks


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


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_batched_tokens_equal_each_sequence_alone(kind):
    """A seeded sampled row, greedy rows of prompt lengths 4 (leaving after 3 tokens), 6 and 11, and a greedy
    row with a repetition penalty: the tokens each one gets alone. max_batch 4 makes the last row wait and
    join mid-way, when the short one has left. (The rows are sampled in groups, out of row order.)"""
    model = tiny_model(CONFIGS[kind])
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


@pytest.mark.parametrize("kind", sorted(CONFIGS) + ["qwen3-hd64"])
def test_a_batch_of_traced_steps_gives_each_sequence_its_tokens_alone(kind):
    """8 rows (past kernels_metal.GEMV_MAX_ROWS: the step runs traced layer halves, metalgen.batch_step),
    their budgets staggered so that the batch shrinks through the threshold to the untraced step; one row
    sampled with a seed, one with a repetition penalty; two more join when 6 are left (the step padded to 8
    rows, a hybrid stack's states too): each row's tokens are those it gets alone. (Heads of 64 dims: the
    norms, RoPE and cache write of the step in one kernels_metal.qk_rope_store launch.)"""
    model = tiny_model(BATCH_CONFIGS_HD64["qwen3"] if kind == "qwen3-hd64" else CONFIGS[kind])
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 512, int(n)).tolist() for n in rng.integers(3, 30, 8)]
    budgets = [12, 3, 5, 7, 9, 4, 11, 6]
    samplers = [make_sampler(1.0, seed=3)] + [None] * 7
    processors = [[]] * 5 + [make_logits_processors(1.5, 8)] + [[]] * 2
    gen = BatchGenerator(model, max_batch=8)
    uids = [gen.insert(p, n, s, lp) for p, n, s, lp in zip(prompts, budgets, samplers, processors)]
    late = [rng.integers(0, 512, n).tolist() for n in (7, 19)]

    def join(g):
        assert len([r for r in g.rows if not r.done]) == 6
        uids.extend(g.insert(p, 6) for p in late)

    tokens, _ = run(gen, late=(4, join))
    prompts, budgets = prompts + late, budgets + [6, 6]
    samplers, processors = samplers + [None, None], processors + [[], []]
    for uid, p, n, s, lp in zip(uids, prompts, budgets, samplers, processors):
        fresh = make_sampler(1.0, seed=3) if s is not None else None  # samplers and processors anew
        assert tokens[uid] == alone(model, p, n, fresh, make_logits_processors(1.5, 8) if lp else []), (kind, uid)


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
    gen = BatchGenerator(tiny_model(BATCH_CONFIGS["qwen3"]))
    for prompt, n, msg in [([], 4, "empty"), ([1, 512], 4, "id 512 is outside"), ([1] * 256, 4, "past the model's"),
                           ([1], 0, "max tokens must be >= 1")]:
        with pytest.raises(MetalgenError, match=msg):
            gen.insert(prompt, n)
    with pytest.raises(MetalgenError, match="max batch"):
        BatchGenerator(tiny_model(BATCH_CONFIGS["qwen3"]), max_batch=0)
    with pytest.raises(MetalgenError, match="prefill batch must be >= 1, got 0"):
        BatchGenerator(tiny_model(BATCH_CONFIGS["qwen3"]), prefill_batch=0)


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


def test_rows_with_their_own_samplers_draw_in_one_launch_a_step(monkeypatch):
    # per-row settings and states in one sampler launch (kernels_metal.sample_rows); a row's own sampler
    # draws only its first token (the prefill's), and the rows still get what they get alone
    import kernels_metal

    from metalgen.sampling import DeviceSampler

    model = tiny_model(BATCH_CONFIGS["qwen3"])
    launches, singles = [], []
    real_rows, real_call = kernels_metal.sample_rows, DeviceSampler.__call__
    monkeypatch.setattr(kernels_metal, "sample_rows", lambda logits, *a, **k: launches.append(logits.shape[0])
                        or real_rows(logits, *a, **k))
    monkeypatch.setattr(DeviceSampler, "__call__", lambda self, *a, **k: singles.append(1) or real_call(self, *a, **k))
    settings = [(0.9, 1, None), (0.7, 2, 1.3), (0.0, 3, None)]
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]

    def sampling(t, seed, pen):
        return make_sampler(t, top_p=0.9, seed=seed), make_logits_processors(pen, 4)

    gen = BatchGenerator(model, max_batch=3)
    uids = [gen.insert(p, 6, *sampling(*s)) for p, s in zip(prompts, settings)]
    tokens, _ = run(gen)
    assert len(singles) == 3 and launches == [3] * 5  # 3 first tokens alone, then 5 steps of 3 rows
    monkeypatch.setattr(DeviceSampler, "__call__", real_call)
    for uid, p, s in zip(uids, prompts, settings):
        assert tokens[uid] == alone(model, p, 6, *sampling(*s))


def steps(gen, late=None):
    """Step `gen` until it is idle: the responses of each step; `late` {step: fn} calls fn(gen) before it."""
    out = []
    while gen.busy or (late and len(out) in late):
        if late and len(out) in late:
            late[len(out)](gen)
        out.append(gen.step())
    return out


def spans(buf, phase):
    return [e for e in (json.loads(line) for line in buf.getvalue().splitlines()) if e["phase"] == phase]


def alone_with_logprobs(model, prompt, n, sampler=None, processors=(), top=0):
    return list(generate_step(mx.array(prompt, mx.int32), model, max_tokens=n, sampler=sampler,
                              logits_processors=processors, top_logprobs=top))


def test_a_last_sliver_of_the_prompts_joins_the_chunk_before_it():
    """Two prompts of 17 tokens, 16 tokens a chunk: 8 columns, then the last 9 (an eighth more than the width)
    rather than a third chunk of one column; the tokens are those each prompt gets alone."""
    model = tiny_model(CONFIGS["qwen3"])
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 512, 17).tolist() for _ in range(2)]
    buf = io.StringIO()
    gen = BatchGenerator(model, prefill_step_size=16, tracer=Tracer(buf))
    uids = [gen.insert(p, 4) for p in prompts]
    got = {u: [] for u in uids}
    for resps in steps(gen):
        for r in resps:
            got[r.uid].append(r.token)
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")] == [(2, 16), (2, 18)]
    for uid, p in zip(uids, prompts):
        assert got[uid] == [w[0] for w in alone_with_logprobs(model, p, 4, None, [])]


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_arrivals_at_one_boundary_are_prefilled_together(kind):
    """Five prompts (5 to 14 tokens) arrive at once, with a seeded sampler, a repetition penalty with top
    logprobs, a presence penalty: those of 5, 9 and 8 tokens are prefilled as one group in chunks of 6 and 3
    columns (3 rows share the 20 tokens a chunk), the 14 and the 3 (too much padding beside the others)
    after them; each row's tokens, logprobs and alternatives are those it gets alone. (The 5-token row's
    padding takes 4 columns of the first chunk: a hybrid stack's Gated DeltaNet layers feed zeros there.)"""
    from metalgen.sampling import make_presence_frequency_penalty

    model = tiny_model(CONFIGS[kind])
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, 512, n).tolist() for n in (5, 9, 14, 3, 8)]
    settings = [dict(), dict(sampler=lambda: make_sampler(1.0, seed=3)),
                dict(processors=lambda: make_logits_processors(1.3, 8), top=3), dict(),
                dict(processors=lambda: make_presence_frequency_penalty(0.5, 0.8, prompt_tokens=8))]

    def args(s):
        return (s["sampler"]() if "sampler" in s else None, s["processors"]() if "processors" in s else [])

    buf = io.StringIO()
    gen = BatchGenerator(model, prefill_step_size=20, tracer=Tracer(buf))
    uids = [gen.insert(p, 6, *args(s), top_logprobs=s.get("top", 0)) for p, s in zip(prompts, settings)]
    got = {u: [] for u in uids}
    per_step = steps(gen)
    for resps in per_step:
        for r in resps:
            got[r.uid].append(r)
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")] == [(3, 18), (3, 9), (1, 14), (1, 3)]
    assert per_step[0] == [] and sorted(r.uid for r in per_step[1]) == [uids[0], uids[1], uids[4]]
    for uid, p, s in zip(uids, prompts, settings):
        want = alone_with_logprobs(model, p, 6, *args(s), top=s.get("top", 0))
        assert [r.token for r in got[uid]] == [w[0] for w in want], (kind, uid)
        assert [r.logprob for r in got[uid]] == pytest.approx([w[1] for w in want], rel=1e-4, abs=1e-5)
        if s.get("top"):
            assert [[i for i, _ in r.top_logprobs] for r in got[uid]] == [[i for i, _ in w[2]] for w in want]
        else:
            assert all(r.top_logprobs is None for r in got[uid])
    assert len(set(r.token for r in got[uids[1]])) > 2  # the sampled row really samples


def test_a_long_prompt_is_prefilled_a_chunk_a_step_while_the_batch_decodes():
    """Two short rows decode; a 70-token prompt arriving before step 2 is fed 16 tokens a step, ahead of each
    step's decode, so the rows go on getting a token every step and it joins at step 6; one readback a
    step throughout, and every row's tokens are those it gets alone."""
    model = tiny_model(BATCH_CONFIGS["qwen3"])
    rng = np.random.default_rng(5)
    short = [rng.integers(0, 512, n).tolist() for n in (4, 6)]
    long = rng.integers(0, 512, 70).tolist()
    buf = io.StringIO()
    gen = BatchGenerator(model, prefill_step_size=16, tracer=Tracer(buf))
    uids = [gen.insert(p, 12) for p in short]
    per_step = steps(gen, {2: lambda g: uids.append(g.insert(long, 5))})
    assert [len(r) for r in per_step[:7]] == [2, 2, 2, 2, 2, 2, 3]
    assert [r.uid for r in per_step[6]][-1] == uids[2]
    assert [e["tokens"] for e in spans(buf, "prefill")] == [12, 16, 16, 16, 16, 6]
    events = [json.loads(line) for line in buf.getvalue().splitlines()]
    # each chunk is enqueued before its step's decode, and each step reads back once
    order = [e["phase"] for e in events if e["phase"] in ("prefill", "decode_step", "readback")]
    chunk, plain = ["prefill", "decode_step", "readback"], ["decode_step", "readback"]
    assert order[:22] == chunk + plain + chunk * 5 + plain
    assert [e["phase"] for e in events if e.get("sync")] == ["readback"] * sum(1 for r in per_step if r)
    tokens = {}
    for resps in per_step:
        for r in resps:
            tokens.setdefault(r.uid, []).append(r.token)
    assert tokens[uids[0]] == alone(model, short[0], 12) and tokens[uids[1]] == alone(model, short[1], 12)
    assert tokens[uids[2]] == alone(model, long, 5)


@pytest.mark.parametrize("kind", ["qwen2", "qwen3_next"])
@pytest.mark.parametrize("other, after, rest", [(26, 2, [8, 8, 6]), (24, 1, [8, 8, 8])])
def test_a_row_cancelled_while_prefilling_leaves_its_group(kind, other, after, rest):
    """A row decodes while a group of two (30 tokens, and `other`) is prefilled 4 columns a step; the longer
    one is cancelled after `after` chunks. The other goes on alone, 8 columns a step, without the columns
    that were padding of it only: of 8 fed, the 4 written ones go (22 left); of 4 fed, all padding of it, it
    starts again from its own 24 tokens. Every remaining row gets its tokens alone; the cancelled one
    reports none. Cancelling the whole group ends its prefill. (A hybrid stack's Gated DeltaNet states
    drop the row and forget the columns with the attention layers' KV.)"""
    model = tiny_model(CONFIGS[kind])
    rng = np.random.default_rng(9)
    first, gone, kept = (rng.integers(0, 512, n).tolist() for n in (3, 30, other))
    buf = io.StringIO()
    gen = BatchGenerator(model, prefill_step_size=8, tracer=Tracer(buf))
    a = gen.insert(first, 16)
    state = {}

    def join(g):
        state["gone"], state["kept"] = g.insert(gone, 4), g.insert(kept, 4)

    per_step = steps(gen, {1: join, 1 + after: lambda g: g.remove(state["gone"])})
    tokens = {}
    for resps in per_step:
        for r in resps:
            tokens.setdefault(r.uid, []).append(r.token)
    assert state["gone"] not in tokens
    assert tokens[a] == alone(model, first, 16) and tokens[state["kept"]] == alone(model, kept, 4)
    fed_alone = [e["tokens"] for e in spans(buf, "prefill") if e["rows"] == 1][1:]  # after the first row's
    assert [e["tokens"] for e in spans(buf, "prefill") if e["rows"] == 2] == [8] * after
    assert fed_alone == rest

    gen = BatchGenerator(model, prefill_step_size=8)
    b, c = gen.insert(gone, 4), gen.insert(kept, 4)
    assert gen.step() == [] and gen.joining == 2
    gen.remove(b)
    gen.remove(c)
    assert not gen.busy and gen.step() == [] and gen.prefilling is None


def test_groups_are_capped_and_keep_padding_small():
    """Waiting prompts of 3, 5, 40, 12 and 36 tokens (chunks of 16 tokens): 3 and 5 share one chunk; 40 goes
    with 36 (a tenth of padding), not with 12 (more than a quarter); 12 goes last. `prefill_batch` 1 makes each
    prompt a group of its own; `max_batch` 2 lets a group take only the room the batch has (with chunks of
    512 tokens, 40 and 12 fit one chunk together). Every row gets its tokens alone."""
    model = tiny_model(BATCH_CONFIGS["qwen3_moe"])
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 512, n).tolist() for n in (3, 5, 40, 12, 36)]
    for kw, groups in [(dict(prefill_step_size=16), [(2, 10)] + [(2, 16)] * 5 + [(1, 12)]),
                       (dict(prefill_step_size=16, prefill_batch=1),
                        [(1, 3), (1, 5), (1, 16), (1, 16), (1, 8), (1, 12), (1, 16), (1, 16), (1, 4)]),
                       (dict(prefill_step_size=512, max_batch=2), [(2, 10), (2, 80), (1, 36)])]:
        buf = io.StringIO()
        gen = BatchGenerator(model, tracer=Tracer(buf), **kw)
        uids = [gen.insert(p, 3) for p in prompts]
        tokens, reasons = run(gen)
        assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")] == groups, kw
        for uid, p in zip(uids, prompts):
            assert tokens[uid] == alone(model, p, 3) and reasons[uid] == "length"


# -- the prefix cache (metalgen.prefix_cache) --------------------------------------------------------------

def check_alone(model, got, prompt, n, seed=None, top=0):
    """`got` (a row's BatchResponses) are the tokens, logprobs and alternatives of `prompt` generated alone."""
    sampler = make_sampler(1.0, seed=seed) if seed is not None else None
    want = alone_with_logprobs(model, prompt, n, sampler, top=top)
    assert [r.token for r in got] == [w[0] for w in want]
    assert [r.logprob for r in got] == pytest.approx([w[1] for w in want], rel=1e-4, abs=1e-5)
    if top:
        for r, w in zip(got, want):
            assert [i for i, _ in r.top_logprobs] == [i for i, _ in w[2]]
            assert [v for _, v in r.top_logprobs] == pytest.approx([v for _, v in w[2]], rel=1e-4, abs=1e-5)


def collect(per_step):
    got = {}
    for resps in per_step:
        for r in resps:
            got.setdefault(r.uid, []).append(r)
    return got


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_conversation_that_goes_on_prefills_only_its_new_tokens(kind):
    """A sampled request of 17 tokens generates 8 (7 of them fed back); the next turn (its prompt, its reply
    and 6 new tokens) is fed only the 6 new ones plus the reply's last token, and a prompt held whole is fed
    only its last token: each gets the tokens, logprobs and alternatives it gets alone from scratch. A hybrid
    stack starts from a state snapshot, which the cache holds where the first prompt ended (17) and where
    the first request finished (24): the next turn starts from the second, the prompt held whole (24 tokens,
    one of which must be fed) from the first. (Its prompts' last tokens are fed apart, for a snapshot before
    them.)"""
    hybrid = kind in HYBRID_BATCH_CONFIGS
    model = tiny_model(CONFIGS[kind])
    rng = np.random.default_rng(4)
    first = rng.integers(0, 512, 17).tolist()
    buf = io.StringIO()
    cache = PrefixCache(1 << 24)
    gen = BatchGenerator(model, prefix_cache=cache, tracer=Tracer(buf))
    a = gen.insert(first, 8, make_sampler(1.0, seed=1))
    reply = [r.token for r in collect(steps(gen))[a]]
    gen.step()  # the finished row leaves: into the prefix cache
    assert cache.tokens == 17 + 7  # the last token was never fed
    second = first + reply + rng.integers(0, 512, 6).tolist()
    b = gen.insert(second, 6, make_sampler(1.0, seed=2), top_logprobs=4)
    got = collect(steps(gen))[b]
    fed = [(1, 16), (1, 1), (1, 6), (1, 1)] if hybrid else [(1, 17), (1, 7)]
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")] == fed
    assert {r.cached_tokens for r in got} == {24}
    check_alone(model, got, second, 6, seed=2, top=4)
    assert len({r.token for r in got}) > 2  # the row really samples
    whole = first + reply[:7]  # held whole: its last token is fed again for its logits
    c = gen.insert(whole, 4)
    got = collect(steps(gen))[c]
    fed, cached = ([6, 1], 17) if hybrid else ([1], 23)
    assert [e["tokens"] for e in spans(buf, "prefill")[-len(fed):]] == fed and got[0].cached_tokens == cached
    check_alone(model, got, whole, 4)
    if hybrid:  # sent again: fed only its last token, from the snapshot before it
        d = gen.insert(whole, 4)
        got = collect(steps(gen))[d]
        assert spans(buf, "prefill")[-1]["tokens"] == 1 and got[0].cached_tokens == 23
        check_alone(model, got, whole, 4)


def test_a_hybrid_prompt_from_a_snapshot_is_prefilled_alone():
    """Hybrid stack: after a request, two prompts arrive at once, one going on from the first (a snapshot
    where it finished) and one unrelated. They are fed apart, the first from its snapshot (each prompt's last
    token a chunk of its own), and each gets the tokens it gets alone."""
    model = tiny_model(HYBRID_BATCH_CONFIGS["qwen3_next"])
    rng = np.random.default_rng(6)
    first = rng.integers(0, 512, 12).tolist()
    buf = io.StringIO()
    gen = BatchGenerator(model, prefix_cache=PrefixCache(1 << 24), tracer=Tracer(buf))
    reply = collect(steps(gen, {0: lambda g: g.insert(first, 5)}))
    reply = [r.token for r in next(iter(reply.values()))]
    other = rng.integers(0, 512, 9).tolist()
    more = first + reply + rng.integers(0, 512, 3).tolist()
    uids = [gen.insert(more, 4), gen.insert(other, 4)]
    got = collect(steps(gen))
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")][2:] == [(1, 3), (1, 1), (1, 8), (1, 1)]
    assert got[uids[0]][0].cached_tokens == 16 and got[uids[1]][0].cached_tokens == 0
    assert [r.token for r in got[uids[0]]] == alone(model, more, 4)
    assert [r.token for r in got[uids[1]]] == alone(model, other, 4)


def test_rows_of_a_group_start_from_different_cached_lengths():
    """After a request with a 30-token system prompt, three arrive at once: the system prompt and 4 more
    tokens (30 cached), 5 unrelated tokens (none), its first 12 and 6 more (12). Left-aligned to the longest,
    they are fed together the last 6 columns, the longest remainder: the first row recomputes 2 of its
    cached tokens beside the others. Then a group with cached rows loses one mid-prefill: the other goes on.
    Every row gets what it gets alone."""
    model = tiny_model(BATCH_CONFIGS["qwen2"])
    rng = np.random.default_rng(8)
    system = rng.integers(0, 512, 30).tolist()
    prompts = [system + rng.integers(0, 512, 4).tolist(), rng.integers(0, 512, 5).tolist(),
               system[:12] + rng.integers(0, 512, 6).tolist()]
    buf = io.StringIO()
    gen = BatchGenerator(model, prefix_cache=PrefixCache(1 << 24), tracer=Tracer(buf))
    gen.insert(system + [1, 2], 2)
    steps(gen)
    uids = [gen.insert(p, 5, make_sampler(1.0, seed=i)) for i, p in enumerate(prompts)]
    got = collect(steps(gen))
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")][1:] == [(3, 18)]
    assert [got[u][0].cached_tokens for u in uids] == [28, 0, 12]
    for i, (u, p) in enumerate(zip(uids, prompts)):
        check_alone(model, got[u], p, 5, seed=i)

    # a group of two cached rows (20 and 30 tokens, 10 and 8 to feed, 28 columns cached) fed 4 columns a
    # step; the one without padding is cancelled after a chunk: the other drops its 8 columns of padding and
    # is fed the 6 it has left alone
    gen.prefill_step_size = 8
    kept, gone = system[:20] + rng.integers(0, 512, 10).tolist(), system + rng.integers(0, 512, 8).tolist()
    state = {}

    def join(g):
        state["kept"], state["gone"] = g.insert(kept, 3), g.insert(gone, 3)

    got = collect(steps(gen, {0: join, 1: lambda g: g.remove(state["gone"])}))
    assert state["gone"] not in got and got[state["kept"]][0].cached_tokens == 20
    check_alone(model, got[state["kept"]], kept, 3)
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")][-2:] == [(2, 8), (1, 6)]


def test_concurrent_requests_share_a_system_prompt_while_the_first_runs():
    """A request's prompt goes into the prefix cache when its prefill ends, not when it finishes: two more
    with the same 40-token system prompt, arriving while it decodes, are fed only their own 5 tokens, and the
    system prompt is held once."""
    model = tiny_model(BATCH_CONFIGS["qwen3_moe"])
    rng = np.random.default_rng(6)
    system = rng.integers(0, 512, 40).tolist()
    prompts = [system + [int(t)] + rng.integers(0, 512, 4).tolist() for t in (10, 20, 30)]
    buf = io.StringIO()
    cache = PrefixCache(1 << 24)
    gen = BatchGenerator(model, prefix_cache=cache, tracer=Tracer(buf))
    uids = [gen.insert(prompts[0], 12)]
    per_step = steps(gen, {2: lambda g: uids.extend(g.insert(p, 6) for p in prompts[1:])})
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")] == [(1, 45), (2, 10)]
    assert len(per_step[3]) == 3  # they joined the running row
    got = collect(per_step)
    assert [got[u][0].cached_tokens for u in uids] == [0, 40, 40]
    for u, p, n in zip(uids, prompts, (12, 6, 6)):
        check_alone(model, got[u], p, n)
    assert gen.step() == [] and gen.rows == []  # the last rows leave: into the prefix cache
    # each sequence's tokens fed (the first row's last one never is, the others' were, ahead of the step that
    # read them: the first row went on), the shared system prompt once
    assert cache.match(system) == 40 and cache.tokens == 40 + 3 * 5 + 11 + 2 * 6


def test_rows_with_one_prompt_share_its_prefill():
    """A request's n choices: the same 20-token prompt inserted three times (seeds 0, 1, 2), another prompt
    between them, chunks of 16 tokens: the prompt is fed once, as one row (16 and 4 columns; then the other
    prompt's 6), the twins join with copies of its KV and last logits, and each row gets what it gets alone.
    With the prompt in the prefix cache, three choices of a longer one are fed its 3 new tokens once; a twin
    takes the place of the fed row removed mid-prefill. A group all removed ends."""
    model = tiny_model(BATCH_CONFIGS["qwen2"])
    rng = np.random.default_rng(12)
    prompt, other = rng.integers(0, 512, 20).tolist(), rng.integers(0, 512, 6).tolist()
    buf = io.StringIO()
    gen = BatchGenerator(model, prefill_step_size=16, prefix_cache=PrefixCache(1 << 24), tracer=Tracer(buf))
    uids = [gen.insert(prompt, 5, make_sampler(1.0, seed=i)) for i in range(2)]
    uids += [gen.insert(other, 5), gen.insert(prompt, 5, make_sampler(1.0, seed=2))]
    assert gen.step() == [] and gen.joining == 4
    got = collect(steps(gen))
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")] == [(1, 16), (1, 4), (1, 6)]
    assert gen.prefilled == 20 + 6
    for i, u in enumerate(uids[:2] + uids[3:]):
        check_alone(model, got[u], prompt, 5, seed=i)
        assert got[u][0].cached_tokens == 0
    check_alone(model, got[uids[2]], other, 5)
    assert len({tuple(r.token for r in got[u]) for u in uids}) == 4

    # the prompt held by the prefix cache now: twins share the cached prefix and its last token's feed
    gen.prefill_step_size = 2
    fed = gen.prefilled
    late = [gen.insert(prompt + [7, 8, 9], 3, make_sampler(1.0, seed=i)) for i in range(3)]
    got = collect(steps(gen, {1: lambda g: g.remove(late[0])}))
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")][-2:] == [(1, 2), (1, 1)]
    assert gen.prefilled - fed == 3 and late[0] not in got
    for i, u in enumerate(late[1:], start=1):
        check_alone(model, got[u], prompt + [7, 8, 9], 3, seed=i)
        assert got[u][0].cached_tokens == 20

    gen.prefill_step_size = 4
    twins = [gen.insert(other + other, 3) for _ in range(2)]
    assert gen.step() == [] and gen.joining == 2
    for u in twins:
        gen.remove(u)
    assert not gen.busy and gen.step() == [] and gen.prefilling is None


def kv_alone(model, ids):
    """The keys and values of `ids` run alone, (layers, kv_heads, n, head_dim) each, as the prefix cache
    holds them."""
    caches, _ = prefill_group(model, [ids])
    n = len(ids)
    return (mx.stack([c.keys[0, :, :n, :] for c in caches]), mx.stack([c.values[0, :, :n, :] for c in caches]))


@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_rows_that_store_together_each_store_their_own_kv(kind):
    """Three prompts (9, 6 and 12 tokens: each row its own padding) prefilled as one group go into the
    prefix cache together when their prefill ends, and leave the batch together 4 tokens later: one copy of
    the group's layers, and of the leaving rows' blocks, serves them all. Each prompt, and each sequence as
    it left, holds the keys and values it has run alone."""
    model = tiny_model(CONFIGS[kind])
    rng = np.random.default_rng(21)
    prompts = [rng.integers(0, 512, n).tolist() for n in (9, 6, 12)]
    cache = PrefixCache(1 << 24)
    buf = io.StringIO()
    gen = BatchGenerator(model, prefill_step_size=64, prefix_cache=cache, tracer=Tracer(buf))
    uids = [gen.insert(p, 4) for p in prompts]
    got = collect(steps(gen))
    assert [(e["rows"], e["tokens"]) for e in spans(buf, "prefill")] == [(3, 36)]
    assert gen.step() == [] and gen.rows == []  # the three leave in one step
    for u, p in zip(uids, prompts):
        left = p + [r.token for r in got[u]][:3]  # the last token was never fed
        for ids in (p, left):
            assert cache.match(ids) == len(ids)
            for held, want in zip(cache.fetch(ids, len(ids)), kv_alone(model, ids)):
                assert np.allclose(np.array(held), np.array(want), atol=1e-5), (kind, len(ids))
