"""Magpie TTS text front end: NeMo's character tokenizers and their aggregation, without NeMo.

A Magpie `.nemo` stores its tokenizers as `text_tokenizers` in model_config.yaml: an ordered map
name -> {`_target_`: a NeMo tokenizer class, its keyword arguments}. The vocabularies themselves
are not stored; they are fixed by each class in NeMo's source (nemo/collections/common/tokenizers/
text_to_speech/tts_tokenizers.py and ipa_lexicon.py, NeMo 3.0.0), restated below as data.

Per character tokenizer (BaseCharsTokenizer) the vocabulary is
    [' '] + chars + ["'" if apostrophe] + (punctuation if punct) + ['<pad>'] (+ '<blank>') + ['<oov>']
and a repeated symbol keeps the id of its last occurrence (Hindi's danda is both a letter and a
punctuation mark). `encode`: the class's text preprocessing, then per character: a space is kept
unless the previous kept symbol is a space (so leading spaces and runs collapse); a letter or
digit in the vocabulary, or an apostrophe in it, is kept (Hindi: any vocabulary symbol); a
punctuation mark of the list is kept when `punct`; trailing spaces are dropped; `pad_with_space`
adds one space at each end. NeMo drops any other character with a warning; here it is a
MetalgenError naming them, because a silently dropped letter changes what is spoken.

Aggregation (AggregatedTTSTokenizer): the tokenizers' vocabularies are concatenated in config
order; a tokenizer's ids are shifted by the sizes of the ones before it; text BOS and EOS are the
total size and total + 1. `do_tts` feeds the model the shifted ids + text EOS (no BOS).

Language -> tokenizer: the checkpoint's `language_to_tokenizer_mapping` when it has one, else
NeMo's LANGUAGE_TOKENIZER_MAP (first configured candidate wins). Unlike NeMo there is no silent
fallback to English for a language the checkpoint lacks.

Phoneme tokenizers: NeMo's IPATokenizer + IpaG2p (English, Spanish, German, Italian, Vietnamese,
French, Hindi, Portuguese, Korean locales) are rebuilt by metalgen/magpie/ipa_tokenizer.py and g2p.py
from the dictionaries inside the `.nemo` (`nemo:` paths; pass `nemo_path`), always with phoneme
probability 1.0; Mandarin's ChinesePhonemesTokenizer by metalgen/magpie/zh_g2p.py (encoding needs the
optional jieba, pypinyin and pypinyin-dict: `metalgen[zh]`); Japanese's JapanesePhonemeTokenizer over
JapaneseKatakanaAccentG2p by metalgen/magpie/ja_g2p.py (encoding needs the optional pyopenjtalk and its
dictionary: `metalgen[ja]`). A tokenizer that cannot be built (a missing dictionary; Japanese over NeMo's other
G2P; Hugging Face byt5 tokenizers) raises a MetalgenError for its languages only. Its vocabulary size is then unknown, which would shift every later tokenizer's ids: when
it is the only unknown one, the model's text embedding size fixes it (rows = total + BOS + EOS); else
the languages after it raise too. No text normalization (numbers, dates): that is the caller's job, as
NeMo's `apply_TN` is off by default.
"""

from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import MetalgenError

# ------------------------------------------------------------------------------ NeMo's tables

# LJSpeech's punctuation and "/" (ipa_lexicon.DEFAULT_PUNCTUATION), in NeMo's tuple order: the
# English and Vietnamese tokenizers use this order as is; locale lists are sorted sets.
DEFAULT_PUNCT = (",", ".", "!", "?", "-", ":", ";", "/", '"', "(", ")", "[", "]", "{", "}")

