"""Magpie phoneme front ends (metalgen/magpie/g2p.py, ipa_tokenizer.py, text.py): NeMo 3.0.0's
IPATokenizer + IpaG2p with phoneme probability 1.0.

Against the G2P reference dump (tests/magpie_ref/make_g2p_reference.py, skipped without the NeMo venv):
every vocabulary, offset and pad id, and for every sentence NeMo's G2P output, the symbols NeMo drops
and the aggregated ids, read through the tiny `.nemo`'s `nemo:` artifacts. Without the dump: the G2P
rules on small inline dictionaries, so CI still checks them."""

from __future__ import annotations

import json

import pytest

from magpie_ref.harness import assert_tokenizers_match, g2p_reference_folder, nemo_config, write_nemo_files
from metalgen.errors import MetalgenError
from metalgen.magpie.g2p import IpaG2p, parse_dictionary, split_words
from metalgen.magpie.text import MagpieText

TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."
G2P = "nemo.collections.tts.g2p.models.i18n_ipa.IpaG2p"


@pytest.fixture(scope="module")
def dump():
    folder = g2p_reference_folder()
    ref = json.loads((folder / "g2p.json").read_text())
    # No text_vocab_size: every size, Mandarin's included, must come from the tokenizers themselves.
    text = MagpieText.from_config(nemo_config(folder / "g2p.nemo"), nemo_path=folder / "g2p.nemo")
    return ref, text


def test_vocabularies_offsets_and_specials(dump):
    # The dump's NeMo builds Mandarin with stand-in segmenters (its vocabulary needs only the dictionary);
    # metalgen builds it too (tests/test_magpie_zh.py checks its encoding against NeMo with jieba and pypinyin).
    assert_tokenizers_match(*dump)


def test_mandarin_vocabulary(dump):
    from metalgen.magpie.ipa_tokenizer import NemoArtifacts
    from metalgen.magpie.zh_g2p import mandarin_tokens

    ref, text = dump
    folder = g2p_reference_folder()
    cfg = nemo_config(folder / "g2p.nemo")
    tokens = mandarin_tokens(cfg["text_tokenizers"]["mandarin_phoneme"], NemoArtifacts(folder / "g2p.nemo").read_text)
    assert tokens == ref["tokens"]["mandarin_phoneme"]
    assert text.tokenizer_name("zh") == "mandarin_phoneme" and "mandarin_phoneme" in text.tokenizers


def test_every_sentence_matches_nemo(dump):
    ref, text = dump
    checked = 0
    for lang, entry in ref["languages"].items():
        name = entry["tokenizer"]
        assert text.tokenizer_name(lang) == name
        if name in text.unavailable:
            continue
        tok, offset = text.tokenizers[name], text.offsets[name]
        for s in entry["sentences"]:
            where = f"{lang}: {s['text']!r}"
            if "g2p" in s:  # a phoneme tokenizer: compare the G2P output and what NeMo drops
                symbols, stray = tok.g2p(tok.preprocess(s["text"]))
                assert symbols == s["g2p"] and not stray, where
                kept, bad = tok.symbols(s["text"])
                assert bool(bad) == bool(s["dropped"]), where
                if s["ids"] is not None:
                    assert [tok.ids[k] + offset for k in kept] == s["ids"], where
            if s["ids"] is not None and not s.get("dropped"):
                assert text.encode(s["text"], lang) == s["ids"] + [text.text_eos_id], where
            else:  # NeMo drops symbols with a warning (or fails): the port refuses, naming them
                with pytest.raises(MetalgenError, match=f"'{name}' cannot map"):
                    text.encode(s["text"], lang)
            checked += 1
    assert checked == sum(len(e["sentences"]) for e in ref["languages"].values())


# ----------------------------------------------------------------------------- no dump needed

