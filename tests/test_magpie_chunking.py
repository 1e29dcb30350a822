"""Magpie long text (metalgen/magpie/chunking.py, generate.stream_chunks) against NeMo 3.0.0's `do_tts`.

Without the NeMo venv: sentence splits, thresholds and the cross-chunk rules on hand-made cases whose
answers were read off NeMo's source. With it (tests/magpie_ref/make_chunk_reference.py): every split,
word count and chunk's ids NeMo made for long texts in seven languages (splits and counts only for zh,
ja), and the greedy codes of do_tts's multi-chunk loop on the tiny models, CFG on and off, frame
stacking 1 (chunks cut by the forced chunk end, the last one running to the step limit) and 2 (every
chunk ending on EOS inside a step), in both decoder modes: NeMo's uncached default against the
recompute loop, its decoder cache reset per chunk against the fast frame loop (metalgen/magpie/frames.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from metalgen.errors import MetalgenError
from metalgen.magpie.chunking import (
    ChunkProgress,
    ChunkRules,
    ChunkState,
    attended_position,
    chunk_texts,
    multi_chunk_prior_row,
    needs_split,
    split_sentences,
    word_count,
)

# ------------------------------------------------------------------------ without the NeMo venv


@pytest.mark.parametrize("text, lang, want", [
    ("Hello world. How are you?", "en", ["Hello world.", "How are you?"]),
    ("Dr. Smith is here. Good morning!", "en", ["Dr. Smith is here.", "Good morning!"]),
    # "3.5" and "a.m" have no space after their first period; the period of "a.m." has one.
    ("It costs 3.5 dollars at 9 a.m. sharp. ok then", "en", ["It costs 3.5 dollars at 9 a.m.", "Sharp.", "Ok then"]),
    ("A well-known *bold* fact. next", "en", ["A well known bold fact.", "Next"]),
    ("Wait... what?! Really", "en", ["Wait...", "What?!", "Really"]),
    ("こんにちは。元気ですか？はい", "ja", ["こんにちは。", "元気ですか？", "はい"]),
    ("你好。我很好…走吧", "zh", ["你好。", "我很好…", "走吧"]),
    # Western marks still need a space in these languages.
    ("你好.世界。", "zh", ["你好.世界。"]),
    ("नमस्ते। आप कैसे हैं॥ठीक", "hi", ["नमस्ते।", "आप कैसे हैं॥", "ठीक"]),
    ("Prof. X. Mr. Y went home.", "en", ["Prof. X.", "Mr. Y went home."]),
    ("   ", "en", []),
    ("Trailing space. ", "en", ["Trailing space."]),
])
def test_split_sentences(text, lang, want):
    assert split_sentences(text, lang) == want


def test_thresholds():
    assert word_count("a b  c\nd", "en") == 4
    assert word_count("你好 世界", "zh") == 4
    assert not needs_split(" ".join(["w"] * 44), "en")
    assert needs_split(" ".join(["w"] * 45), "en")  # the threshold itself splits
    assert not needs_split(" ".join(["w"] * 72), "es") and needs_split(" ".join(["w"] * 73), "es")
    assert needs_split(" ".join(["w"] * 45), "xx")  # unknown languages use English's
    assert needs_split("a b c", "en", thresholds={"en": 3})


def test_chunk_texts_keeps_short_text_whole():
    text = "A short-ish text. With *two* sentences."
    assert chunk_texts(text, "en") == [text]  # not even the hyphen is touched
    long = "One two three four five. " * 9  # 45 words
    assert chunk_texts(long, "en") == ["One two three four five."] * 9
    assert chunk_texts("今日は 晴れ。 明日は 雨。", "ja", thresholds={"ja": 3}) == ["今日は晴れ。", "明日は雨。"]


def test_windows_and_offsets():
    """Chunk 1 sees its 8 tokens; chunk 2 (3 tokens) keeps 3 of the previous window; chunk 3 (30
    tokens) keeps up to 20, but the previous window has only 6."""
    st = ChunkState()
    w1 = st.open(range(8), last=False)
    assert w1.ids.tolist() == list(range(8)) and w1.first and w1.left_offset == 0 and w1.n_history == 0
    w2 = st.open([100, 101, 102], last=False)
    assert w2.ids.tolist() == [5, 6, 7, 100, 101, 102] and w2.left_offset == 5 and w2.n_history == 3
    w3 = st.open(range(200, 230), last=True)
    assert w3.ids.tolist() == [5, 6, 7, 100, 101, 102] + list(range(200, 230))
    assert w3.left_offset == 5 and w3.n_history == 6 and w3.last
    w4 = st.open(range(300, 340), last=True)
    assert len(w4.ids) == 60 and w4.ids[0] == 210 and w4.left_offset == 5 + 16


def test_initial_and_multi_chunk_priors():
    rules, eps = ChunkRules(), 0.1
    st = ChunkState()
    st.open(range(40), last=False)
    w = st.open(range(100, 140), last=True)  # 20 history + 40 new
    row = w.initial_prior(eps, rules)
    assert np.allclose(row[:20], eps * eps) and np.allclose(row[20:25], rules.init_weights) and np.allclose(row[25:], eps)
    assert ChunkState().open([1, 2], last=True).initial_prior(eps, rules) is None
    # Attended at whole-text position 30 in a window starting at 20: window position 10.
    r = multi_chunk_prior_row(30, {}, 60, 20, eps, rules)
    want = np.full(60, eps * eps, np.float32)
    want[9:15] = rules.weights
    np.testing.assert_allclose(r, want)
    # Short windows are flat, but a sink (10 visits, right of the window start) still pushes down.
    r = multi_chunk_prior_row(30, {25: 10, 19: 12}, 30, 20, eps, rules)
    assert np.allclose(r[:6], eps * eps) and np.allclose(r[6:], 1.0)


def test_attended_position_left_of_the_window():
    """A last attended position left of the new window gives NeMo a negative slice start, which
    counts from the end; the result is last + the argmax in that slice."""
    scores = np.zeros(40, np.float32)
    scores[33] = 1.0
    counter = {}
    # last 10, offset 17: relative start -7 -> scores[-7:min(-2, 37)] = scores[33:38].
    assert attended_position(scores, 10, counter, 40, 5, 17) == 10
    assert counter == {10: 1}
    # Nothing left to search: the window's last token.
    assert attended_position(scores, 60, {}, 40, 5, 17) == 17 + 39


def test_forced_end_counts_steps_near_the_end():
    st = ChunkState()
    st.open(range(12), last=False)
    w = st.open(range(50, 62), last=False)  # 24 tokens, window from 0
    assert (len(w.ids), w.left_offset) == (24, 0)
    p = ChunkProgress(st, w, prior_window=5, eps=0.1)
    st.last_attended = 18
    s = np.zeros(24, np.float32)
    s[21] = 1.0  # never chosen (one of the last 3): the search is [18, 21)
    s[20] = 0.5
    a, _ = p.step(s)
    assert a == 20 and p.near_end_steps is None and not p.forced_end  # 20 < 24 - 3
    st.last_attended = 21  # nothing left to search: the last token, near the end
    for n in (1, 2, 3):
        assert not p.forced_end
        a, _ = p.step(s)
        assert a == 23 and p.near_end_steps == n
    assert p.forced_end
    p.window.last = True
    assert not p.forced_end  # the last chunk ends on EOS only


def test_no_chunks_refused():
    from metalgen.magpie.generate import stream_chunks

    with pytest.raises(MetalgenError, match="no text chunks"):
        list(stream_chunks(None, [], 0))


@pytest.mark.parametrize("L, offset, first_rel", [
    (60, 20, 3),  # the shaped prior, from inside the window
    (60, 57, -40),  # from far left of the window: NeMo's negative slices and indices
    (40, 30, -6),  # a negative position whose weights wrap around to the window's start
    (30, 10, -5),  # a flat-prior window
    (50, 5, 46),  # near the end from the start: the search runs dry, a sink at the last position
])
def test_device_chunk_prior_matches_the_host_rules(L, offset, first_rel):
    """frames.advance_chunk_prior (device ops) against chunking.attended_position and
    multi_chunk_prior_row (the host rules the reference runs check) over 40 steps of scores whose
    favourite position dwells long enough to be stepped over."""
    import mlx.core as mx

    from metalgen.magpie.frames import PriorState, advance_chunk_prior

    rules, eps, window = ChunkRules(), 0.1, 5
    rng = np.random.default_rng(L + offset)
    left = max(0, -first_rel)
    state = PriorState(mx.array(first_rel, dtype=mx.int32), mx.zeros((L + left + 1,), dtype=mx.int32))
    last, counter = offset + first_rel, {}
    for step in range(40):
        scores = rng.random(L).astype(np.float32)
        scores[(step // 6 * 3 + first_rel) % L] += 2.0  # a favourite that moves every 6 steps
        want = attended_position(scores, last, counter, L, window, offset)
        want_row = multi_chunk_prior_row(want, counter, L, offset, eps, rules)
        last = want
        row, attended, state = advance_chunk_prior(mx.array(scores), state, left, window, eps, rules)
        assert int(attended.item()) + offset == want, step
        np.testing.assert_array_equal(np.array(row), want_row)
    if first_rel == 46:
        assert counter[offset + L - 1] >= rules.sink_count


# ------------------------------------------------------------------------- against NeMo's dump


@pytest.fixture(scope="module")
def ref():
    from magpie_ref.harness import chunk_reference_folder
    from metalgen.magpie.nemo_file import read_nemo
    from metalgen.magpie.text import MagpieText
    from metalgen.models.magpie.model import Model

    folder = chunk_reference_folder()
    out = dict(meta=json.loads((folder / "chunk.json").read_text()), npz=np.load(folder / "chunk.npz"))
    for tag, name in (("s1", "magpie.nemo"), ("s2", "magpie_s2.nemo")):
        cfg, weights = read_nemo(folder / name)
        out[tag] = (cfg, Model.from_weights(cfg, weights, source=name))
    cfg, model = out["s1"]
    out["text"] = MagpieText.from_config(cfg, text_vocab_size=model.args.text_vocab_size)
    return out


def test_splits_match_nemo(ref):
    from metalgen.magpie.chunking import LANGUAGE_THRESHOLDS, chunk_ids

    from metalgen.magpie.ja_g2p import njd_word_count

    meta = ref["meta"]
    assert meta["thresholds"] == LANGUAGE_THRESHOLDS
    assert len(meta["splits"]) >= 20
    # both sides count Japanese words with pyopenjtalk where it is installed, characters otherwise: the counts
    # are comparable only where the two environments agree (a dump before ja_counts counted characters)
    ours = "characters" if njd_word_count("あ") is None else "pyopenjtalk"
    same_ja = meta.get("ja_counts", "characters") == ours
    for case in meta["splits"]:
        lang, text = case["language"], case["text"]
        assert split_sentences(text, lang) == case["sentences"], (lang, text)
        if lang != "ja" or same_ja:
            assert word_count(text, lang) == case["word_count"], (lang, text)
            assert needs_split(text, lang) == case["split"], (lang, text)
        if "chunk_ids" in case:
            assert chunk_texts(text, lang) == case["chunk_texts"], (lang, text)
            got = chunk_ids(text, lang, lambda t: ref["text"].encode(t, lang))
            assert got == case["chunk_ids"], (lang, text)


def test_rules_match_nemo(ref):
    c = ref["meta"]["chunked_inference_config"]
    r = ChunkRules()
    assert (r.history_tokens, list(r.init_weights), list(r.weights)) == (
        c["history_len_heuristic"], c["prior_weights_init"], c["prior_weights"])
    assert (r.forced_end_after, r.flat_prior_max_len, r.sink_count, r.near_end) == (
        c["forceful_chunk_end_threshold"], c["short_sentence_threshold"], c["attention_sink_threshold"],
        c["near_end_threshold"])


def _run(ref, key, n_chunks=None):
    """Our loop on run `key`'s chunks (the fast one for NeMo's cached runs, else the recompute loop)
    -> (codes, records, NeMo's codes, NeMo's chunks), stopping after `n_chunks` chunks when given
    (the pieces are consumed one by one, so the loop stops there)."""
    from metalgen.magpie.generate import MagpieSampling, stream_chunks

    run = ref["meta"]["runs"][key]
    cfg, model = ref[run["model"]]
    s = MagpieSampling.from_config(cfg, max_frames=ref["meta"]["max_decoder_steps"])
    record, pieces = {}, []
    n = n_chunks or len(run["chunks"])
    for piece in stream_chunks(model, [c["ids"] for c in run["chunks"]], run["speaker_index"], s, cfg=run["cfg"],
                               record=record, recompute=not run["cached"]):
        if len(record["chunks"]) >= n:
            break  # this piece is the next chunk's first
        pieces.append(piece)
    want = np.concatenate([ref["npz"][f"{key}_chunk{i}"] for i in range(n)], axis=1)
    return np.concatenate(pieces, axis=1), record["chunks"][:n], want, run["chunks"][:n]


def _same(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = np.argwhere(got != want)
    assert diff.size == 0, f"{len(diff)} codes differ, first at frame {diff[:, 1].min()}"


@pytest.mark.parametrize("key, n_chunks", [
    ("s1_en_cfg", None),  # all 7 chunks: forced ends, a flat-prior window, the last one at the step limit
    ("s1_en_nocfg", 3),
    ("s1_de_cfg", 3),
    ("s2_en_cfg", None),  # every chunk ends on EOS inside a stacked step
    ("s2_en_nocfg", None),
    # The fast loop against NeMo's decoder cache reset per chunk.
    ("s1_en_cfg_cached", None),
    ("s1_en_nocfg_cached", None),
    ("s2_en_cfg_cached", None),
    ("s2_en_nocfg_cached", None),
])
def test_greedy_codes_match_do_tts(ref, key, n_chunks):
    got, records, want, chunks = _run(ref, key, n_chunks)
    for rec, c in zip(records, chunks):
        assert rec["window"] == c["window"] and rec["left_offset"] == c["left_offset"]
        assert rec["attended"][-1] == c["last_attended"]
    _same(got, want)
    if key in ("s1_en_cfg", "s1_en_cfg_cached", "s1_en_nocfg_cached"):
        assert [r["forced_end"] for r in records] == [True] * 6 + [False]
        assert records[-1]["end_frame"] is None
    if key.startswith("s2"):
        # The two short chunks are cut before EOS may be drawn (8 frames); the rest end on it.
        assert [r["forced_end"] for r in records] == [False, True, False, False, True, False, False]
        assert all(r["end_frame"] is not None for r in records)


@pytest.mark.parametrize("key", ["s2_en_cfg", "s2_en_cfg_cached"])
def test_the_history_splice_matters(ref, monkeypatch, key):
    """Guard against a vacuous parity: with the history rows of the text memory recomputed for the
    new window (not kept from the previous one) the codes change, in both loops."""
    monkeypatch.setattr(ChunkState, "splice", lambda self, window, memory: memory)
    got, _, want, _ = _run(ref, key)
    assert got.shape != want.shape or (got != want).any()


def test_nemo_cached_runs_differ(ref):
    """NeMo's decoder cache, reset per chunk, gives other codes (what the fast loop is to match); on
    one chunk it equals infer_batch's cached mode, so it is that mode."""
    npz = ref["npz"]
    assert (npz["s1_en_cfg_codes"].shape != npz["s1_en_cfg_cached_codes"].shape
            or (npz["s1_en_cfg_codes"] != npz["s1_en_cfg_cached_codes"]).any())
    assert ref["meta"]["single_chunk_cached_generate_speech_equals_infer_batch"]


