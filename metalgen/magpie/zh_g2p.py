"""NeMo's Mandarin front end (NeMo 3.0.0 `ChinesePhonemesTokenizer` over `ChineseG2p`), rebuilt.

Read from nemo/collections/common/tokenizers/text_to_speech/tts_tokenizers.py (ChinesePhonemesTokenizer)
and nemo/collections/tts/g2p/models/zh_cn_pinyin.py (ChineseG2p); restated, not copied.

Vocabulary (needs only the pinyin dictionary): space, optional silence, the dictionary's phonemes
(prefixed, in the phoneme case, sorted), the 5 tone marks (prefixed, sorted), the 26 ASCII letters in
the letter case (prefixed, sorted), `'` when `apostrophe`, the punctuation list when `punct`
(full-width marks then NeMo's default list), `<pad>`, optional `<blank>`, `<oov>`.

G2P (needs jieba, pypinyin and pypinyin-dict, as NeMo does: the optional extra `metalgen[zh]`):
the text in the ASCII letter case (`str.upper()` for the published configs), cut into words by
`jieba.cut` (when `word_segmenter: jieba`), each word through `pypinyin.lazy_pinyin(style=TONE3,
neutral_tone_with_five=True)` with pypinyin's single-character data replaced by pypinyin-dict's
CC-CEDICT (`cc_cedict.load()`, a process-wide change to pypinyin, as in NeMo) and every non-Chinese run
split into its characters. Then per item, on its last character: a tone digit 1-5 -> the syllable's
phonemes from the dictionary + the tone mark (a syllable not in the dictionary is skipped by NeMo with
an error log; a lone digit such as `2` is such an item, with the empty syllable); an ASCII letter in
the letter case -> the (prefixed) letter; anything else as it is (spaces, punctuation, other symbols).

`encode`: no preprocessing; per G2P symbol: a space is kept unless the previous kept symbol is a space
(so leading spaces and runs collapse); a symbol in the vocabulary that is alphanumeric, `'`, a phoneme,
tone or letter is kept; a punctuation mark of the list is kept when `punct`; trailing spaces are dropped;
`pad_with_space` adds one at each end. NeMo drops anything else with a warning, and skips unknown
syllables; the port raises a one-line MetalgenError naming them instead, because a silently dropped
sound changes what is spoken.
"""

from __future__ import annotations

import string
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import MetalgenError
from .g2p import set_case
from .text import SymbolTokenizer, append_specials, config_class, encode_from_g2p, reject_unknown_arguments

# ChinesePhonemesTokenizer.ZH_PUNCT_LIST: full-width marks, then NeMo's default (LJSpeech) list.
ZH_PUNCT = tuple("，。？！；：、‘’“”（）【】「」《》") + (
    ",", ".", "!", "?", "-", ":", ";", "/", '"', "(", ")", "[", "]", "{", "}")
INSTALL_HINT = "pip install 'metalgen[zh]'"

_TOKENIZER_ARGS = {"_target_", "g2p", "punct", "non_default_punct_list", "space", "silence", "apostrophe", "sep",
                   "add_blank_at", "pad_with_space", "text_preprocessing_func"}
# ChineseG2p's __call__ never uses word_tokenize_func, apply_to_oov_word or mapping_file.
_G2P_ARGS = {"_target_", "phoneme_dict", "phoneme_prefix", "phoneme_case", "tone_prefix", "ascii_letter_prefix",
             "ascii_letter_case", "word_tokenize_func", "apply_to_oov_word", "mapping_file", "word_segmenter"}


def parse_pinyin_dictionary(text: str, prefix: str, case: str) -> Dict[str, List[str]]:
    """ChineseG2p._parse_as_pinyin_dict: `syllable<TAB>phonemes` lines (`;;;` comments and blank lines
    skipped); the syllable lower-cased, the phonemes in `case`, split on whitespace and prefixed. A later
    line for the same syllable replaces the earlier one."""
    entries: Dict[str, List[str]] = {}
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if line.startswith(";;;") or not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            raise MetalgenError(
                f"the pinyin dictionary line {number} ({line.strip()!r}) has no tab-separated pronunciation")
        entries[parts[0].lower()] = [prefix + p for p in set_case(parts[1], case).split()]
    return entries