_GUILLEMETS = "«»‹›"
_GERMAN_EXTRA = "\u201e\u201c\u201a\u2018\u2012\u2013\u2014"  # „ “ ‚ ‘ figure dash, en dash, em dash
_LOCALE_PUNCT_EXTRA: Dict[str, Tuple[str, ...]] = {
    "de-DE": tuple(_GUILLEMETS + _GERMAN_EXTRA),
    "es-ES": tuple(_GUILLEMETS + "¿¡"),
    "it-IT": tuple(_GUILLEMETS + _GERMAN_EXTRA + "ʴʰʱʲʷˠˤ") + ("˞↓",) + tuple("↑→↗↘\u201d\u2019-"),
    # en dash, quotes, ellipsis and the combining grave, acute, circumflex, diaeresis, cedilla
    "fr-FR": tuple("\u2013\u201c\u201d\u2026\u0300\u0301\u0302\u0308\u0327") + tuple(_GUILLEMETS),
    "hi-IN": ("\u0964", "\u0965"),  # danda, double danda
    # quotes, en and em dash, ellipsis (the IPA tokenizer's pt-BR list when locale_specific_punct)
    "pt-BR": tuple(_GUILLEMETS + "\u201c\u201d\u2018\u2019\u2013\u2014\u2026"),
    "ko-KR": tuple("『』「」《》…·—–〜"),
    "ar-MSA": ("\u060c", "\u061b", "\u061f"),  # Arabic comma, semicolon, question mark
}


def locale_punctuation(locale: Optional[str]) -> List[str]:
    """ipa_lexicon.get_ipa_punctuation_list, sorted, for every locale but ja-JP (None: the default list)."""
    return sorted(set(DEFAULT_PUNCT) | set(_LOCALE_PUNCT_EXTRA.get(locale, ())))


_LATIN = string.ascii_uppercase
# ipa_lexicon.GRAPHEME_CHARACTER_SETS (upper case), for the locales used below.
_GRAPHEMES = {
    "de-DE": _LATIN + "ÄÖÜẞ",
    "fr-FR": _LATIN + "ÀÂÄÆÇÈÉÊËÍÎÏÑÔÖÙÛÜŌŒ",
    "vi-VN": _LATIN
    + "ĐÁÀÃẢẠĂẮẰẴẲẶÂẤẦẪẨẬÓÒÕỎỌÔỐỒỖỔỘƠỚỜỠỞỢÉÈẼẺẸÊẾỀỄỂỆÚÙŨỦỤƯỨỪỮỬỰÍÌĨỈỊÝỲỸỶỴ",
    "hi-IN": (
        "अआइईउऊऋॠएऐओऔऍऑ"  # independent vowels
        "कखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसहळऩऱ"  # consonants
        "\u093e\u093f\u0940\u0941\u0942\u0943\u0944\u0947\u0948\u094b\u094c"  # dependent vowels
        "\u0945\u0949\u0901\u0902\u0903\u094d\u093c\u094a\u0962\u0963\u0946"  # signs
        "\u0964"  # danda
    ),
}


def grapheme_set(locale: str, case: str) -> str:
    """ipa_lexicon.get_grapheme_character_set: 'upper', 'lower' or 'mixed' (upper then lower)."""
    upper = _GRAPHEMES[locale].replace("ß", "ẞ").upper()
    lower = _GRAPHEMES[locale].lower()
    return {"upper": upper, "lower": lower, "mixed": upper + lower}[case]


# ------------------------------------------------------------------------------ preprocessing

_SYNOGLYPHS = {"\u2019": "'", "\u201d": '"', "\u201c": '"'}


def english_preprocess_cased(text: str) -> str:
    """english_text_preprocessing(lower=False): strip combining marks (NFD), curly quotes to ASCII."""
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    return "".join(_SYNOGLYPHS.get(c, c) for c in text)


def english_preprocess(text: str) -> str:
    """Strip combining marks (NFD), map curly quotes to ASCII, lower-case."""
    return english_preprocess_cased(text).lower()


def any_locale_preprocess(text: str) -> str:
    """NFC, and the right single quotation mark as an apostrophe."""
    return unicodedata.normalize("NFC", text).replace("\u2019", "'")


