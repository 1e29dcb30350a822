"""Encoding matches Hugging Face `tokenizers` id for id, on a varied corpus and on random text."""

from __future__ import annotations

import json
import os
import shutil
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenizer import Tokenizer
from tokenizer.bpe import BytePairEncoder
from tokenizer.pretokenize import BYTE_TO_CHAR, _barrier_regex

from conftest import ASSET_TOKENIZER

hf_tokenizers = pytest.importorskip("tokenizers")

BARRIERS = _barrier_regex()
ASSETS = str(ASSET_TOKENIZER)


@pytest.fixture(scope="module")
def ref():
    return hf_tokenizers.Tokenizer.from_file(os.path.join(ASSETS, "tokenizer.json"))


CORPUS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.",
    "DON'T it's We'LL you'RE I'M they've she'd He'S can't SHOULDN'T o'clock rock'n'roll ''s '",
    "def f(x):\n\tif x:\n\t\treturn x  # comment\n\n\n    \t  \n" + " " * 37 + "pass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * 2; }\r\n\r\n}}}\n",
    "3.14159 2,718 1e-9 0x1F 1234567890 -42 +7 $1,000,000.00 50% 2024-06-01T12:00:00Z",
    "中文测试：你好，世界！这是一个长句子，没有空格也能正确切分。",
    "日本語のテキスト、カタカナとひらがな。한국어 텍스트입니다.",
    "مرحبا بالعالم، هذا نص عربي. שלום עולם",
    "Привет, мир! Ελληνικά κείμενα. हिन्दी पाठ। ภาษาไทย",
    "👍 👍🏽 👋🏿 👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏻‍💻 🇫🇷🇯🇵 ❤️‍🔥 #️⃣ 1️⃣",
    "caf\u00e9 cafe\u0301 \u0065\u0301\u0302 A\u030a \u212b \u1e9b\u0323 \uac00 \u1100\u1161\u11a8",
    "Zalgo: Z\u0351\u0364\u036b\u0303\u0352\u0314a\u0310\u0307\u0361l\u0344\u033eg\u0300o\u0306",
    "odd: \u200b\u200c\u200d\ufeff\u00a0\u2028\u2029\u3000\u180e\x0b\x0c\x1c\x1d\x85 \U0001d400\U0001d7ce \ufffd",
    "controls \x00\x01\x7f tabs\t\t\tand   spaces   \n\n\n\n  end  ",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning here\n</think>\n\nAnswer.<|endoftext|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><tool_response>ok</tool_response>",
    "x<|im_end|>y <|im_end|> z<|fim_prefix|>a<|fim_middle|>b<|fim_suffix|><|repo_name|>r<|file_sep|>",
    "<|im_start|><|im_start|><|im_end|><|endoftext|><|endoftext|><think></think>",
    "partial <|im_start <im_start|> <|endoftext| <thin k> </think",
    "e\u0301<|im_end|>\u0301 special before combining mark",
    "https://example.com/path?q=1&r=two#frag user@example.org C:\\Users\\me\\file.txt",
    "a" * 500 + " " * 300 + "b" + "\n" * 50 + "字" * 200,
    "ſtring 'ſ 'S 'ſt ﬅ ß 'ẞ K \u212a",
]


@pytest.mark.parametrize("text", CORPUS, ids=[f"corpus{i}" for i in range(len(CORPUS))])
def test_corpus_matches_reference(ours, ref, text):
    assert_same_ids_as_composed_and_decomposed(ours, ref, text)


def assert_same_ids_as_composed_and_decomposed(ours, ref, text):
    """Our ids equal the reference's for `text` and for its NFD form (the normalizer composes what it
    can; the split sees the marks it cannot)."""
    assert ours.encode(text) == ref.encode(text).ids
    nfd = unicodedata.normalize("NFD", text)
    assert ours.encode(nfd) == ref.encode(nfd).ids


def test_whole_corpus_as_one_text(ours, ref):
    text = "\n".join(CORPUS)
    ids = ours.encode(text)
    assert ids == ref.encode(text).ids
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False)


def test_repeated_encode_uses_cache_and_agrees(ours, ref):
    text = "the cache must not change results: the the the 中文 中文"
    first = ours.encode(text)
    assert ours.encode(text) == first == ref.encode(text).ids
    assert "Ġthe" not in ours._model.cache  # keys are raw pre-tokens, not byte-level strings
    assert " the" in ours._model.cache


def test_add_special_tokens_flag_is_noop_for_qwen(ours):
    text = "<|im_start|>hi"
    assert ours.encode(text, add_special_tokens=True) == ours.encode(text, add_special_tokens=False)


