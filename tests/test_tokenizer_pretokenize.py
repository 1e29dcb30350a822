"""Normalization, the split pattern and the byte alphabet agree with the reference's pieces."""

from __future__ import annotations

import os
import random
import unicodedata

import pytest
import regex

from conftest import ASSET_TOKENIZER
from tokenizer._unicode_tables import MARK_RANGES, RECENT_MARK_RANGES
from tokenizer.pretokenize import (
    BYTE_TO_CHAR,
    CHAR_TO_BYTE,
    QWEN2_PATTERN,
    QWEN35_PATTERN,
    Splitter,
    _barrier_regex,
    disagreeing_characters,
    make_normalizer,
    pin_unicode_classes,
    split_pattern,
)

hf_tokenizers = pytest.importorskip("tokenizers")

ASSETS = str(ASSET_TOKENIZER)


@pytest.fixture(scope="module")
def ref():
    return hf_tokenizers.Tokenizer.from_file(os.path.join(ASSETS, "tokenizer.json"))


def test_byte_alphabet_is_a_bijection_of_printable_characters():
    assert len(set(BYTE_TO_CHAR)) == 256
    assert all(CHAR_TO_BYTE[c] == b for b, c in enumerate(BYTE_TO_CHAR))
    assert BYTE_TO_CHAR[ord(" ")] == "Ġ" and BYTE_TO_CHAR[ord("\n")] == "Ċ" and BYTE_TO_CHAR[ord("a")] == "a"
    assert all(not c.isspace() for c in BYTE_TO_CHAR)


def test_pattern_is_read_from_tokenizer_json(ref):
    import json

    with open(os.path.join(ASSETS, "tokenizer.json"), encoding="utf-8") as f:
        config = json.load(f)["pre_tokenizer"]
    assert split_pattern(config) == QWEN2_PATTERN
    assert split_pattern(None) == QWEN2_PATTERN


def _ref_pieces(ref, text):
    # The reference's pre-tokens, mapped back from the byte alphabet to text.
    return [bytes(CHAR_TO_BYTE[c] for c in piece).decode("utf-8", "replace") for piece, _ in ref.pre_tokenizer.pre_tokenize_str(text)]


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world! DON'T We'LL it's",
        "  leading\tand trailing  \n\n  ",
        "x = foo(bar[1], 'baz')  # 123",
        "中文，日本語。한국어!",
        "a\u0301 e\u0301",
        "\U000323b0x'D \u088fy 1\U00011de0 2",  # Unicode 17.0 letters and digits: not letters for the reference
    ],
)
def test_split_matches_reference(ref, text):
    assert Splitter(QWEN2_PATTERN).split(text) == _ref_pieces(ref, text)


def test_pinned_classes_agree_with_reference_on_sampled_code_points(ref):
    # The fixed Unicode 16.0 classes against the reference, on a sample of every plane in use.
    rng = random.Random(0)
    pinned = regex.compile(pin_unicode_classes(r"\p{L}|\p{N}"))
    letters_and_digits = regex.compile(pin_unicode_classes(r"\p{L}"))
    cps = [rng.randrange(0, 0x32000) for _ in range(3000)] + list(range(0x323A0, 0x323C0))
    for cp in cps:
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        if c in "\r\n":
            continue
        ref_is_letter = len(ref.pre_tokenizer.pre_tokenize_str("a" + c + "a")) == 1
        assert bool(letters_and_digits.fullmatch(c)) == ref_is_letter, hex(cp)
        if not ref_is_letter:
            ref_is_digit = len(ref.pre_tokenizer.pre_tokenize_str("a" + c + "a")) == 3 and not c.isspace()
            assert bool(pinned.fullmatch(c)) == ref_is_digit, hex(cp)


def test_disagreeing_characters_are_only_recent_ones():
    body = disagreeing_characters()
    if body:
        odd = regex.compile(f"[{body}]")
        common = "".join(chr(c) for c in [*range(0x20, 0x800), *range(0x3000, 0xA000), *range(0xAC00, 0xD7A4)])
        assert not odd.search(common)


def test_disagreeing_characters_follow_the_classes_asked_for():
    # U+1ACF is a mark from Unicode 17.0 (unassigned for the reference): a disagreement about
    # \p{M} only, so it sends a Qwen3.5 split down the pinned path and leaves Qwen2's alone.
    if not regex.match(r"\p{M}", "\u1acf"):
        pytest.skip("this regex module predates Unicode 17.0")
    assert regex.match(f"[{disagreeing_characters('M')}]", "\u1acf")
    assert regex.match(f"[{disagreeing_characters()}]", "\u1acf")
    assert not regex.match(f"[{disagreeing_characters('LN')}]", "\u1acf")
    assert Splitter(QWEN35_PATTERN)._odd.match("\u1acf")
    assert not Splitter(QWEN2_PATTERN)._odd.match("\u1acf")


def test_pin_rewrites_inside_and_outside_classes():
    out = pin_unicode_classes(r"[^\r\n\p{L}\p{N}]?\p{L}+|\P{N}|\\p{L}")
    assert r"\p{" not in out.replace(r"\\p{L}", "")
    assert out.endswith(r"|\\p{L}")  # an escaped backslash followed by text is left alone
    assert regex.compile(out).match("Abc")


def test_pin_rewrites_mark_classes():
    word = regex.compile(pin_unicode_classes(r"[\p{L}\p{M}]+"))
    other = regex.compile(pin_unicode_classes(r"[^\s\p{L}\p{M}\p{N}]+"))
    mark = regex.compile(pin_unicode_classes(r"\p{M}|\pM"))
    not_mark = regex.compile(pin_unicode_classes(r"\P{M}"))
    pinned = pin_unicode_classes(QWEN35_PATTERN)
    assert r"\p{" not in pinned and r"\P{" not in pinned
    assert word.fullmatch("cafe\u0301\u0897") and not word.search("1 !")
    assert other.fullmatch("!?\u1acf") and not other.search("a\u0301 1")
    assert mark.fullmatch("\u0301") and not mark.match("a") and not mark.match("\u1acf")
    assert not_mark.fullmatch("\u1acf") and not not_mark.match("\u0301")