# ------------------------------------------------------------------------------------------ the API


def test_api_speaks_long_text_in_chunks():
    """dummy:magpie-tiny (no venv): a 45-word text is cut into 9 chunks; `codes` is the chunks'
    codes joined, `stream`'s audio is `synthesize`'s, piece by piece."""
    import metalgen.tts
    from metalgen.magpie.generate import generate_chunks

    tts = metalgen.tts.load("dummy:magpie-tiny")
    text = "One two three four five. " * 9
    chunks = tts.encode_chunks(text, "en")
    assert chunks == [tts.encode("One two three four five.", "en")] * 9
    assert tts.encode_chunks("One two three.", "English") == [tts.encode("One two three.", "en")]
    opts = dict(seed=5, max_frames=4)
    codes = tts.codes(text, "en", **opts)
    s = tts.sampling_for(max_frames=4)
    np.testing.assert_array_equal(codes, generate_chunks(tts.model, chunks, 0, s, seed=5))
    assert 9 <= codes.shape[1] <= 9 * 4  # each chunk at least one step (EOS is banned for 4 frames)
    wav, _ = tts.synthesize(text, "en", **opts)
    pieces = list(tts.stream(text, "en", chunk_frames=2, first_chunk_frames=1, **opts))
    assert len(pieces) > 9
    np.testing.assert_allclose(np.concatenate(pieces), wav, rtol=0, atol=1e-5)
    with pytest.raises(MetalgenError, match="the text is empty"):
        tts.codes(" \n", "en")