EN_DICT = """\
;;; comment lines and blank lines are skipped

A  ə
A(2)  ˈeɪ
AIRPORT  ˈɛɹˌpɔɹt
CAT  ˈkæt
DOG  ˈdɔɡ
DON'T  ˈdoʊnt
HELLO  həˈɫoʊ
HELLO(2)  hɛˈɫoʊ
JONES  ˈdʒoʊnz
READ  ˈɹɛd
READ(2)  ˈɹid
SEE  ˈ s i
WORLD  ˈwɝɫd
"""


def en_g2p(**kw):
    args = dict(locale="en-US", heteronyms=["read", ""], use_chars=True, ignore_ambiguous_words=False)
    args.update(kw)
    return IpaG2p(parse_dictionary(EN_DICT), **args)


def test_dictionary_format():
    d = parse_dictionary(EN_DICT)
    assert list(d)[:3] == ["A", "AIRPORT", "CAT"]
    assert d["A"] == [["ə"], ["ˈ", "e", "ɪ"]]  # (2) variants follow, in file order
    assert d["SEE"] == [["ˈ", "s", "i"]]  # whitespace between symbols is dropped
    assert d["DON'T"] == [["ˈ", "d", "o", "ʊ", "n", "t"]]
    with pytest.raises(MetalgenError, match="line 1: the entry 'WORD' has no pronunciation"):
        parse_dictionary("WORD\n")


def test_word_split():
    chunks, stray = split_words("Don't  stop, rock-n-roll's |a b| 2x- ok|", english=True)
    assert chunks == [(["don't"], False), (["  "], False), (["stop"], False), ([", "], False),
                      (["rock-n-roll's"], False), ([" "], False), (["a", "b"], True), ([" 2"], False),
                      (["x"], False), (["- "], False), (["ok"], False)]
    assert stray == ["|"]
    # Other locales keep case and take Latin-1 letters, but not the rest of Latin (ế, đ).
    assert split_words("Straße thế", english=False)[0] == [
        (["Straße"], False), ([" "], False), (["th"], False), (["ế"], False)]


def test_english_rules():
    g = en_g2p()
    out, _ = g("Hello, world!")
    assert "".join(out) == "həˈɫoʊ, ˈwɝɫd!"
    assert "".join(g("A read")[0]) == "ə READ"  # first variant; heteronyms stay graphemes
    assert "".join(g("cat's dog's jones's airport's")[0]) == "ˈkæts ˈdɔɡz ˈdʒoʊnzɪz ˈɛɹˌpɔɹts"
    assert "".join(g("cats dogs airports")[0]) == "ˈkæts ˈdɔɡz ˈɛɹˌpɔɹts"
    assert "".join(g("don't xyz-hello well-known")[0]) == "ˈdoʊnt XYZ-həˈɫoʊ WELL-KNOWN"
    # A non-letter run with a digit is a "word": spelled, spaces included.
    assert g("see 2 cats")[0][3:6] == [" ", "2", " "]
    # Ambiguous words ignored: they are spelled, and so are suffix forms of ambiguous stems.
    strict = en_g2p(ignore_ambiguous_words=True)
    assert "".join(strict("hello hellos cat")[0]) == "HELLO HELLOS ˈkæt"
    # Without stresses the marks leave both pronunciations and the vocabulary.
    plain = en_g2p(use_stresses=False, use_chars=False)
    assert "".join(plain("airport")[0]) == "ɛɹpɔɹt" and "ˈ" not in plain.symbols and "A" not in plain.symbols


def test_mixed_case_prefixed_graphemes():
    d = parse_dictionary("Hallo haˈloː\nWelt vɛlt\nmodern moˈdɛʁn\nmodern(2) ˈmoːdɐn\nStraße ˈʃtʁaːsə\n")
    g = IpaG2p(d, locale="de-DE", heteronyms=["modern"], use_chars=True, grapheme_case="mixed",
               grapheme_prefix="#", ignore_ambiguous_words=False)
    assert "#H" in g.symbols and "#ß" in g.symbols and "#W" in g.symbols and "#L" not in g.symbols
    assert "".join(g("HALLO hallo Welt")[0]) == "haˈloː haˈloː vɛlt"
    assert g("modern Tag")[0] == ["#m", "#o", "#d", "#e", "#r", "#n", " ", "#T", "#a", "#g"]
    # "Straße" is also filed as "STRASSE", which "STRAßE".upper() finds too.
    assert "".join(g("STRASSE STRAßE")[0]) == "ˈʃtʁaːsə ˈʃtʁaːsə"
    # A run with a digit is spelled with the prefix, its spaces too (NeMo then drops all three).
    assert g("Welt 2 ")[0][-3:] == ["# ", "#2", "# "]


