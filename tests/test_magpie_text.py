"""Magpie text front end (metalgen/magpie/text.py): NeMo 3.0.0's character tokenizers rebuilt from
the `.nemo` config. Against the reference dump (tests/magpie_ref, skipped without it): every
vocabulary, offset, pad id and the ids of one sentence per language. Without the dump: the error
messages, on small hand-made configs."""

from __future__ import annotations

import json

import pytest

from magpie_ref.harness import reference_folder
from metalgen.errors import MetalgenError
from metalgen.magpie.text import MagpieText

TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."


@pytest.fixture(scope="module")
def dump():
    folder = reference_folder()
    from metalgen.magpie.nemo_file import read_nemo

    cfg, weights = read_nemo(folder / "magpie.nemo")
    tok = json.loads((folder / "tokenizers.json").read_text())
    text = MagpieText.from_config(cfg, text_vocab_size=weights["text_embedding.weight"].shape[0])
    return tok, text


def test_vocabularies_offsets_and_specials(dump):
    tok, text = dump
    assert text.order == tok["tokenizer_order"]
    for name in tok["tokenizer_order"]:
        assert text.tokenizers[name].tokens == tok["tokens"][name], name
        assert text.offsets[name] == tok["offsets"][name], name
        assert text.tokenizers[name].pad_id + text.offsets[name] == tok["pad_ids"][name], name
    assert (text.text_bos_id, text.text_eos_id, text.vocab_size) == (
        tok["text_bos_id"], tok["text_eos_id"], tok["vocab_size_with_bos_eos"])


def test_ids_per_language(dump):
    tok, text = dump
    served = {lang: e for lang, e in tok["languages"].items() if e["tokenizer"]}
    assert sorted(served) == text.languages
    for lang, entry in served.items():
        assert text.tokenizer_name(lang) == entry["tokenizer"]
        assert text.encode(entry["text"], lang) == entry["ids"], lang


def test_languages_nemo_lacks_offline_are_errors(dump):
    tok, text = dump
    for lang, entry in tok["languages"].items():
        if not entry["tokenizer"]:
            with pytest.raises(MetalgenError, match=f"no tokenizer for language '{lang}'"):
                text.encode(entry["text"], lang)


# ----------------------------------------------------------------------------- no dump needed


def _small(**extra):
    tokenizers = {
        "english": {"_target_": TT + "EnglishCharsTokenizer", "punct": True, "apostrophe": True},
        "french_chartokenizer": {"_target_": TT + "FrenchCharsTokenizer"},
    }
    tokenizers.update(extra)
    return {"text_tokenizers": tokenizers}


def test_small_config_ids():
    text = MagpieText.from_config(_small())
    assert text.languages == ["en", "fr"]
    assert text.offsets == {"english": 0, "french_chartokenizer": 45}
    # NFD + lower-case + curly apostrophe; leading, repeated and trailing spaces collapse.
    assert text.encode("  Don\u2019t  GO! ", "en") == [4, 15, 14, 27, 20, 0, 7, 15, 30, text.text_eos_id]
    assert text.encode("Ça", "fr")[:-1] == [45 + 31, 45 + 1]
    assert text.text_eos_id == 45 + 78 + 1


def test_unmappable_characters_are_named():
    text = MagpieText.from_config(_small())
    with pytest.raises(MetalgenError) as e:
        text.encode("I have 2 cats & 1 dog", "en")
    msg = str(e.value)
    assert "'english'" in msg and "'2' (U+0032)" in msg and "'&' (U+0026)" in msg and "'1' (U+0031)" in msg
    assert "\n" not in msg


def test_unknown_language_lists_the_ones_there_are():
    with pytest.raises(MetalgenError, match=r"language 'de' \(it has: en, fr\)"):
        MagpieText.from_config(_small()).encode("Hallo", "de")


def test_a_phoneme_tokenizer_that_cannot_be_built_fails_only_its_language():
    cfg = {"text_tokenizers": {
        "english_phoneme": {"_target_": TT + "IPATokenizer", "locale": "en-US",
                            "g2p": {"_target_": "nemo.collections.tts.g2p.models.i18n_ipa.IpaG2p"}},
        "french_chartokenizer": {"_target_": TT + "FrenchCharsTokenizer"},
    }}
    text = MagpieText.from_config(cfg)
    assert text.languages == ["en", "fr"]
    with pytest.raises(MetalgenError, match="'english_phoneme' cannot be built: its g2p phoneme_dict is None"):
        text.encode("Hello", "en")
    # French comes after it: without the model's text vocabulary its offset is unknown ...
    with pytest.raises(MetalgenError, match="depend on the vocabulary size of 'english_phoneme'"):
        text.encode("Bonjour", "fr")
    # ... with it, the one unknown size is what the embedding leaves (1000 - 2 - French's 78).
    text = MagpieText.from_config(cfg, text_vocab_size=1000)
    assert text.offsets["french_chartokenizer"] == 920
    assert text.encode("a", "fr") == [921, 999]


def test_checkpoint_language_map_wins_and_sizes_are_checked():
    cfg = _small()
    cfg["language_to_tokenizer_mapping"] = {"en": "english", "fr": ["french_chartokenizer"], "xx": "english"}
    assert MagpieText.from_config(cfg).languages == ["en", "fr", "xx"]
    with pytest.raises(MetalgenError, match="text embedding has 99 rows"):
        MagpieText.from_config(_small(), text_vocab_size=99)
    with pytest.raises(MetalgenError, match="arguments it does not take: bogus"):
        MagpieText.from_config(_small(english={"_target_": TT + "EnglishCharsTokenizer", "bogus": 1}))
