"""Added tokens: matched before splitting, leftmost-longest, with tokenizers' flag semantics."""

from __future__ import annotations

import json

import pytest

from tokenizer import AddedToken, Tokenizer
from tokenizer.added_tokens import AddedVocabulary
from tokenizer.pretokenize import BYTE_TO_CHAR

hf_tokenizers = pytest.importorskip("tokenizers")


def _entry(tid, content, special=True, **flags):
    base = {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": special}
    base.update(flags)
    return base


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same small tokenizer with flagged added tokens, loaded by us and by tokenizers."""
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    merges = [("Ġ", "x"), ("a", "b")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    n = len(vocab)
    added = [
        _entry(n, "<s>"),
        _entry(n + 1, "<s>long"),  # longest match wins over "<s>"
        _entry(n + 2, "[L]", lstrip=True),
        _entry(n + 3, "[R]", rstrip=True),
        _entry(n + 4, "[LR]", lstrip=True, rstrip=True),
        _entry(n + 5, "word", single_word=True, special=False),
        _entry(n + 6, "caf\u00e9", special=False, normalized=True),  # matched after NFC
        _entry(n + 7, "<think>", special=False),
    ]
    data = {
        "version": "1.0",
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    folder = tmp_path_factory.mktemp("added")
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    return Tokenizer.from_pretrained(folder), hf_tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.mark.parametrize(
    "text",
    [
        "a<s>b<s>long<s>lon",
        "x   [L]   y",
        "x   [R]   y",
        "x \t [LR] \n y[LR][LR]  [LR]",
        "[L][L]  [L]",
        "a word b sword words _word word",
        "word",
        "cafe\u0301 caf\u00e9 xcafe\u0301y",
        "<think>\n</think><think>",
        "no added tokens at all",
        "",
    ],
)
def test_flags_match_reference(pair, text):
    ours, ref = pair
    assert ours.encode(text) == ref.encode(text).ids


def test_decode_skips_only_special_added_tokens(pair):
    ours, ref = pair
    ids = ours.encode("a<s>b word <think>")
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    assert "<think>" in ours.decode(ids, skip_special_tokens=True)


def test_split_returns_text_and_ids():
    vocab = AddedVocabulary([AddedToken(10, "<a>", special=True), AddedToken(11, "<b>")], None)
    assert vocab.split("x<a>y<b><a>") == ["x", 10, "y", 11, 10]
    assert vocab.split("x<a>y", split_special_tokens=True) == ["x<a>y"]
    assert vocab.special_ids == frozenset({10})