def _config(**extra):
    return {"text_tokenizers": {
        "english_phoneme": {
            "_target_": TT + "IPATokenizer", "locale": "en-US", "punct": True, "apostrophe": True,
            "pad_with_space": False,
            "g2p": {"_target_": G2P, "phoneme_dict": "nemo:0123_dict.txt", "heteronyms": "nemo:0123_het",
                    "phoneme_probability": 0.8, "ignore_ambiguous_words": False, "use_chars": True},
        },
        "mandarin_phoneme": {"_target_": TT + "ChinesePhonemesTokenizer",
                             "g2p": {"_target_": "nemo.collections.tts.g2p.models.zh_cn_pinyin.ChineseG2p"}},
        "english": {"_target_": TT + "EnglishCharsTokenizer"},
        **extra,
    }, "language_to_tokenizer_mapping": {"en": "english_phoneme", "zh": "mandarin_phoneme", "en_chars": "english"}}


def _nemo(tmp_path, files):
    return write_nemo_files(tmp_path / "tiny.nemo", files)


def test_ids_from_a_nemo_archive(tmp_path):
    nemo = _nemo(tmp_path, {"model_config.yaml": "{}", "0123_dict.txt": EN_DICT, "0123_het": "read\n"})
    probe = MagpieText.from_config(_config(), nemo_path=nemo)
    n_en = len(probe.tokenizers["english_phoneme"].tokens)
    # Mandarin cannot be built (no dictionary); one unknown size is what the text embedding leaves for it.
    text = MagpieText.from_config(_config(), text_vocab_size=n_en + 100 + 45 + 2, nemo_path=nemo)
    assert text.offsets == {"english_phoneme": 0, "mandarin_phoneme": n_en, "english": n_en + 100}
    tok = text.tokenizers["english_phoneme"]
    # sorted symbols, space appended, then <pad> and <oov>
    assert tok.tokens[-3:] == [" ", "<pad>", "<oov>"] and tok.tokens[:-3] == sorted(tok.tokens[:-3])
    ids = text.encode("  Hello,  world's cat!  ", "en")
    symbols = [tok.tokens[i] for i in ids[:-1]]
    # leading and repeated spaces are kept, trailing ones dropped
    assert "".join(symbols) == "  həˈɫoʊ,  ˈwɝɫdz ˈkæt!"
    assert ids[-1] == text.text_eos_id
    assert text.encode("Hello", "en")[:-1] == [tok.ids[s] for s in ["h", "ə", "ˈ", "ɫ", "o", "ʊ"]]
    assert text.encode("hi", "en_chars")[0] == n_en + 100 + 8  # the char tokenizer after Mandarin keeps its offset
    with pytest.raises(MetalgenError, match=r"^Magpie language 'zh': .*'mandarin_phoneme' cannot be built: "
                                            r"its g2p has no phoneme_dict file$"):
        text.encode("你好", "zh")


def test_unmappable_symbols_are_named(tmp_path):
    nemo = _nemo(tmp_path, {"0123_dict.txt": EN_DICT, "0123_het": "read\n"})
    text = MagpieText.from_config(_config(), text_vocab_size=1000, nemo_path=nemo)
    with pytest.raises(MetalgenError) as e:
        text.encode("I have 2 cats & a |b| dog | x", "en")
    msg = str(e.value)
    assert "'english_phoneme' cannot map" in msg and "'2' (U+0032)" in msg and "'&' (U+0026)" in msg
    assert "'|' (U+007C)" in msg and "'b' (U+0062)" in msg and "\n" not in msg


