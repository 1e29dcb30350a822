"""Magpie's Japanese front end (metalgen/magpie/ja_g2p.py): NeMo 3.0.0's JapanesePhonemeTokenizer +
JapaneseKatakanaAccentG2p over pyopenjtalk.

Against the Japanese reference dump (tests/magpie_ref/make_ja_reference.py; skipped without the NeMo venv,
without pyopenjtalk and its dictionary on either side (tests/magpie_ref/setup_ja.sh puts them there), or when
the two sides' pyopenjtalk versions or dictionary files differ): both tokenizers' vocabularies and offsets, and
for every sentence NeMo's G2P output, the symbols it turned into a space, the symbols its tokenizer dropped and
the ids. Without pyopenjtalk (CI): the vocabulary, the refusals, and the G2P over a hand-made NJD list whose
output NeMo's own JapaneseKatakanaAccentG2p gave for the same list."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import types

import pytest

from magpie_ref.harness import assert_encoding_matches, assert_tokenizers_match, nemo_config
from metalgen.errors import MetalgenError
from metalgen.magpie import ja_g2p
from metalgen.magpie.text import MagpieText

TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."
JA_G2P = "nemo.collections.tts.g2p.models.ja_jp_ipa.JapaneseKatakanaAccentG2p"
PUBLISHED = {"_target_": TT + "JapanesePhonemeTokenizer", "punct": True, "apostrophe": False, "pad_with_space": True,
             "g2p": {"_target_": JA_G2P, "ascii_letter_prefix": "", "ascii_letter_case": "upper"}}


def _our_dictionary():
    """(pyopenjtalk's version, the SHA-256 of its dictionary files) here, or the test skipped saying what is missing."""
    import importlib.metadata as md

    try:
        import pyopenjtalk
    except ImportError:
        pytest.skip("pyopenjtalk is not installed here (pip install 'metalgen[ja]'; bash tests/magpie_ref/setup_ja.sh python)")
    folder = pyopenjtalk.OPEN_JTALK_DICT_DIR.decode("utf-8")
    if not os.path.isfile(os.path.join(folder, "sys.dic")):
        pytest.skip(f"pyopenjtalk's dictionary is not at {folder} (bash tests/magpie_ref/setup_ja.sh python)")
    digest = {f: hashlib.sha256(open(os.path.join(folder, f), "rb").read()).hexdigest()
              for f in ("sys.dic", "matrix.bin", "char.bin", "unk.dic")}
    return md.version("pyopenjtalk"), digest


@pytest.fixture(scope="module")
def dump():
    from magpie_ref.harness import ja_reference_folder

    version, digest = _our_dictionary()
    folder = ja_reference_folder()
    ref = json.loads((folder / "ja.json").read_text())
    if ref["versions"]["pyopenjtalk"] != version or ref["dictionary"] != digest:
        pytest.skip("the NeMo venv's pyopenjtalk or dictionary differs from this environment's")
    text = MagpieText.from_config(nemo_config(folder / "ja.nemo"), nemo_path=folder / "ja.nemo")
    return ref, text


def test_vocabularies_and_offsets_match_nemo(dump):
    assert_tokenizers_match(*dump)


def test_every_sentence_matches_nemo(dump):
    ref, text = dump
    lang = {"japanese_phoneme": "ja", "japanese_plain": "ja_plain"}
    clean = {}
    for name, entries in ref["sentences"].items():
        tok, offset = text.tokenizers[name], text.offsets[name]
        clean[name] = 0
        for s in entries:
            where = f"{name}: {s['text']!r}"
            symbols, spaced = tok.g2p(s["text"])
            assert symbols == s["g2p"], where
            assert spaced == s["spaced"], where
            kept, bad = tok.symbols(s["text"])
            assert [tok.ids[k] + offset for k in kept] == s["ids"], where
            assert bad == list(dict.fromkeys(s["dropped"])), where
            clean[name] += assert_encoding_matches(text, s["text"], name, lang[name], s["ids"], bool(bad))
    assert len(ref["sentences"]["japanese_phoneme"]) == 46
    assert clean == {"japanese_phoneme": 45, "japanese_plain": 33}


# ------------------------------------------------------------------------------ without pyopenjtalk

# A hand-made run_frontend result: full-width letters read (フィラー), an accent chain over a particle, spaces of
# both widths, a chain with a word that has no pronunciation inside it, symbols outside the ja-JP list, an
# アルファベット symbol (read, not spelled), a katakana outside NeMo's set (ヰ), an ellipsis NFKC makes `...`,
# an accent past the last mora, lower-case letters (not spelled in the upper case), a nakadaka word.
NJD = [
    ("ＡＢＣ", "フィラー", "*", "エービーシー", 0, 6, -1),
    ("橋", "名詞", "一般", "ハシ", 2, 2, 0),
    ("を", "助詞", "格助詞", "ヲ", 0, 1, 1),
    ("\u3000", "記号", "空白", "", 0, 0, 0),
    (" ", "記号", "空白", "", 0, 0, 0),
    ("手", "名詞", "一般", "テ", 1, 1, 0),
    ("紙", "名詞", "一般", "ガミ", 0, 2, 1),
    ("★", "名詞", "一般", "", 0, 0, 1),
    ("キャッチ", "名詞", "一般", "キャッチ", 1, 3, 1),
    ("＠", "記号", "一般", "、", 0, 0, 0),
    ("#", "記号", "一般", "、", 0, 0, 0),
    ("ｘ", "記号", "アルファベット", "エックス", 1, 3, -1),
    ("ヰ", "フィラー", "*", "ヰ", 1, 1, -1),
    ("…", "記号", "一般", "…", 0, 0, 0),
    ("「", "記号", "括弧開", "「", 0, 0, 0),
    ("ヴァイオリン", "名詞", "一般", "ヴァイオリン", 9, 5, 0),
    ("ｈｉ", "フィラー", "*", "ハイ", 1, 2, 0),
    ("ＨＩ", "フィラー", "*", "ハイ", 1, 2, 0),
    ("日本", "名詞", "固有名詞", "ニッポン", 3, 4, 0),
    ("」", "記号", "括弧閉", "」", 0, 0, 0),
]
# NeMo 3.0.0's JapaneseKatakanaAccentG2p(ascii_letter_case="upper") on NJD (its run_frontend replaced).
NJD_G2P = "ABC0ハ1シ0ヲ 1テ0ガ0ミ0キャ0ッ0チ 1エ0ッ0ク0ス1ヰ 「0ヴァ1イ1オ1リ1ン1ハ0イHI0ニ1ッ1ポ0ン」"


def _split(g2p: str):
    """NJD_G2P as the G2P's list: one item per character."""
    return list(g2p)


@pytest.fixture
def fake_frontend(monkeypatch):
    keys = ("string", "pos", "pos_group1", "pron", "acc", "mora_size", "chain_flag")
    words = [dict(zip(keys, row)) for row in NJD]
    monkeypatch.setattr(ja_g2p, "_FRONTEND", lambda text: words)


def test_published_vocabulary_without_pyopenjtalk():
    tok = ja_g2p.build_japanese_tokenizer("japanese_phoneme", PUBLISHED)
    assert len(tok.tokens) == 175 and tok.tokens[:3] == [" ", "0", "1"]
    assert tok.tokens[-2:] == ["<pad>", "<oov>"] and tok.pad_id == 173
    assert tok.tokens[88:114] == list("ABCDEFGHIJKLMNOPQRSTUVWXYZ") and "'" not in tok.tokens
    assert len(ja_g2p.JA_PUNCT) == 59 and "・・・" in ja_g2p.JA_PUNCT
    assert tok.ids["ー"] == tok.tokens.index("ー", 100)  # the mark's id, not the katakana's


def test_g2p_matches_nemo_on_a_hand_made_frontend(fake_frontend):
    tok = ja_g2p.build_japanese_tokenizer("japanese_phoneme", PUBLISHED)
    symbols, spaced = tok.g2p("ignored")
    assert symbols == _split(NJD_G2P)
    assert spaced == ["★", "@", "#", "..."]
    kept, bad = tok.symbols("ignored")
    assert bad == ["ヰ"] and kept[0] == kept[-1] == " " and "ヰ" not in kept
    with pytest.raises(MetalgenError, match=r"^the Magpie tokenizer 'japanese_phoneme' cannot map 1 character: 'ヰ'"):
        tok.encode("ignored")


def test_pitch_patterns():
    assert ja_g2p.pitch_pattern(0, 4) == [0, 1, 1, 1]
    assert ja_g2p.pitch_pattern(1, 1) == [1] and ja_g2p.pitch_pattern(1, 3) == [1, 0, 0]
    assert ja_g2p.pitch_pattern(3, 4) == [0, 1, 1, 0] and ja_g2p.pitch_pattern(4, 4) == [0, 1, 1, 1]
    assert ja_g2p.pitch_pattern(2, 0) == []
    assert ja_g2p.split_morae("キャッチー・ヴァ") == ["キャ", "ッ", "チ", "ー", "ヴァ"]


def test_refusals(monkeypatch, tmp_path):
    with pytest.raises(MetalgenError, match="over JapaneseG2p .* is not supported"):
        ja_g2p.build_japanese_tokenizer("ja", {**PUBLISHED, "g2p": {"_target_": "x.JapaneseG2p"}})
    with pytest.raises(MetalgenError, match="punct: false is not supported"):
        ja_g2p.build_japanese_tokenizer("ja", {**PUBLISHED, "punct": False})
    with pytest.raises(MetalgenError, match="arguments it does not take: g2p.phoneme_dict"):
        ja_g2p.build_japanese_tokenizer("ja", {**PUBLISHED, "g2p": {**PUBLISHED["g2p"], "phoneme_dict": "x"}})
    tok = ja_g2p.build_japanese_tokenizer("japanese_phoneme", PUBLISHED)
    monkeypatch.setattr(ja_g2p, "_FRONTEND", None)
    monkeypatch.setitem(sys.modules, "pyopenjtalk", None)
    with pytest.raises(MetalgenError, match=r"needs pyopenjtalk, which is not installed .*metalgen\[ja\]"):
        tok.encode("こんにちは")
    fake = types.SimpleNamespace(OPEN_JTALK_DICT_DIR=str(tmp_path).encode(), run_frontend=lambda t: [])
    monkeypatch.setitem(sys.modules, "pyopenjtalk", fake)
    with pytest.raises(MetalgenError, match="needs pyopenjtalk's dictionary open_jtalk_dic_utf_8-1.11, which is not at"):
        tok.encode("こんにちは")


def test_magpie_text_builds_japanese_and_keeps_later_offsets():
    eng = {"_target_": TT + "EnglishCharsTokenizer", "punct": True, "apostrophe": True, "pad_with_space": False}
    cfg = {"text_tokenizers": {"japanese_phoneme": PUBLISHED, "english": eng}}
    text = MagpieText.from_config(cfg)
    assert not text.unavailable and text.offsets == {"japanese_phoneme": 0, "english": 175}
    assert text.encode("hi", "en")[:2] == [175 + 8, 175 + 9]
    # Without its G2P (as metalgen's dummy checkpoint) the entry cannot be built: its size stays unknown.
    text = MagpieText.from_config({"text_tokenizers": {"english": eng, "japanese_phoneme": {"_target_": PUBLISHED["_target_"]}}})
    with pytest.raises(MetalgenError, match="^Magpie language 'ja': its tokenizer 'japanese_phoneme' cannot be built"):
        text.encode("こんにちは", "ja")