def lower_preprocess(text: str) -> str:
    return text.lower()


# ------------------------------------------------------------------------------ one tokenizer


class SymbolTokenizer:
    """What NeMo's tokenizers share once their subclass has turned text into symbols
    (`symbols(text) -> (kept, bad)`): the kept symbols' `ids`, or one error naming what it cannot map."""

    name: str
    ids: Dict[str, int]

    def symbols(self, text: str) -> Tuple[List[str], List[str]]:
        raise NotImplementedError

    def encode(self, text: str) -> List[int]:
        """The tokenizer's ids for `text` (MetalgenError naming any symbol it cannot map)."""
        kept, bad = self.symbols(text)
        if bad:
            raise MetalgenError(f"the Magpie tokenizer '{self.name}' cannot map {describe_chars(bad)}")
        return [self.ids[s] for s in kept]


def append_specials(tokens: List[str], blank_at: Any = None, oov: str = "<oov>") -> None:
    """The end of every NeMo tokenizer's vocabulary, appended to `tokens`: `<pad>`, `<blank>` where
    `add_blank_at` is set, the OOV token, with the last two swapped for `add_blank_at: last`."""
    tokens.append("<pad>")
    if blank_at is not None:
        tokens.append("<blank>")
    tokens.append(oov)
    if blank_at == "last":
        tokens[-1], tokens[-2] = tokens[-2], tokens[-1]


def finish_symbols(kept: List[str], space: str, pad_with_space: bool) -> List[str]:
    """The end of every NeMo tokenizer's `encode`: trailing spaces dropped, then one space on each side
    when `pad_with_space`."""
    while kept and kept[-1] == space:
        kept.pop()
    return [space] + kept + [space] if pad_with_space else kept


def encode_from_g2p(tok, g2p_out: List[str], bad: List[str]) -> Tuple[List[str], List[str]]:
    """NeMo's `encode_from_g2p` of its Mandarin and Japanese phoneme tokenizers, on `tok`'s `space`, `ids`,
    `_g2p_symbols`, `punct`, `punct_list` and `pad_with_space` -> (kept symbols, `bad` and every other symbol
    NeMo drops, in order of first appearance): a space unless the kept symbol before is one; a vocabulary
    symbol that is alphanumeric, `'` or one of the G2P's; a punctuation mark where `punct`."""
    kept: List[str] = []
    space = tok.space
    for p in g2p_out:
        if p == space and kept and kept[-1] != space:
            kept.append(p)
        elif (p.isalnum() or p == "'" or p in tok._g2p_symbols) and p in tok.ids:
            kept.append(p)
        elif tok.punct and p in tok.punct_list:
            kept.append(p)
        elif p != space and p not in bad:
            bad.append(p)
    return finish_symbols(kept, space, tok.pad_with_space), bad


@dataclass
class CharTokenizer(SymbolTokenizer):
    """One of NeMo's character tokenizers, rebuilt from its class name and config arguments."""

    name: str
    cls: str
    tokens: List[str]
    punct_list: Tuple[str, ...]
    punct: bool
    pad_with_space: bool
    preprocess: Callable[[str], str]
    any_vocab_symbol: bool  # Hindi: keep any vocabulary symbol, not only letters/digits

    def __post_init__(self):
        self.ids = {}
        for i, tok in enumerate(self.tokens):
            self.ids[tok] = i  # last occurrence wins, as in NeMo's dict comprehension
        self.vocab = set(self.tokens)

    @property
    def pad_id(self) -> int:
        return self.tokens.index("<pad>")

    def symbols(self, text: str) -> Tuple[List[str], List[str]]:
        """(the kept symbols, the characters it cannot map, in order of first appearance)."""
        kept: List[str] = []
        bad: List[str] = []
        for c in self.preprocess(text):
            if c == " ":
                if kept and kept[-1] != " ":
                    kept.append(c)
            elif (c in self.vocab) if self.any_vocab_symbol else ((c.isalnum() or c == "'") and c in self.vocab):
                kept.append(c)
            elif self.punct and c in self.punct_list:
                kept.append(c)
            elif c not in bad:
                bad.append(c)
        return finish_symbols(kept, " ", self.pad_with_space), bad