def _letters(case: str, prefix: str) -> Dict[str, str]:
    """ChineseG2p.ascii_letter_dict: get_grapheme_character_set('en-US', case) -> prefixed letter."""
    upper = string.ascii_uppercase
    alphabet = {"upper": upper, "lower": upper.lower(), "mixed": upper + upper.lower()}.get(case)
    if alphabet is None:
        raise MetalgenError(f"ascii_letter_case '{case}' is unknown (it is one of upper, lower, mixed)")
    return {c: prefix + c for c in alphabet}


def _g2p_settings(gc: Mapping[str, Any]) -> Tuple[str, str, str, str, str]:
    """(phoneme prefix, phoneme case, tone prefix, letter prefix, letter case) with NeMo's defaults."""
    return (gc.get("phoneme_prefix", "#") or "", gc.get("phoneme_case", "upper"), gc.get("tone_prefix", "#") or "",
            gc.get("ascii_letter_prefix", "") or "", gc.get("ascii_letter_case", "lower"))


def mandarin_tokens(tc: Mapping[str, Any], read_text: Callable[[str], str]) -> List[str]:
    """The token list of a ChinesePhonemesTokenizer config entry, its pinyin dictionary read through
    `read_text` (a `nemo:` reference -> the file's text)."""
    return _vocabulary(tc, _dictionary(tc, read_text))[0]


def _dictionary(tc: Mapping[str, Any], read_text: Callable[[str], str]) -> Dict[str, List[str]]:
    gc = tc.get("g2p") or {}
    ref = gc.get("phoneme_dict")
    if not isinstance(ref, str) or not ref:
        raise MetalgenError("its g2p has no phoneme_dict file")
    prefix, case = _g2p_settings(gc)[:2]
    set_case("", case)  # an unknown case fails here, as in NeMo
    return parse_pinyin_dictionary(read_text(ref), prefix, case)


def _vocabulary(tc: Mapping[str, Any], entries: Mapping[str, List[str]]):
    gc = tc.get("g2p") or {}
    _, _, tone_prefix, letter_prefix, letter_case = _g2p_settings(gc)
    phonemes = sorted({p for pron in entries.values() for p in pron})
    tones = {str(t): tone_prefix + str(t) for t in range(1, 6)}
    letters = _letters(letter_case, letter_prefix)
    tokens = [tc.get("space", " ") or " "]
    if tc.get("silence") is not None:
        tokens.append(tc["silence"])
    tokens += phonemes + sorted(tones.values()) + sorted(letters.values())
    if tc.get("apostrophe", True):
        tokens.append("'")
    punct_list: Sequence[str] = ()
    if tc.get("punct", True):
        punct = tc.get("non_default_punct_list")
        punct_list = tuple(ZH_PUNCT if punct is None else (str(p) for p in punct))
        tokens += list(punct_list)
    append_specials(tokens, tc.get("add_blank_at"))
    return tokens, phonemes, tones, letters, punct_list


# ------------------------------------------------------------------------------ jieba and pypinyin

_LOCK = threading.Lock()
_BACKEND: Optional[Tuple[Callable, Callable, Any]] = None


def _backend(name: str) -> Tuple[Callable, Callable, Any]:
    """(jieba.cut, pypinyin.lazy_pinyin, pypinyin.Style), imported on first use, with pypinyin's
    single-character data replaced by CC-CEDICT's as NeMo's ChineseG2p does."""
    global _BACKEND
    with _LOCK:
        if _BACKEND is None:
            try:
                import logging

                import jieba
                from pypinyin import Style, lazy_pinyin
                from pypinyin_dict.pinyin_data import cc_cedict
            except ImportError as e:
                raise MetalgenError(
                    f"the Magpie tokenizer '{name}' (Mandarin) needs jieba, pypinyin and pypinyin-dict, "
                    f"which are not installed ({e.name or e}): {INSTALL_HINT}") from None
            jieba.setLogLevel(logging.WARNING)  # its dictionary-building messages
            cc_cedict.load()
            _BACKEND = (jieba.cut, lazy_pinyin, Style)
        return _BACKEND


