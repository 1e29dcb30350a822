"""Magpie's Mandarin front end (metalgen/magpie/zh_g2p.py): NeMo 3.0.0's ChinesePhonemesTokenizer + ChineseG2p.

Against the Mandarin reference dump (tests/magpie_ref/make_zh_reference.py, skipped without the NeMo venv, or
when its jieba/pypinyin/pypinyin-dict versions differ from ours): both tokenizers' vocabularies and offsets,
and for every sentence NeMo's G2P output, the syllables it skips, the symbols it drops and the ids. Without the
dump: a tiny dictionary whose expected ids were worked out by hand from NeMo's rules (and checked once against
NeMo's own tokenizer), so CI exercises the code (it needs the `zh` extra, which the `test` extra includes)."""

from __future__ import annotations

import json

import pytest

from magpie_ref.harness import assert_encoding_matches, assert_tokenizers_match, nemo_config, write_nemo_files
from metalgen.errors import MetalgenError
from metalgen.magpie.text import MagpieText

TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."
ZH_G2P = "nemo.collections.tts.g2p.models.zh_cn_pinyin.ChineseG2p"


@pytest.fixture(scope="module")
def dump():
    import importlib.metadata as md

    from magpie_ref.harness import zh_reference_folder

    pytest.importorskip("jieba")
    pytest.importorskip("pypinyin")
    pytest.importorskip("pypinyin_dict")
    folder = zh_reference_folder()
    ref = json.loads((folder / "zh.json").read_text())
    ours = {p: md.version(p) for p in ref["versions"]}
    if ours != ref["versions"]:
        pytest.skip(f"the NeMo venv has {ref['versions']}, this environment {ours}: their data differ")
    text = MagpieText.from_config(nemo_config(folder / "zh.nemo"), nemo_path=folder / "zh.nemo")
    return ref, text


def test_vocabularies_and_offsets_match_nemo(dump):
    assert_tokenizers_match(*dump)


def test_every_sentence_matches_nemo(dump):
    ref, text = dump
    lang = {"mandarin_phoneme": "zh", "mandarin_plain": "zh_plain"}
    clean = 0
    for name, entries in ref["sentences"].items():
        tok, offset = text.tokenizers[name], text.offsets[name]
        for s in entries:
            where = f"{name}: {s['text']!r}"
            symbols, skipped = tok.g2p(s["text"])
            assert symbols == s["g2p"], where
            assert [item[:-1] for item in skipped] == s["skipped"], where
            kept, bad = tok.symbols(s["text"])
            assert [tok.ids[k] + offset for k in kept] == s["ids"], where
            assert set(s["dropped"]) <= set(bad) and bool(bad) == bool(s["dropped"] or s["skipped"]), where
            clean += assert_encoding_matches(text, s["text"], name, lang[name], s["ids"], bool(bad))
    assert clean == 30


# ----------------------------------------------------------------------------- no dump needed

# The reference's format in miniature: a comment, an upper-case syllable, a repeated syllable (the later
# line wins), a third tab field (ignored).
TINY = ";;; tiny\nni\tn i\nHAO\tx au\nhao\tx ɑu\nshi\tʂ ʐ̩\textra\njie\ttɕ ie\nyin\ti n\nhang\tx aŋ\n" \
       "xing\tɕ iŋ\nzhang\tʈʂ aŋ\n"


def _nemo(tmp_path, files):
    return write_nemo_files(tmp_path / "zh.nemo", files)


def _cfg(**g2p):
    g = {"_target_": ZH_G2P, "phoneme_dict": "nemo:00ab_ipa_dict.txt", "word_segmenter": "jieba",
         "phoneme_prefix": "", "phoneme_case": "lower", "tone_prefix": "#", "ascii_letter_prefix": "",
         "ascii_letter_case": "upper", **g2p}
    return {"text_tokenizers": {
        "english": {"_target_": TT + "EnglishCharsTokenizer"},
        "mandarin_phoneme": {"_target_": TT + "ChinesePhonemesTokenizer", "punct": True, "apostrophe": True,
                             "pad_with_space": True, "g2p": g},
    }}


def test_vocabulary_without_jieba(tmp_path):
    text = MagpieText.from_config(_cfg(), nemo_path=_nemo(tmp_path, {"00ab_ipa_dict.txt": TINY}))
    tok = text.tokenizers["mandarin_phoneme"]
    # the phonemes, sorted by code point (hao's later line replaced x au by x ɑu)
    assert tok.tokens[:13] == [" ", "aŋ", "i", "ie", "iŋ", "n", "tɕ", "x", "ɑu", "ɕ", "ʂ", "ʈʂ", "ʐ̩"]
    assert tok.tokens[13:18] == ["#1", "#2", "#3", "#4", "#5"]
    assert tok.tokens[18:44] == list("ABCDEFGHIJKLMNOPQRSTUVWXYZ") and tok.tokens[44] == "'"
    assert tok.tokens[45:49] == list("，。？！") and tok.tokens[-2:] == ["<pad>", "<oov>"]
    assert len(tok.tokens) == 1 + 12 + 5 + 26 + 1 + 34 + 2
    assert text.offsets["mandarin_phoneme"] == 45 and text.text_bos_id == 45 + 81