def describe_chars(chars: Sequence[str]) -> str:
    shown = ", ".join(f"{c!r} (U+{ord(c):04X})" if len(c) == 1 else repr(c) for c in chars[:20])
    more = f" and {len(chars) - 20} more" if len(chars) > 20 else ""
    return f"{len(chars)} character{'s' if len(chars) != 1 else ''}: {shown}{more}"


# Per class: `chars` its default characters (None: Hindi, chosen by charset_version), `chars_arg`
# whether the class takes a `chars` argument, `punct` its non_default_punct_list default,
# `class_punct` its PUNCT_LIST attribute (used when that argument is None), `pre` its preprocessing.
_COMMON_ARGS = {"punct", "apostrophe", "add_blank_at", "pad_with_space", "non_default_punct_list"}
_CLASSES: Dict[str, Dict[str, Any]] = {
    "EnglishCharsTokenizer": dict(chars=string.ascii_lowercase, punct=DEFAULT_PUNCT, class_punct=DEFAULT_PUNCT,
                                  pre=english_preprocess),
    "SpanishCharsTokenizer": dict(chars="abcdefghijklmnopqrstuvwxyzáéíñóúü", punct=None, class_punct=locale_punctuation("es-ES"),
                                  pre=lower_preprocess),
    "GermanCharsTokenizer": dict(chars=grapheme_set("de-DE", "mixed"), chars_arg=True,
                                 punct=locale_punctuation("de-DE"), class_punct=DEFAULT_PUNCT, pre=any_locale_preprocess),
    "FrenchCharsTokenizer": dict(chars=grapheme_set("fr-FR", "lower"), punct=None, class_punct=locale_punctuation("fr-FR"),
                                 pre=lower_preprocess),
    "ItalianCharsTokenizer": dict(chars="abcdefghijklmnopqrstuvwxyzàèéìòùó", punct=None, class_punct=locale_punctuation("it-IT"),
                                  pre=lower_preprocess),
    "VietnameseCharsTokenizer": dict(chars=grapheme_set("vi-VN", "mixed"), chars_arg=True, punct=None,
                                     class_punct=DEFAULT_PUNCT, pre=lower_preprocess),
    "HindiCharsTokenizer": dict(chars=None, chars_arg=True, punct=None, pre=any_locale_preprocess),
}
# Accepted by the class but not meaningful from a config file (a Python callable).
_IGNORED_ARGS = {"_target_", "text_preprocessing_func"}
# NeMo pins these Hindi defaults by the config's nemo_version (resolve_versioned_tokenizer_defaults):
# a config from before 2.8.0 that leaves them unset was trained with version 1.
_VERSIONED_SINCE = (2, 8, 0)


def _version_tuple(v: Any) -> Optional[Tuple[int, ...]]:
    """'2.8.0rc0' -> (2, 8, 0); None when it does not start with a number."""
    m = re.match(r"\s*(\d+(?:\.\d+)*)", str(v))
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def _hindi_charset(name: str, tc: Mapping[str, Any], legacy: bool) -> Tuple[str, Sequence[str]]:
    chars = tc.get("chars")
    if chars is None:
        version = tc.get("charset_version")
        version = (1 if legacy else 2) if version is None else int(version)
        if version == 1:
            chars = grapheme_set("hi-IN", "mixed") + string.ascii_lowercase
        elif version == 2:
            chars = grapheme_set("hi-IN", "upper") + string.ascii_letters
        else:
            raise MetalgenError(f"Magpie tokenizer '{name}': HindiCharsTokenizer charset_version {version} is unknown")
    punct = tc.get("non_default_punct_list")
    if punct is None:
        version = tc.get("punct_version")
        version = (1 if legacy else 2) if version is None else int(version)
        if version == 1:
            punct = sorted(DEFAULT_PUNCT)
        elif version == 2:
            punct = locale_punctuation("hi-IN")
        else:
            raise MetalgenError(f"Magpie tokenizer '{name}': HindiCharsTokenizer punct_version {version} is unknown")
    return chars, punct