def test_missing_dictionary_fails_only_its_language(tmp_path):
    nemo = _nemo(tmp_path, {"model_config.yaml": "{}"})
    cfg = _config()
    del cfg["text_tokenizers"]["mandarin_phoneme"]
    text = MagpieText.from_config(cfg, nemo_path=nemo)  # loading still works
    with pytest.raises(MetalgenError, match=r"language 'en': .*nemo:0123_dict.txt is not found in .*tiny.nemo"):
        text.encode("Hello", "en")
    with pytest.raises(MetalgenError, match="depend on the vocabulary size of 'english_phoneme'"):
        text.encode("Hello", "en_chars")
    # Given the text embedding's size, the tokenizer after it keeps working.
    text = MagpieText.from_config(cfg, text_vocab_size=70 + 45 + 2, nemo_path=nemo)
    assert text.encode("hi", "en_chars") == [70 + 8, 70 + 9, text.text_eos_id]


def test_sizes_of_tokenizers_that_cannot_encode(tmp_path):
    zh = ";;; pinyin\nni\tn i\nhao\tx au\nhao\tx ɑu\n"
    nemo = _nemo(tmp_path, {"0123_dict.txt": EN_DICT, "0123_het": "read\n", "0456_zh.txt": zh})
    cfg = _config(french_chartokenizer={"_target_": "AutoTokenizer", "pretrained_model": "google/byt5-small"})
    cfg["text_tokenizers"]["mandarin_phoneme"]["g2p"].update(
        phoneme_dict="nemo:0456_zh.txt", phoneme_prefix="", phoneme_case="lower", ascii_letter_case="upper")
    cfg["language_to_tokenizer_mapping"]["fr"] = "french_chartokenizer"
    text = MagpieText.from_config(cfg, nemo_path=nemo)
    n_en = len(text.tokenizers["english_phoneme"].tokens)
    # space + {i, n, x, ɑu} + 5 tones + 26 letters + "'" + 34 punctuation marks + <pad> + <oov>
    assert text.sizes["mandarin_phoneme"] == 1 + 4 + 5 + 26 + 1 + 34 + 2
    assert text.sizes["french_chartokenizer"] == 384  # byt5: 3 specials + 256 bytes + 125 extra ids
    assert text.text_bos_id == n_en + 73 + 45 + 384
    with pytest.raises(MetalgenError, match="Hugging Face AutoTokenizer .google/byt5-small."):
        text.encode("Bonjour", "fr")


def test_french_elisions_and_indic_words():
    fr = IpaG2p(parse_dictionary("ami ami\nil il\nhomme ɔm\n"), locale="fr-FR", use_chars=True,
                grapheme_case="lower", grapheme_prefix="#")
    assert "".join(fr("L'ami, lorsqu'il, l'homme")[0]) == "lami, loʁskil, lɔm"
    assert "".join(fr("d'abord")[0]) == "#d#'#a#b#o#r#d"  # the rest is not in the dictionary
    hi = IpaG2p(parse_dictionary("नमस्ते nəməsteː\n"), locale="hi-IN", use_chars=True)
    # Devanagari digits are word characters; the danda is punctuation.
    assert hi("नमस्ते २।")[0] == list("nəməsteː") + [" ", "२", "।"]


def test_artifacts_by_path_and_by_file_name(tmp_path):
    from metalgen.magpie.ipa_tokenizer import NemoArtifacts

    local = tmp_path / "dict.txt"
    local.write_text("HELLO həˈɫoʊ\n", encoding="utf-8")
    nemo = _nemo(tmp_path, {"abc_dict.txt": "WORLD ˈwɝɫd\n", "old_name.txt": "CAT ˈkæt\n"})
    art = NemoArtifacts(nemo)
    assert art.read_text(str(local)).startswith("HELLO")
    assert art.read_text("nemo:abc_dict.txt").startswith("WORLD")
    assert art.read_text("/gone/when/saved/old_name.txt").startswith("CAT")  # NeMo's older layout
    with pytest.raises(MetalgenError, match="nemo:missing.txt is not found in"):
        art.read_text("nemo:missing.txt")