# ------------------------------------------------------------------------------ the tokenizer


class ChinesePhonemesTokenizer(SymbolTokenizer):
    """NeMo's ChinesePhonemesTokenizer + ChineseG2p, rebuilt: `tokens`, `pad_id`, `encode(text)`."""

    def __init__(self, name: str, tc: Mapping[str, Any], entries: Dict[str, List[str]]):
        gc = tc.get("g2p") or {}
        self.name = name
        self.cls = "ChinesePhonemesTokenizer"
        self.dictionary = entries
        self.tokens, phonemes, self.tone_dict, self.letter_dict, self.punct_list = _vocabulary(tc, entries)
        self.letter_case = _g2p_settings(gc)[4]
        self.segmenter = gc.get("word_segmenter")
        self.space = self.tokens[0]
        self.punct = bool(tc.get("punct", True))
        self.pad_with_space = bool(tc.get("pad_with_space", False))
        self.pad_id = self.tokens.index("<pad>")
        self.ids = {t: i for i, t in enumerate(self.tokens)}  # a repeated symbol keeps its last id, as in NeMo
        self._g2p_symbols = set(phonemes) | set(self.tone_dict.values()) | set(self.letter_dict.values())

    def pinyin(self, text: str) -> List[str]:
        """pypinyin's items for `text` (already in the letter case): TONE3 syllables, other characters alone."""
        cut, lazy_pinyin, style = _backend(self.name)
        words = cut(text) if self.segmenter == "jieba" else [text]
        seq: List[str] = []
        for word in words:
            seq += lazy_pinyin(word, style=style.TONE3, neutral_tone_with_five=True, errors=lambda run: list(run))
        return seq

    def g2p(self, text: str) -> Tuple[List[str], List[str]]:
        """(ChineseG2p's output, the pinyin items NeMo skips because their syllable is not in the dictionary)."""
        out: List[str] = []
        skipped: List[str] = []
        for item in self.pinyin(set_case(text, self.letter_case)):
            last = item[-1]
            if last in self.tone_dict:
                syllable = item[:-1]
                if syllable not in self.dictionary:
                    skipped.append(item)
                    continue
                out += self.dictionary[syllable]
                out.append(self.tone_dict[last])
            elif last in self.letter_dict:
                out.append(self.letter_dict[last])
            else:
                out.append(item)
        return out, skipped

    def symbols(self, text: str) -> Tuple[List[str], List[str]]:
        """(the kept symbols, the ones NeMo skips or drops, in order of first appearance)."""
        g2p_out, skipped = self.g2p(text)
        return encode_from_g2p(self, g2p_out, list(dict.fromkeys(skipped)))


def build_chinese_tokenizer(name: str, tc: Mapping[str, Any], read_text: Callable[[str], str]) -> ChinesePhonemesTokenizer:
    """A ChinesePhonemesTokenizer from its config entry, its pinyin dictionary read through `read_text`.
    Building needs only the dictionary; encoding imports jieba and pypinyin."""
    gc = tc.get("g2p") or {}
    g2p_cls = config_class(gc)
    if g2p_cls != "ChineseG2p":
        raise MetalgenError(f"Magpie tokenizer '{name}': a ChinesePhonemesTokenizer over {g2p_cls or 'no G2P'} "
                            "is not supported")
    reject_unknown_arguments(name, "ChinesePhonemesTokenizer", tc, _TOKENIZER_ARGS, _G2P_ARGS)
    segmenter = gc.get("word_segmenter")
    if segmenter not in (None, "jieba"):
        raise MetalgenError(f"Magpie tokenizer '{name}': word_segmenter {segmenter!r} is not supported (jieba is)")
    try:
        entries = _dictionary(tc, read_text)
    except MetalgenError as e:
        raise MetalgenError(f"Magpie tokenizer '{name}': {e}") from None
    return ChinesePhonemesTokenizer(name, tc, entries)