def config_class(conf: Mapping[str, Any]) -> str:
    """The class name of a config entry's `_target_` ("" without one)."""
    return str(conf.get("_target_", "")).rsplit(".", 1)[-1]


def reject_unknown_arguments(name: str, cls: str, tc: Mapping[str, Any], args, g2p_args=None) -> None:
    """Raise, naming them, for the arguments of tokenizer `name` (class `cls`) outside `args`, and with
    `g2p_args`, those of its `g2p` entry outside them."""
    unknown = sorted(set(tc) - set(args))
    if g2p_args is not None:
        unknown += [f"g2p.{k}" for k in sorted(set(tc.get("g2p") or {}) - set(g2p_args))]
    if unknown:
        raise MetalgenError(f"Magpie tokenizer '{name}' ({cls}) has arguments it does not take: {', '.join(unknown)}")


def build_char_tokenizer(name: str, tc: Mapping[str, Any], nemo_version: Any = None) -> CharTokenizer:
    """A NeMo character tokenizer from its config entry (raises for classes it does not know)."""
    cls = config_class(tc)
    spec = _CLASSES[cls]
    allowed = set(_COMMON_ARGS) | _IGNORED_ARGS
    if spec.get("chars_arg"):
        allowed.add("chars")
    if cls == "HindiCharsTokenizer":
        allowed |= {"charset_version", "punct_version"}
    reject_unknown_arguments(name, cls, tc, allowed)
    if cls == "HindiCharsTokenizer":
        version = _version_tuple(nemo_version) if nemo_version is not None else None
        legacy = version is not None and version[:3] < _VERSIONED_SINCE
        chars, punct_list = _hindi_charset(name, tc, legacy)
    else:
        chars = tc.get("chars") if spec.get("chars_arg") and tc.get("chars") is not None else spec["chars"]
        # `non_default_punct_list: null` falls back to the class's PUNCT_LIST attribute, which is
        # not always its argument's default (German's is the LJSpeech list).
        punct_list = tc.get("non_default_punct_list", spec["punct"])
        if punct_list is None:
            punct_list = spec["class_punct"]
    punct = bool(tc.get("punct", True))
    tokens = [" "] + list(chars)
    if bool(tc.get("apostrophe", True)):
        tokens.append("'")
    if punct:
        tokens.extend(punct_list)
    append_specials(tokens, tc.get("add_blank_at"))
    return CharTokenizer(
        name=name,
        cls=cls,
        tokens=tokens,
        punct_list=tuple(punct_list),
        punct=punct,
        pad_with_space=bool(tc.get("pad_with_space", False)),
        preprocess=spec["pre"],
        any_vocab_symbol=cls == "HindiCharsTokenizer",
    )


# ------------------------------------------------------------------------------ aggregation

# nemo/collections/tts/parts/utils/tts_dataset_utils.py LANGUAGE_TOKENIZER_MAP (NeMo 3.0.0).
LANGUAGE_TOKENIZER_MAP: Dict[str, Tuple[str, ...]] = {
    "en": ("english_phoneme", "english"),
    "de": ("german_phoneme", "german"),
    "es": ("spanish_phoneme", "spanish"),
    "fr": ("french_chartokenizer", "french"),
    "it": ("italian_phoneme", "italian"),
    "vi": ("vietnamese_phoneme", "vietnamese"),
    "zh": ("mandarin_phoneme", "mandarin", "chinese"),
    "hi": ("hindi_chartokenizer", "hindi"),
    "ja": ("japanese_phoneme", "japanese"),
}