def test_split_special_tokens_encodes_them_as_text(ours, ref):
    text = "<|im_start|>user <think>"
    ids = ours.encode(text, split_special_tokens=True)
    assert 151644 not in ids
    assert 151667 in ids  # <think> is an added token but not a special one
    ref.encode_special_tokens = True
    try:
        assert ids == ref.encode(text).ids
    finally:
        ref.encode_special_tokens = False


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_SPECIAL = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", " ", "\n"])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(_TEXT, _TEXT, _TEXT, _SPECIAL), max_size=4))
def test_random_unicode_matches_reference(ours, ref, parts):
    text = "".join(parts)
    ids = ours.encode(text)
    assert ids == ref.encode(text).ids
    assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=False)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_decode_of_encode_is_nfc(ours, ref, text):
    if any(t.content in text for t in ours.added_tokens):
        return
    roundtrip = ours.decode(ours.encode(text))
    # The reference normalizes with pre-Unicode-10 data, so around the marks it doesn't
    # know its "NFC" (which we reproduce) can differ from Python's; elsewhere they agree.
    assert roundtrip == ref.normalizer.normalize_str(text)
    if not BARRIERS.search(text):
        assert roundtrip == unicodedata.normalize("NFC", text)


def _small_tokenizer_json(merges_as_pairs: bool) -> dict:
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"), ("Ġwor", "l"), ("Ġworl", "d")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    return {
        "version": "1.0",
        "added_tokens": [
            {"id": len(vocab), "content": "<|end|>", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab,
            "merges": [[a, b] for a, b in merges] if merges_as_pairs else [f"{a} {b}" for a, b in merges],
        },
    }


@pytest.mark.parametrize("pairs", [True, False], ids=["merges-as-pairs", "merges-as-strings"])
def test_both_merge_formats(tmp_path, pairs):
    data = _small_tokenizer_json(pairs)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    ours = Tokenizer.from_pretrained(tmp_path)
    ref = hf_tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in ["hello world", "hellohello worldworld<|end|>x", "héllo wörld 中"]:
        assert ours.encode(text) == ref.encode(text).ids
    assert ours.encode("hello world") == [data["model"]["vocab"]["hello"], data["model"]["vocab"]["Ġworld"]]


def test_vocab_json_and_merges_txt(tmp_path):
    data = _small_tokenizer_json(True)
    (tmp_path / "vocab.json").write_text(json.dumps(data["model"]["vocab"]), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in data["model"]["merges"]]
    (tmp_path / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": {str(len(data["model"]["vocab"])): {"content": "<|end|>", "special": True}}, "eos_token": "<|end|>"}),
        encoding="utf-8",
    )
    ours = Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    ref = hf_tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in ["hello world<|end|>", "hello\n\nworld's 42"]:
        assert ours.encode(text) == ref.encode(text).ids
    assert ours.eos_token_id == len(data["model"]["vocab"])


def test_merge_order_follows_rank_not_position():
    # "abc": (b, c) outranks (a, b), so BPE must merge "bc" first even though "ab" is leftmost.
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    for tok in ("bc", "ab", "abc"):
        vocab[tok] = len(vocab)
    enc = BytePairEncoder(vocab, [("b", "c"), ("a", "b"), ("a", "bc")])
    assert enc.bpe("abc") == [vocab["abc"]]
    enc2 = BytePairEncoder(vocab, [("b", "c"), ("a", "b")])
    assert enc2.bpe("abc") == [vocab["a"], vocab["bc"]]
    # Equal pairs overlapping ("aaa"): leftmost first, as tokenizers does.
    vocab["aa"] = len(vocab)
    enc3 = BytePairEncoder(vocab, [("a", "a")])
    assert enc3.bpe("aaa") == [vocab["aa"], vocab["a"]]
    assert enc3.bpe("aaaa") == [vocab["aa"], vocab["aa"]]


def test_long_pretokens_match_reference(ours, ref):
    # Long runs exercise the heap merge (whitespace, letters without spaces, CJK).
    for text in [" " * 5000, "ab" * 3000, "漢字かな" * 800, "\t \n" * 700, "1" * 100]:
        assert ours.encode(text) == ref.encode(text).ids


# ---------------------------------------------------------------- Qwen3.5's split pattern
#
# The real Qwen3.5 vocabulary (~248k tokens) is not available offline, so these tests put
# Qwen3.5's pattern into the Qwen3 files: same vocab and merges, Qwen3.5's pre-tokenizer. The
# pattern is written out here as transformers' Qwen3_5Tokenizer defines it, independently of
# tokenizer.pretokenize.QWEN35_PATTERN, so a slip in either shows.

QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Text where \p{M} changes the split: scripts written with combining marks, decomposed
# accents, marks in odd places, and the usual code / digits / whitespace / contractions.
MARK_CORPUS = [
    "हिन्दी भाषा में लिखा गया पाठ। क्षत्रिय ज्ञान श्री क़लम ज़रूर फ़िल्म",
    "ภาษาไทยที่มีวรรณยุกต์ น้ำ ผู้หญิง กิ๊ก เด็ก ๆ ไปโรงเรียน",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ مُحَمَّدٌ ـــ قُرْآنٌ ١٢٣",
    "Tiếng Việt có dấu: người được những chữ ở đây; Tie\u0302\u0301ng Vie\u0323\u0302t ngu\u031bo\u031b\u0300i",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030a q\u0307 x\u0301\u0323 a\u0361b n\u0303o\u0303",
    "Zalgo: Z\u0351\u0364\u036b\u0303\u0352\u0314a\u0310\u0307\u0361l\u0344\u033eg\u0300o\u0306",
    "בְּרֵאשִׁית בָּרָא אֱלֹהִים אֵת הַשָּׁמַיִם וְאֵת הָאָרֶץ",
    "❤️ ☺️ ✌🏿 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🧑🏻‍💻 #️⃣ 1️⃣ ©️ ™️ 🇫🇷 a️b x\ufe0e",
    "한국어 텍스트입니다. \u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af",
    "def f(x):\n    return x ** 2  # café\n\n\tif (a != b) { c->d(); }\r\n",
    "3.14159 1234567890 ١٢٣٤ ๑๒๓ १२३ 1\u0301 2\u20e3 x1\u0300y",
    "  \n\n\t  x  \r\n\r\n   \n \u0301\n\u0301 \t\u0300",
    "DON'T we'LL it's I'M they've she'd e\u0301's 'S\u0301 '\u0301s o'clock",
    "\u0301abc !\u0301 ?\u0300\u0300 (\u0301x) \u0300\u0301\u0302 -\u0308-",
    "Ελληνικά ά ᾳ\u0342 Кирилица й\u0306 ёлка\u0301 ქართული ᏣᎳᎩ",
    # U+0897 is a 16.0 mark; U+1ACF, U+11B60 and U+1E6E3 are 17.0 marks, which the reference
    # does not know: they take the pinned-range path of the split. (With this vocab the ids
    # come out the same either way, as no merge crosses their edges; the pieces themselves
    # are checked in test_tokenizer_pretokenize.)
    "a\u0897b x\u1acfy z\U00011b60w \U0001e6e3 \u1acf\u1ad0",
]


