"""The streaming detokenizer: whole characters only, and the same text as decode()."""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenizer import StreamingDetokenizer, Tokenizer, TokenizerError

from conftest import ASSET_TOKENIZER

ASSETS = str(ASSET_TOKENIZER)


@pytest.fixture
def tok(ours) -> Tokenizer:
    return ours


def _stream(tok, ids, **kw):
    detok = tok.detokenizer(**kw)
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.finalize())
    return pieces


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "emoji 👨‍👩‍👧‍👦 and 👍🏽 and 🇫🇷 split over byte tokens",
        "中文测试，罕见字：龘齉𪚥 𠀀",
        "<|im_start|>user\n天気は？<|im_end|><think>x</think>",
        "mixed ß é ñ ø Ω 🙂",
    ],
)
def test_stream_equals_decode_without_replacement_chars(tok, text):
    ids = tok.encode(text)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_multibyte_character_is_held_until_complete(tok):
    ids = tok.encode("𪚥")  # a rare CJK character: four bytes, several byte-level tokens
    assert len(ids) > 1
    detok = tok.detokenizer()
    out = [detok.add(i) for i in ids]
    assert out[:-1] == [""] * (len(ids) - 1)
    assert out[-1] == "𪚥"
    assert detok.finalize() == ""


def test_incomplete_tail_is_flushed_as_replacement(tok):
    ids = tok.encode("a𪚥")
    cut = ids[:-1]  # drop the token that completes the character
    pieces = _stream(tok, cut)
    assert "".join(pieces) == tok.decode(cut)
    assert pieces[-1].endswith("\ufffd")


def test_skip_special_tokens(tok):
    ids = tok.encode("<|im_start|>hi<|im_end|><think>")
    assert "".join(_stream(tok, ids, skip_special_tokens=True)) == tok.decode(ids, skip_special_tokens=True) == "hi<think>"


def test_reuse_after_finalize_and_add_many(tok):
    detok = tok.detokenizer()
    assert isinstance(detok, StreamingDetokenizer)
    ids = tok.encode("first 🙂")
    assert detok.add_many(ids) + detok.finalize() == "first 🙂"
    assert detok.add_many(tok.encode("second")) + detok.finalize() == "second"


def test_out_of_range_id(tok):
    detok = tok.detokenizer()
    with pytest.raises(TokenizerError, match=f"token id 999999 is out of range for vocab size {tok.vocab_size}"):
        detok.add(999999)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(st.integers(min_value=0, max_value=151668), max_size=30))
def test_random_id_streams_equal_decode(tok, ids):
    # Arbitrary ids make invalid UTF-8 too: the stream must still add up to decode().
    assert "".join(_stream(tok, ids)) == tok.decode(ids)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_random_text_streams_without_replacement(tok, text):
    ids = tok.encode(text)
    pieces = _stream(tok, ids)
    assert "".join(pieces) == tok.decode(ids)
    if "\ufffd" not in text:
        assert all("\ufffd" not in p for p in pieces)