def test_api_matches_do_tts(ref):
    """`MagpieTTS.codes` on the frame-stacking-2 reference model: do_tts's chunks, and the greedy codes
    of its cached decoder reset per chunk (the fast loop users get)."""
    from magpie_ref.harness import chunk_reference_folder
    from metalgen import magpie

    folder = chunk_reference_folder()
    tts = magpie.load(folder / "magpie_s2.nemo", codec=folder / "codec.nemo")
    run = ref["meta"]["runs"]["s2_en_cfg_cached"]
    text = next(c["text"] for c in ref["meta"]["splits"] if c["language"] == "en")
    assert tts.encode_chunks(text, "en") == [c["ids"] for c in run["chunks"]]
    got = tts.codes(text, "en", speaker=run["speaker_index"], max_frames=ref["meta"]["max_decoder_steps"])
    _same(got, ref["npz"]["s2_en_cfg_cached_codes"])


def test_japanese_counts_pyopenjtalk_words_where_installed(monkeypatch):
    # NeMo's get_word_count: pyopenjtalk's front-end entries with a non-blank surface string; characters
    # without pyopenjtalk, or where it finds no word
    import metalgen.magpie.ja_g2p as ja

    words = [{"string": "今日"}, {"string": "は"}, {"string": " "}, "junk", {"string": "晴れ"}, {"string": "。"}]
    monkeypatch.setattr(ja, "_frontend", lambda name: (lambda text: words))
    assert word_count("今日は 晴れ。", "ja") == 4
    monkeypatch.setattr(ja, "_frontend", lambda name: (lambda text: [{"string": " "}]))
    assert word_count("今日は 晴れ。", "ja") == 6  # no word found: characters

    def missing(name):
        raise ja.MetalgenError("the Magpie tokenizer 'japanese_phoneme' (Japanese) needs pyopenjtalk")

    monkeypatch.setattr(ja, "_frontend", missing)
    assert word_count("今日は 晴れ。", "ja") == 6
    assert needs_split("あ" * 80, "ja") and not needs_split("あ" * 79, "ja")