def _reference_members(pattern: str, cps: list[int]) -> list[int]:
    # tokenizers' "removed" Split hands back the text between matches, with character
    # offsets: the code points it leaves out are the ones the (one-character) pattern matches.
    split = hf_tokenizers.pre_tokenizers.Split(hf_tokenizers.Regex(pattern), "removed")
    kept: set[int] = set()
    for _, (a, b) in split.pre_tokenize_str("".join(map(chr, cps))):
        kept.update(range(a, b))
    return [cp for i, cp in enumerate(cps) if i not in kept]


def _mark_sample() -> list[int]:
    # Both edges of every mark range and the code points just outside them (an off-by-one
    # anywhere in the table shows), every mark assigned after Unicode 14.0 with its
    # neighbours (where the regex module's own \p{M} may differ), and a sample of all planes.
    rng = random.Random(0)
    cps = {c for a, b in MARK_RANGES for c in (a - 1, a, b, b + 1)}
    cps |= {c for a, b in RECENT_MARK_RANGES for c in range(a - 1, b + 2)}
    cps |= {rng.randrange(0x110000) for _ in range(4000)}
    return sorted(c for c in cps if 0 <= c < 0x110000 and not 0xD800 <= c <= 0xDFFF)


def test_pinned_marks_agree_with_reference_on_sampled_code_points():
    cps = _mark_sample()
    text = "".join(map(chr, cps))
    ours = [ord(c) for c in regex.findall(pin_unicode_classes(r"\p{M}"), text)]
    assert ours == _reference_members(r"\p{M}", cps)
    assert len(ours) >= len(MARK_RANGES)  # every range is sampled
    # Where the regex module is newer than the reference, the sample holds characters its own
    # \p{M} gets wrong, so the pinned table is what makes this test pass.
    odd = disagreeing_characters("M")
    if odd:
        assert regex.search(f"[{odd}]", text)


@pytest.fixture(scope="module")
def qwen35_split():
    return hf_tokenizers.pre_tokenizers.Split(hf_tokenizers.Regex(QWEN35_PATTERN), "isolated")


def _pieces(split, text):
    return [piece for piece, _ in split.pre_tokenize_str(text)]


@pytest.mark.parametrize(
    "text",
    [
        "हिन्दी पाठ। क्षत्रिय ज्ञान",
        "ภาษาไทยที่ น้ำ ผู้หญิง",
        "بِسْمِ اللَّهِ الرَّحْمَٰنِ ١٢٣",
        "Tie\u0302\u0301ng Vie\u0323\u0302t, cafe\u0301 q\u0307 a\u0361b",
        "בְּרֵאשִׁית בָּרָא",
        "❤️ 👨‍👩‍👧‍👦 🏳️‍🌈 #️⃣ 1️⃣ x\ufe0e",
        "\u0301abc !\u0301 ?\u0300\u0300 1\u0301 \n\u0301 '\u0301s e\u0301's DON'T",
        "  \n\n\t x \r\n  \u0300 ",
        "a\u0897b x\u1acfy z\U00011b60w \U0001e6e3 \u1acf\u1ad0 x\U000323b0y",  # 16.0 and 17.0 characters
    ],
)
def test_qwen35_split_matches_reference(qwen35_split, text):
    expected = _pieces(qwen35_split, text)
    assert Splitter(QWEN35_PATTERN).split(text) == expected
    # The pinned pattern alone (the Splitter takes it only for text with odd characters).
    assert regex.findall(pin_unicode_classes(QWEN35_PATTERN), text) == expected


@pytest.mark.parametrize("context", ["a{}a ", " {}{}\n", "'{}s", "1{}\u0301", "x{}!"])
def test_qwen35_split_matches_reference_around_sampled_code_points(qwen35_split, context):
    # Each sampled character in a context where its class decides the split.
    text = "".join(context.replace("{}", chr(cp)) for cp in _mark_sample())
    assert Splitter(QWEN35_PATTERN).split(text) == _pieces(qwen35_split, text)


def test_normalizer_matches_reference_nfc():
    nfc = make_normalizer({"type": "NFC"})
    ref_nfc = hf_tokenizers.normalizers.NFC()
    samples = [
        "cafe\u0301",
        "A\u030a\u0323",
        "\u1100\u1161\u11a8",
        "a\u0315\u1df9",  # U+1DF9: combining class 220, unknown to the reference's tables
        "a\U00016ff0\u0316",
        "\U00011935\U00011930",  # composes in Unicode 13.0, not for the reference
        "x\u0358\u1715",
    ]
    for s in samples:
        assert nfc(s) == ref_nfc.normalize_str(s), [hex(ord(c)) for c in s]
    assert nfc("cafe\u0301") == unicodedata.normalize("NFC", "cafe\u0301")
    assert _barrier_regex().search("a\u1df9") and not _barrier_regex().search("cafe\u0301")


def test_normalizer_sequences_and_unsupported():
    from tokenizer import TokenizerError

    assert make_normalizer(None) is None
    assert make_normalizer({"type": "Sequence", "normalizers": []}) is None
    both = make_normalizer({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFC"}]})
    assert both("e\u0301") == "\u00e9"
    with pytest.raises(TokenizerError, match="unsupported normalizer type 'Lowercase'"):
        make_normalizer({"type": "Lowercase"})
