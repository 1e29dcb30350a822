"""Token ids of NeMo's own phoneme tokenizers (IPATokenizer + IpaG2p, NeMo 3.0.0) for metalgen's Magpie
G2P parity tests (tests/test_magpie_g2p.py).

Runs inside the reference venv made by tests/magpie_ref/setup_venv.sh, never in the test environment:

    HF_HUB_OFFLINE=1 tests/magpie_ref/.venv/bin/python tests/magpie_ref/make_g2p_reference.py OUT_DIR

The published dictionaries cannot be fetched here, so this writes small ones of the same format
(CMUdict-style IPA lines with `(2)` variants and comments, heteronym lists) into OUT_DIR, names them in
a Magpie-style `text_tokenizers` config through `nemo:<32 hex>_<file>` paths as NeMo's
`_register_tokenizer_artifacts` + `save_to` leave them, and packs config and files into a tiny
`.nemo`-style tar. NeMo builds its tokenizers from that config with its own `setup_tokenizers`
(the `nemo:` paths pointed at the unpacked files), phoneme probability forced to 1.0 as the port does.

OUT_DIR/g2p.nemo       model_config.yaml + the dictionary and heteronym files (no weights)
OUT_DIR/g2p.json       per tokenizer: class, offset, pad id, vocabulary; text BOS/EOS; per language:
                       the tokenizer and, per sentence, NeMo's G2P output, the symbols NeMo dropped
                       (with a warning) and the aggregated ids
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TT = "nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers."
G2P = "nemo.collections.tts.g2p.models.i18n_ipa.IpaG2p"
NEMO_VERSION = "2.6.0"  # older than 2.8.0, so versioned tokenizer defaults take their legacy value

# Dictionaries in NeMo's file format. Pronunciation symbols are separated by whitespace or not at all
# (NeMo keeps one symbol per character either way); stresses ˈ ˌ; comments and blank lines are skipped.
EN_DICT = """\
;;; a tiny IPA CMUdict for the reference
A  ə
A(2)  ˈeɪ
AIRPORT  ˈɛɹˌpɔɹt
BOOK  ˈbʊk
CAFE  kəˈfeɪ
CAT  ˈkæt
DOG  ˈdɔɡ
DON'T  ˈdoʊnt
FRIEND  ˈfɹɛnd
HELLO  həˈɫoʊ
HELLO(2)  hɛˈɫoʊ
IT  ˈɪt
JONES  ˈdʒoʊnz
LIVE  ˈɫɪv
LIVE(2)  ˈɫaɪv
MOTHER-IN-LAW  ˈməðɝɪnˌɫɔ
NAIVE  naɪˈiv
NEW  ˈnu
O'CLOCK  əˈkɫɑk
READ  ˈɹɛd
READ(2)  ˈɹid
QUIZ  ˈkwɪz
ROCK  ˈɹɑk
ROLL  ˈɹoʊɫ
SEE  ˈsi
SUPPORT  səˈpɔɹt
THE  ðə
THE(2)  ðˈi
TIME  ˈtaɪm
WELL  ˈwɛɫ
WORLD  ˈwɝɫd
XYLOPHONE  ˈzaɪɫəˌfoʊn
YORK  ˈjɔɹk
ZOO  ˈzu
"""
EN_HETERONYMS = "live\nread\n\n"

ES_DICT = """\
hola  ˈola
mundo  ˈmundo
qué  ˈke
tal  ˈtal
estás  esˈtas
hoy  ˈoi
niño  ˈniɲo
el  el
El(2)  ˈel
año  ˈaɲo
palabras  paˈlabɾas
desconocidas  deskonoˈθidas
como  ˈkomo
tengo  ˈteŋɡo
gatos  ˈɡatos
del  del
y  i
guion  ˈɡjon
comillas  koˈmiʎas
espacios  esˈpaθjos
repetidos  repeˈtidos
"""

DE_DICT = """\
Hallo  haˈloː
Welt  vɛlt
guten  ˈɡuːtn̩
Tag  taːk
wie  viː
geht  ɡeːt
es  ɛs
Ihnen  ˈiːnən
heute  ˈhɔɪ̯tə
Straße  ˈʃtʁaːsə
Mädchen  ˈmɛːtçən
modern  moˈdɛʁn
modern(2)  ˈmoːdɐn
Übung  ˈyːbʊŋ
der  deːɐ̯
Bus  bʊs
"""
DE_HETERONYMS = "modern\nAugust\n"

IT_DICT = """\
ciao  ˈtʃao
mondo  ˈmondo
come  ˈkome
stai  ˈstai
oggi  ˈɔddʒi
perché  perˈke
città  tʃitˈta
àncora  ˈankora
ancora  anˈkora
la  la
è  ɛ
bella  ˈbɛlla
una  ˈuna
volta  ˈvɔlta
l'amico  laˈmiko
dell'uomo  delˈlwɔmo
gatti  ˈɡatti
"""
IT_HETERONYMS = "ancora\n"

VI_DICT = """\
xin  sin
chào  tɕaw˨˩
thế  tʰe˧˥
giới  zɤj˧˥
hôm  hom˧˧
nay  naj˧˧
bạn  ɓan˨˩ˀ
khỏe  xwɛ˧˩˧
không  xəwŋ͡m˧˧
việt  viət˨˩ˀ
"""

FR_DICT = """\
ami  ami
homme  ɔm
école  ekɔl
eau  o
lorsque  lɔʁskə
de  də
et  e
il  il
vient  vjɛ̃
bonjour  bɔ̃ʒuʁ
ça  sa
va  va
très  tʁɛ
bien  bjɛ̃
un  œ̃
"""

HI_DICT = """\
नमस्ते  nəməsteː
दुनिया  duniyaː
आप  aːp
कैसे  kɛːseː
हैं  hɛ̃ː
"""

PT_DICT = """\
olá  oˈla
mundo  ˈmũdu
coração  koɾaˈsɐ̃w̃
"""

# Pinyin dictionary (syllable TAB phonemes); a repeated syllable replaces the earlier line.
ZH_DICT = """\
;;; tiny pinyin dictionary
a\ta
ba\tp a
NI\tn i
hao\tx au
hao\tx ɑu
zhong\tʈʂ ʊŋ
guo\tk u o
"""

FILES = {
    "en_dict": ("ipa_cmudict-tiny.txt", EN_DICT),
    "en_het": ("heteronyms-tiny", EN_HETERONYMS),
    "es_dict": ("es_ES_tiny.dict", ES_DICT),
    "de_dict": ("de_tiny.dict", DE_DICT),
    "de_het": ("de_tiny.heteronym", DE_HETERONYMS),
    "it_dict": ("it_IT_tiny.dict", IT_DICT),
    "it_het": ("it_IT_tiny.heteronym", IT_HETERONYMS),
    "vi_dict": ("vi_VN_tiny.dict", VI_DICT),
    "fr_dict": ("fr_FR_tiny.dict", FR_DICT),
    "hi_dict": ("hi_IN_tiny.dict", HI_DICT),
    "pt_dict": ("pt_BR_tiny.dict", PT_DICT),
    "zh_dict": ("ipa_dict_tiny.txt", ZH_DICT),
}
# What NeMo's save_to names an artifact: a 32-hex uuid, "_", the file's name (fixed here so the
# dump is reproducible).
HEX = {key: f"{i:032x}" for i, key in enumerate(FILES)}


def nemo_ref(key: str) -> str:
    return f"nemo:{HEX[key]}_{FILES[key][0]}"


def ipa(locale, dict_key, het_key=None, tok=None, **g2p):
    g = {"_target_": G2P, "phoneme_dict": nemo_ref(dict_key), "locale": locale, **g2p}
    if het_key:
        g["heteronyms"] = nemo_ref(het_key)
    return {"_target_": TT + "IPATokenizer", "locale": locale, **(tok or {}), "g2p": g}


# Order matters for the offsets: a char tokenizer sits between the phoneme ones.
PUBLISHED_LIKE = dict(phoneme_probability=0.8, ignore_ambiguous_words=False, use_chars=True, use_stresses=True)
TOKENIZERS = {
    # As the published English entry (docs/magpie.md 3.1).
    "english_phoneme": ipa("en-US", "en_dict", "en_het", dict(punct=True, apostrophe=True, pad_with_space=False),
                           **PUBLISHED_LIKE),
    # The other switches: no stresses, ambiguous words ignored, no graphemes, padded, no apostrophe.
    "english_plain": ipa("en-US", "en_dict", "en_het", dict(punct=True, apostrophe=False, pad_with_space=True),
                         ignore_ambiguous_words=True, use_chars=False, use_stresses=False),
    "spanish_phoneme": ipa("es-ES", "es_dict", None, dict(punct=True, apostrophe=True, pad_with_space=True),
                           **PUBLISHED_LIKE),
    "english": {"_target_": TT + "EnglishCharsTokenizer", "punct": True, "apostrophe": True, "pad_with_space": False},
    # As the published Mandarin entry: metalgen cannot encode with it, but needs its vocabulary size.
    "mandarin_phoneme": {
        "_target_": TT + "ChinesePhonemesTokenizer", "punct": True, "apostrophe": True, "pad_with_space": True,
        "g2p": {"_target_": "nemo.collections.tts.g2p.models.zh_cn_pinyin.ChineseG2p",
                "phoneme_dict": nemo_ref("zh_dict"), "word_segmenter": "jieba", "phoneme_prefix": "",
                "phoneme_case": "lower", "tone_prefix": "#", "ascii_letter_prefix": "", "ascii_letter_case": "upper"},
    },
    "german_phoneme": ipa("de-DE", "de_dict", "de_het", dict(punct=True, apostrophe=True, pad_with_space=True),
                          grapheme_case="mixed", grapheme_prefix="#", **PUBLISHED_LIKE),
    "italian_phoneme": ipa("it-IT", "it_dict", "it_het", dict(punct=True, apostrophe=True, pad_with_space=True),
                           **PUBLISHED_LIKE),
    "vietnamese_phoneme": ipa("vi-VN", "vi_dict", None, dict(punct=True, apostrophe=True, pad_with_space=True),
                              grapheme_case="lower", **PUBLISHED_LIKE),
    "french_phoneme": ipa("fr-FR", "fr_dict", None, dict(punct=True, apostrophe=True),
                          grapheme_case="lower", grapheme_prefix="#", **PUBLISHED_LIKE),
    "hindi_phoneme": ipa("hi-IN", "hi_dict", None, dict(punct=True, apostrophe=True), **PUBLISHED_LIKE),
    # pt-BR with a pre-2.8 nemo_version: NeMo pins locale_specific_punct to False.
    "portuguese_phoneme": ipa("pt-BR", "pt_dict", None, dict(punct=True, apostrophe=True), **PUBLISHED_LIKE),
}
LANGUAGES = {
    "en": "english_phoneme", "en_plain": "english_plain", "es": "spanish_phoneme", "en_chars": "english",
    "de": "german_phoneme", "it": "italian_phoneme", "vi": "vietnamese_phoneme", "fr": "french_phoneme",
    "hi": "hindi_phoneme", "pt": "portuguese_phoneme", "zh": "mandarin_phoneme",
}

EN = [
    "Hello world.",
    "HELLO, World!",
    "I read the book, and I live in New York.",
    "The cat's friend. The dogs' time.",
    "Jones's airport's airports cats dogs books.",
    "Don't read it; it's nine o'clock.",
    "A well-known mother-in-law.",
    "Rock'n'roll and xyz-hello and hello-world!",
    "Supercalifragilistic words are spelled.",
    "Caf\u00e9 na\u00efve, cafe naive.",
    "  Leading   and repeated   spaces  ",
    "Quotes \u201chello\u201d and \u2019apostrophes\u2019 here.",
    "Brackets (hello) [world] {cat}: yes / no - maybe?",
    "I have 2 cats and 10 dogs.",
    "Hash # and ampersand & are not punctuation.",
    "Stra\u00dfe and \u00f8re.",
    "An |unchanged span| stays.",
    "Ellipsis... and double--hyphen and trailing-",
    "A",
    "Hello-",
    "A read-only live's JONES'S AIRPORT'S CATS.",
    "'Tis the zoo's quiz, see?",
    "Xylophones support quizzes; see the zoos.",
    "Hello\tworld\nnew line.",
]
ES = [
    "Hola mundo, \u00bfqu\u00e9 tal est\u00e1s hoy?",
    "\u00a1HOLA! El a\u00f1o del ni\u00f1o.",
    "Palabras desconocidas como murci\u00e9lago.",
    "Tengo 3 gatos.",
    "  Espacios   repetidos  ",
    "Comillas \u00abhola\u00bb y guion hola-mundo.",
    "El el EL.",
]
DE = [
    "Guten Tag, wie geht es Ihnen heute?",
    "HALLO Welt! hallo welt.",
    "Die Stra\u00dfe und das M\u00e4dchen.",
    "STRASSE und STRA\u00dfE.",
    "Der moderne Bus ist modern.",
    "\u00dcbung macht den Meister, \u00fcbung auch.",
    "Im August 2024 geht es los.",
    "\u201eHallo\u201c, sagte der Bus \u2013 und Tsch\u00fcss.",
    "Kaffee-Haus und Hallo-Welt.",
    "  Hallo   Welt  ",
    "Er sagt\u2019s dir.",
    "Caf\u00e9 cr\u00e8me.",
    "Das ist |Hallo Welt| hier.",
    "MODERN und Modern, welt-modern.",
]
IT = [
    "Ciao mondo, come stai oggi?",
    "Perch\u00e9 la citt\u00e0 \u00e8 bella?",
    "Ancora una volta, \u00e0ncora.",
    "L'amico dell'uomo.",
    "Ho 5 gatti.",
    "CIAO MONDO!",
]
VI = [
    "Xin ch\u00e0o th\u1ebf gi\u1edbi, h\u00f4m nay b\u1ea1n kh\u1ecfe kh\u00f4ng?",
    "Vi\u1ec7t Nam.",
    "XIN CH\u00c0O.",
    "xin chao",
]
FR = [
    "L'ami de l'homme.",
    "L'\u00e9cole et l'eau, lorsqu'il vient.",
    "Bonjour, \u00e7a va\u2026 tr\u00e8s bien.",
    "J'ai un ami.",
]
HI = [
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, "
    "\u0906\u092a \u0915\u0948\u0938\u0947 \u0939\u0948\u0902?",
    "\u0906\u092a \u0915\u0948\u0938\u0947 \u0939\u0948\u0902\u0964",
    "Hello \u0928\u092e\u0938\u094d\u0924\u0947.",
    "\u0906\u092a \u0968 \u0939\u0948\u0902\u0965",
]
PT = [
    "Ol\u00e1 mundo, cora\u00e7\u00e3o!",
    "\u201cOl\u00e1\u201d \u2014 mundo\u2026",
]
SENTENCES = {"en": EN, "en_plain": EN, "es": ES, "en_chars": ["Hello world, it's me."], "de": DE, "it": IT,
             "vi": VI, "fr": FR, "hi": HI, "pt": PT}


def write_nemo(out: Path, cfg: dict) -> None:
    """A .nemo-style tar: ./model_config.yaml and each artifact under its `<hex>_<name>`."""
    import yaml

    def add(tar, name, data: bytes):
        info = tarfile.TarInfo("./" + name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(out / "g2p.nemo", "w") as tar:
        add(tar, "model_config.yaml", yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False).encode("utf-8"))
        for key, (name, text) in FILES.items():
            add(tar, f"{HEX[key]}_{name}", text.encode("utf-8"))


def stub_chinese_segmenters() -> None:
    """ChineseG2p imports jieba, pypinyin and pypinyin_dict in its constructor, which the venv lacks;
    they only matter when encoding, so empty stand-ins let NeMo build the tokenizer's vocabulary."""
    import types

    for name in ("jieba", "pypinyin", "pypinyin_dict", "pypinyin_dict.pinyin_data"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["jieba"].cut = lambda text: [text]
    sys.modules["pypinyin"].Style = object
    sys.modules["pypinyin"].lazy_pinyin = lambda *a, **k: []
    sys.modules["pypinyin_dict.pinyin_data"].cc_cedict = types.SimpleNamespace(load=lambda: None)


def main(out: Path) -> None:
    from omegaconf import OmegaConf

    stub_chinese_segmenters()

    from nemo.collections.common.tokenizers.text_to_speech.tts_tokenizers import IPATokenizer
    from nemo.collections.tts.data.text_to_speech_dataset_lhotse import setup_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    cfg = {"nemo_version": NEMO_VERSION, "text_tokenizers": TOKENIZERS, "language_to_tokenizer_mapping": LANGUAGES}
    write_nemo(out, cfg)

    # What NeMo's restore does with the nemo: paths: point them at the unpacked files.
    unpacked = out / "unpacked"
    unpacked.mkdir(exist_ok=True)
    for key, (name, text) in FILES.items():
        (unpacked / f"{HEX[key]}_{name}").write_text(text, encoding="utf-8")
    resolved = json.loads(json.dumps(TOKENIZERS))
    for tc in resolved.values():
        g = tc.get("g2p")
        for field in ("phoneme_dict", "heteronyms"):
            if g and str(g.get(field, "")).startswith("nemo:"):
                g[field] = str(unpacked / g[field][len("nemo:"):])
    conf = OmegaConf.create({"text_tokenizers": resolved})
    agg = setup_tokenizers(conf.text_tokenizers, mode="test", cfg_nemo_version=NEMO_VERSION)
    for tok in agg.tokenizers.values():
        # setup_tokenizers(mode='test') calls the set_phone_prob context manager without `with`, which
        # changes nothing: force phoneme probability 1.0 as metalgen always uses it.
        if isinstance(tok, IPATokenizer):
            tok.g2p.phoneme_probability = 1.0
            tok.phoneme_probability = 1.0

    info = {
        "nemo_version": NEMO_VERSION,
        "tokenizer_order": list(agg.tokenizer_names),
        "offsets": dict(agg.tokenizer_offsets),
        "pad_ids": dict(agg.tokenizer_pad_ids),
        "classes": {n: type(t).__name__ for n, t in agg.tokenizers.items()},
        "tokens": {n: list(t.tokens) for n, t in agg.tokenizers.items()},
        "text_bos_id": agg.vocab_size,
        "text_eos_id": agg.vocab_size + 1,
        "locale_specific_punct": {n: bool(conf.text_tokenizers[n].get("locale_specific_punct", True))
                                  for n in agg.tokenizer_names},
        "languages": {},
        # Built with stand-in segmenters: only its vocabulary counts.
        "unencodable": ["mandarin_phoneme"],
    }
    for lang, name in LANGUAGES.items():
        tok = agg.tokenizers[name]
        entries = []
        for text in SENTENCES.get(lang, ()):  # none for the unencodable Mandarin
            try:
                entry = {"text": text, "ids": agg.encode(text, name)}
            except IndexError:
                # encode_from_g2p strips trailing spaces with `while ps[-1] == space`, which fails
                # when nothing but spaces was kept.
                entry = {"text": text, "ids": None, "error": "IndexError"}
            if isinstance(tok, IPATokenizer):
                pre = tok.text_preprocessing_func(text)
                g2p_out = tok.g2p(pre)
                vocab = set(tok.tokens)
                space = tok.tokens[tok.space]
                # encode_from_g2p's rule: a symbol outside the vocabulary (and the punctuation list)
                # is dropped with a warning.
                entry["g2p"] = list(g2p_out)
                entry["dropped"] = [p for p in g2p_out
                                    if p not in vocab and not (tok.punct and p in tok.punct_list) and p != space]
            entries.append(entry)
        info["languages"][lang] = {"tokenizer": name, "sentences": entries}
    (out / "g2p.json").write_text(json.dumps(info, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