@pytest.fixture(scope="module")
def qwen35_folder(tmp_path_factory):
    """The Qwen3 tokenizer files with Qwen3.5's split pattern (and tokenizer_class)."""
    folder = tmp_path_factory.mktemp("qwen35")
    with open(os.path.join(ASSETS, "tokenizer.json"), encoding="utf-8") as f:
        data = json.load(f)
    split = data["pre_tokenizer"]["pretokenizers"][0]
    assert split["type"] == "Split"
    split["pattern"] = {"Regex": QWEN35_REGEX}
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    with open(os.path.join(ASSETS, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["tokenizer_class"] = "Qwen3_5Tokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def qwen35(qwen35_folder):
    return Tokenizer.from_pretrained(qwen35_folder)


@pytest.fixture(scope="module")
def qwen35_ref(qwen35_folder):
    return hf_tokenizers.Tokenizer.from_file(str(qwen35_folder / "tokenizer.json"))


def test_qwen35_pattern_is_read_from_tokenizer_json(qwen35, qwen35_ref):
    from tokenizer.pretokenize import QWEN35_PATTERN

    assert qwen35._splitter.pattern == QWEN35_REGEX == QWEN35_PATTERN
    # The two patterns must split this corpus differently, or the tests below prove nothing.
    text = "\n".join(MARK_CORPUS)
    assert qwen35.encode(text) != hf_tokenizers.Tokenizer.from_file(os.path.join(ASSETS, "tokenizer.json")).encode(text).ids


@pytest.mark.parametrize("text", MARK_CORPUS, ids=[f"marks{i}" for i in range(len(MARK_CORPUS))])
def test_qwen35_corpus_matches_reference(qwen35, qwen35_ref, text):
    assert_same_ids_as_composed_and_decomposed(qwen35, qwen35_ref, text)


def test_qwen35_whole_corpus_with_special_tokens(qwen35, qwen35_ref):
    text = "<|im_start|>user\n" + "\n".join(MARK_CORPUS) + "<|im_end|>\u0301\n<think>\u0300</think>"
    ids = qwen35.encode(text)
    assert ids == qwen35_ref.encode(text).ids
    assert qwen35.decode(ids) == qwen35_ref.decode(ids, skip_special_tokens=False)


_MARKED = st.text(
    alphabet=st.one_of(
        st.characters(categories=("L", "M", "N")),
        st.sampled_from(list(" \n\t\r'.!-\u200d\ufe0f\u0301\u0300\u093f\u0e48\u064e")),
        st.characters(blacklist_categories=("Cs",)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_MARKED)
def test_qwen35_random_text_matches_reference(qwen35, qwen35_ref, text):
    assert qwen35.encode(text) == qwen35_ref.encode(text).ids


def _fallback_folder(folder, tokenizer_class):
    # vocab.json + merges.txt + tokenizer_config.json from the Qwen3 files, no tokenizer.json.
    with open(os.path.join(ASSETS, "tokenizer.json"), encoding="utf-8") as f:
        model = json.load(f)["model"]
    (folder / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = "\n".join(" ".join(pair) for pair in model["merges"])
    (folder / "merges.txt").write_text("#version: 0.2\n" + merges + "\n", encoding="utf-8")
    with open(os.path.join(ASSETS, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["tokenizer_class"] = tokenizer_class
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return folder


def test_fallback_for_qwen35_class_uses_qwen35_pattern(tmp_path, qwen35_ref):
    from tokenizer.pretokenize import QWEN35_PATTERN

    tok = Tokenizer.from_pretrained(_fallback_folder(tmp_path, "Qwen3_5Tokenizer"))
    assert tok._splitter.pattern == QWEN35_PATTERN
    for text in MARK_CORPUS + ["<|im_start|>x<|im_end|>\u0301"]:
        assert tok.encode(text) == qwen35_ref.encode(text).ids, text
        nfd = unicodedata.normalize("NFD", text)
        assert tok.encode(nfd) == qwen35_ref.encode(nfd).ids, nfd


@pytest.mark.parametrize("tokenizer_class", ["Qwen2Tokenizer", "Qwen2TokenizerFast", None])
def test_fallback_for_other_classes_keeps_qwen2_pattern(tmp_path, ref, tokenizer_class):
    from tokenizer.pretokenize import QWEN2_PATTERN

    tok = Tokenizer.from_pretrained(_fallback_folder(tmp_path, tokenizer_class))
    assert tok._splitter.pattern == QWEN2_PATTERN
    # NFD text too: transformers' classes normalize with NFC for these folders as well.
    text = "\n".join(MARK_CORPUS)
    for t in (text, unicodedata.normalize("NFD", text)):
        assert tok.encode(t) == ref.encode(t).ids


def test_tokenizer_json_wins_over_tokenizer_class(tmp_path):
    from tokenizer.pretokenize import QWEN2_PATTERN

    shutil.copy(os.path.join(ASSETS, "tokenizer.json"), tmp_path / "tokenizer.json")
    _fallback_folder(tmp_path, "Qwen3_5Tokenizer")
    assert Tokenizer.from_pretrained(tmp_path)._splitter.pattern == QWEN2_PATTERN


@pytest.mark.parametrize("name", ["Qwen2Tokenizer", "Qwen3_5Tokenizer"])
def test_fallback_pipeline_is_what_transformers_builds(name):
    # transformers' classes build their pipeline in __init__ (a stand-in vocab is enough to
    # see it); the fallback must give the same normalizer and pre-tokenizer steps.
    from tokenizer.loading import fallback_pipeline

    module = {"Qwen2Tokenizer": "qwen2.tokenization_qwen2", "Qwen3_5Tokenizer": "qwen3_5.tokenization_qwen3_5"}[name]
    cls = getattr(pytest.importorskip(f"transformers.models.{module}"), name)
    theirs = json.loads(cls().backend_tokenizer.to_str())
    normalizer, pre_tokenizer = fallback_pipeline({"tokenizer_class": name})
    assert normalizer == theirs["normalizer"]
    relevant = ("type", "pattern", "behavior", "invert", "add_prefix_space", "use_regex")
    steps = lambda p: [{k: v for k, v in s.items() if k in relevant} for s in p["pretokenizers"]]  # noqa: E731
    assert steps(pre_tokenizer) == steps(theirs["pre_tokenizer"])