def _unavailable_reason(name: str, tc: Mapping[str, Any]) -> str:
    target = str(tc.get("_target_", ""))
    cls = target.rsplit(".", 1)[-1]
    if cls in ("AutoTokenizer", "T5Tokenizer"):
        what = tc.get("pretrained_model", "?")
        return f"its tokenizer '{name}' is a Hugging Face {cls} ({what}), which metalgen does not implement yet"
    if "g2p" in tc or "Phoneme" in cls:
        return f"its phoneme front end ('{name}', {cls or 'no class'} with G2P) is not implemented yet"
    return f"its tokenizer '{name}' ({cls or 'no class'}) is not supported"


class MagpieText:
    """The aggregated text tokenizer of a Magpie checkpoint: `encode(text, language)` gives the ids
    fed to the model (the tokenizer's ids shifted by its offset, then the text EOS)."""

    def __init__(self, order: List[str], tokenizers: Dict[str, Any], unavailable: Dict[str, str],
                 sizes: Dict[str, Optional[int]], language_map: Dict[str, str], text_vocab_size: Optional[int]):
        unknown = [n for n in order if sizes[n] is None]
        if len(unknown) == 1 and text_vocab_size is not None:
            # One tokenizer the port cannot build: the model's text embedding still fixes its size
            # (total + BOS + EOS rows), so the tokenizers after it keep their offsets.
            rest = text_vocab_size - 2 - sum(v for v in sizes.values() if v is not None)
            if rest > 0:
                sizes = {**sizes, unknown[0]: rest}
        self.order = order
        self.tokenizers = tokenizers
        self.unavailable = unavailable
        self.sizes = sizes
        self.language_map = language_map
        self.offsets: Dict[str, Optional[int]] = {}
        offset: Optional[int] = 0
        self._blocked_by: Dict[str, str] = {}
        first_unknown = None
        for name in order:
            self.offsets[name] = offset
            if first_unknown is not None:
                self._blocked_by[name] = first_unknown
            size = sizes[name]
            if size is None:
                offset = None
                first_unknown = first_unknown or name
            elif offset is not None:
                offset += size
        total = offset
        if total is not None and text_vocab_size is not None and total + 2 != text_vocab_size:
            raise MetalgenError(
                f"Magpie text tokenizers give {total} tokens + BOS/EOS = {total + 2}, but the model's text "
                f"embedding has {text_vocab_size} rows"
            )
        if total is not None:
            self.text_bos_id: Optional[int] = total
        elif text_vocab_size is not None:
            self.text_bos_id = text_vocab_size - 2
        else:
            self.text_bos_id = None
        self.text_eos_id = None if self.text_bos_id is None else self.text_bos_id + 1

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], text_vocab_size: Optional[int] = None,
                    nemo_path: Optional[Any] = None) -> "MagpieText":
        """From model_config.yaml as a dict (the whole config: its `text_tokenizers`, its
        `language_to_tokenizer_mapping` and `nemo_version`). `text_vocab_size`, the model's text
        embedding rows when known, is checked against the tokenizers' total + 2. `nemo_path`, the
        `.nemo` the config came from, is where the phoneme tokenizers' `nemo:` dictionaries are read.
        A tokenizer that cannot be built (a missing dictionary, byt5) does not fail
        the load: `encode` raises for its languages only."""
        from .ipa_tokenizer import NemoArtifacts, build_ipa_tokenizer
        from .ja_g2p import build_japanese_tokenizer
        from .unbuilt_sizes import unbuilt_size
        from .zh_g2p import build_chinese_tokenizer

        artifacts = NemoArtifacts(nemo_path)
        section = cfg.get("text_tokenizers")
        if not isinstance(section, Mapping) or not section:
            raise MetalgenError("the Magpie config has no text_tokenizers section")
        if cfg.get("legacy_text_conditioning", False):
            raise MetalgenError("Magpie checkpoints with legacy_text_conditioning are not supported")
        nemo_version = cfg.get("nemo_version")
        order = [str(n) for n in section]
        tokenizers: Dict[str, Any] = {}
        unavailable: Dict[str, str] = {}
        sizes: Dict[str, Optional[int]] = {}
        for name in order:
            tc = section[name] or {}
            cls_name = config_class(tc)
            if cls_name in _CLASSES and "g2p" not in tc:
                tok = build_char_tokenizer(name, tc, nemo_version)
                tokenizers[name] = tok
                sizes[name] = len(tok.tokens)
            elif cls_name in ("IPATokenizer", "ChinesePhonemesTokenizer", "JapanesePhonemeTokenizer"):
                try:
                    if cls_name == "IPATokenizer":
                        tok = build_ipa_tokenizer(name, tc, nemo_version, artifacts)
                    elif cls_name == "ChinesePhonemesTokenizer":
                        tok = build_chinese_tokenizer(name, tc, artifacts.read_text)
                    else:
                        tok = build_japanese_tokenizer(name, tc)
                except MetalgenError as e:
                    why = str(e).replace(f"Magpie tokenizer '{name}': ", "", 1)
                    unavailable[name] = f"its tokenizer '{name}' cannot be built: {why}"
                    sizes[name] = None
                else:
                    tokenizers[name] = tok
                    sizes[name] = len(tok.tokens)
            else:
                unavailable[name] = _unavailable_reason(name, tc)
                # Its size may still be knowable (byt5): later offsets need it.
                sizes[name] = unbuilt_size(tc, artifacts.read_text)

        mapping = cfg.get("language_to_tokenizer_mapping")
        language_map: Dict[str, str] = {}
        if mapping:
            table = {str(k): (v,) if isinstance(v, str) else tuple(v) for k, v in dict(mapping).items()}
        else:
            table = dict(LANGUAGE_TOKENIZER_MAP)
        for lang, candidates in table.items():
            for name in candidates:
                if name in sizes:
                    language_map[lang] = name
                    break
        return cls(order, tokenizers, unavailable, sizes, language_map, text_vocab_size)

    @property
    def languages(self) -> List[str]:
        """Every language the checkpoint maps to one of its tokenizers (including those `encode`
        refuses: byt5, or a phoneme tokenizer whose dictionary is missing)."""
        return sorted(self.language_map)

    @property
    def vocab_size(self) -> Optional[int]:
        """Text vocabulary including BOS and EOS (None while a tokenizer's size is unknown)."""
        return None if self.text_bos_id is None else self.text_bos_id + 2

    def tokenizer_name(self, language: str) -> str:
        if language not in self.language_map:
            have = ", ".join(self.languages) or "none"
            raise MetalgenError(f"this Magpie checkpoint has no tokenizer for language '{language}' (it has: {have})")
        return self.language_map[language]

    def encode(self, text: str, language: str) -> List[int]:
        """The ids fed to the model for `text`: tokenizer ids + offset, then the text EOS."""
        name = self.tokenizer_name(language)
        if name in self.unavailable:
            raise MetalgenError(f"Magpie language '{language}': {self.unavailable[name]}")
        if name in self._blocked_by or self.text_eos_id is None:
            before = self._blocked_by.get(name) or next(n for n in self.order if self.sizes[n] is None)
            raise MetalgenError(
                f"Magpie language '{language}': the ids of tokenizer '{name}' depend on the vocabulary size of "
                f"'{before}', and {self.unavailable[before].replace('its ', 'that ', 1)}"
            )
        offset = self.offsets[name]
        ids = [i + offset for i in self.tokenizers[name].encode(text)]
        if not ids:
            raise MetalgenError(f"Magpie: the text {text!r} has nothing to speak")
        return ids + [self.text_eos_id]