def test_tiny_dictionary_ids(tmp_path):
    pytest.importorskip("jieba")
    pytest.importorskip("pypinyin")
    pytest.importorskip("pypinyin_dict")
    text = MagpieText.from_config(_cfg(), nemo_path=_nemo(tmp_path, {"00ab_ipa_dict.txt": TINY}))
    tok = text.tokenizers["mandarin_phoneme"]
    # tokens: ' ' 0; aŋ 1, i 2, ie 3, iŋ 4, n 5, tɕ 6, x 7, ɑu 8, ɕ 9, ʂ 10, ʈʂ 11, ʐ̩ 12; #1-#5 13-17;
    # A-Z 18-43; ' 44; ， 45 。 46 ？ 47 ！ 48 ... , 64 . 65 ...; <pad> 79, <oov> 80
    # 你好，世界！ -> ni3 hao3 ， shi4 jie4 ！, padded with spaces (checked against NeMo: these ids + 45).
    assert tok.encode("你好，世界！") == [0, 5, 2, 15, 7, 8, 15, 45, 10, 12, 16, 6, 3, 16, 48, 0]
    # jieba keeps 银行 and 行长 together, so 行 is hang2 then zhang3 (without it pypinyin reads xing2 zhang3):
    # 银行行长 -> yin2 hang2 hang2 zhang3; English letters upper-cased; spaces collapse; the apostrophe stays.
    assert "".join(tok.symbols("银行行长")[0]) == " in#2xaŋ#2xaŋ#2ʈʂaŋ#3 "
    assert tok.symbols("  Hi  it's, ni. ")[0] == [" ", "H", "I", " ", "I", "T", "'", "S", ",", " ", "N", "I", ".", " "]
    ids = text.encode("你好", "zh")
    assert ids == [45 + i for i in (0, 5, 2, 15, 7, 8, 15, 0)] + [text.text_eos_id]
    # A syllable missing from the dictionary (NeMo skips it) and digits (a lone "2" is the empty syllable with
    # tone 2; "0" is no symbol of the vocabulary): named in one line.
    with pytest.raises(MetalgenError) as e:
        text.encode("中国有20个~", "zh")
    msg = str(e.value)
    assert "'mandarin_phoneme' cannot map" in msg and "'zhong1'" in msg and "'guo2'" in msg and "'you3'" in msg
    assert "'2'" in msg and "'0'" in msg and "'~'" in msg and "\n" not in msg


def test_without_jieba_encoding_names_the_extra(tmp_path, monkeypatch):
    import sys

    from metalgen.magpie import zh_g2p

    monkeypatch.setattr(zh_g2p, "_BACKEND", None)
    monkeypatch.setitem(sys.modules, "jieba", None)  # an import of it fails
    text = MagpieText.from_config(_cfg(), nemo_path=_nemo(tmp_path, {"00ab_ipa_dict.txt": TINY}))
    with pytest.raises(MetalgenError, match=r"^the Magpie tokenizer 'mandarin_phoneme' \(Mandarin\) needs jieba, "
                                            r"pypinyin and pypinyin-dict, .*: pip install 'metalgen\[zh\]'$"):
        text.encode("你好", "zh")
    assert text.encode("hi", "en")  # the other languages are untouched


def test_config_checks(tmp_path):
    nemo = _nemo(tmp_path, {"00ab_ipa_dict.txt": TINY, "00cd_bad.txt": "ni n i\n"})
    text = MagpieText.from_config(_cfg(word_segmenter="pkuseg"), nemo_path=nemo)
    with pytest.raises(MetalgenError, match="word_segmenter 'pkuseg' is not supported"):
        text.encode("你好", "zh")
    text = MagpieText.from_config(_cfg(phoneme_dict="nemo:00cd_bad.txt"), nemo_path=nemo)
    with pytest.raises(MetalgenError, match="line 1 .*has no tab-separated pronunciation"):
        text.encode("你好", "zh")
    text = MagpieText.from_config(_cfg(phoneme_dict="nemo:gone.txt"), nemo_path=nemo)
    with pytest.raises(MetalgenError, match="nemo:gone.txt is not found"):
        text.encode("你好", "zh")
    cfg = _cfg(bogus=1)
    text = MagpieText.from_config(cfg, nemo_path=nemo)
    with pytest.raises(MetalgenError, match="does not take: g2p.bogus"):
        text.encode("你好", "zh")
