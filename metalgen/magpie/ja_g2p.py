"""NeMo's Japanese front end (NeMo 3.0.0 `JapanesePhonemeTokenizer` over `JapaneseKatakanaAccentG2p`), rebuilt.

Read from nemo/collections/common/tokenizers/text_to_speech/tts_tokenizers.py (JapanesePhonemeTokenizer),
nemo/collections/tts/g2p/models/ja_jp_ipa.py (JapaneseKatakanaAccentG2p) and ipa_lexicon.py (the ja-JP
katakana and punctuation sets); restated, not copied.

Vocabulary (needs nothing but the config): space, optional silence, the 85 katakana of NeMo's ja-JP grapheme
set and the pitch marks `0` `1` (sorted together), the 26 ASCII letters in the letter case (sorted, never
prefixed: NeMo lists the letter table's keys), `'` when `apostrophe`, the punctuation list when `punct` (the
ja-JP list, sorted, `・・・` included; `ー` is both a katakana and a mark and keeps the mark's id), `<pad>`,
optional `<blank>`, `<oov>`.

G2P (needs pyopenjtalk and its open_jtalk 1.11 UTF-8 dictionary, as NeMo does: the optional extra
`metalgen[ja]`): the text lower-cased (the tokenizer's preprocessing), then put in the ASCII letter case, then
`pyopenjtalk.run_frontend`. Per NJD word, its surface NFKC-normalized:
- all ASCII letters of the letter case and part of speech フィラー (OpenJTalk spelled it, not read it): the
  letters themselves;
- a symbol (記号/補助記号, but not アルファベット): whitespace -> one space (never two in a row); a mark of the
  ja-JP list -> itself; any other symbol -> a space (NeMo logs it);
- no pronunciation or no morae: a space when the surface is not blank (NeMo logs it), else nothing; an
  accent chain open before it stays open;
- else the word joins the current accent chain, which is closed unless the next word's chain_flag is 1.
Closing a chain splits its words' pronunciations into morae (a katakana with an optional small ャュョァィゥェォヮ,
a lone small kana, or ー) and puts a pitch mark before each: the accent of the chain's first word whose
chain_flag is not 1 (else its first word) over the chain's mora count: 0 -> L H H...; 1 -> H L L...;
at or past the last mora -> L H H...; else L, H up to the accent mora, then L.

`encode`: per G2P symbol, as NeMo's other phoneme tokenizers: a space is kept unless the previous kept symbol
is a space; a vocabulary symbol that is alphanumeric, `'`, a katakana, pitch mark or letter is kept; a mark of
the tokenizer's punctuation list is kept; trailing spaces are dropped; `pad_with_space` adds one at each end.
NeMo drops anything else with a warning (a katakana outside its set such as ヰ, a mark missing from a
`non_default_punct_list`); the port raises a one-line MetalgenError naming them instead, because a silently
dropped symbol changes what is spoken. The symbols NeMo's G2P turns into a space (`@`, `#`, `…` once NFKC has
made it `...`, an emoji, a kanji the dictionary lacks) stay spaces here too: that is NeMo's deliberate pause,
and the ids stay equal to its.
"""

from __future__ import annotations

import os
import re
import string
import threading
import unicodedata
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ..errors import MetalgenError
from .g2p import set_case
from .text import (DEFAULT_PUNCT, SymbolTokenizer, append_specials, config_class, encode_from_g2p,
                   reject_unknown_arguments)

# ipa_lexicon.GRAPHEME_CHARACTER_SETS["ja-JP"]: basic katakana, voiced and semi-voiced, small kana, the long
# vowel mark. Only the set matters (NeMo sorts it into the vocabulary).
JA_KANA = (
    "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲン"
    "ガギグゲゴザジズゼゾダヂヅデドバビブベボパピプペポヴ"
    "ァィゥェォャュョッヮヵヶ"
    "ー"
)
PITCH_MARKS = ("0", "1")
# ipa_lexicon.get_ipa_punctuation_list("ja-JP"): the default (LJSpeech) marks, the guillemets and the Japanese
# typographic symbols, sorted; one entry is three characters long.
_JA_MARKS = (
    "【", "】", "…", "‥", "「", "」", "『", "』", "〜", "。", "、", "ー", "・・・", "〃", "〔", "〕", "｟", "｠",
    "〈", "〉", "《", "》", "〖", "〗", "〘", "〙", "〚", "〛", "•", "◦", "﹅", "﹆", "※", "＊", "〽", "〓",
    "〒", "！", "？", "・",
)
JA_PUNCT = tuple(sorted(set(DEFAULT_PUNCT) | set("«»‹›") | set(_JA_MARKS)))
INSTALL_HINT = "pip install 'metalgen[ja]'"
DICTIONARY = "open_jtalk_dic_utf_8-1.11"

_SYMBOL_POS = ("記号", "補助記号")
_SPELLED_POS = "フィラー"
_ALPHABET_GROUP = "アルファベット"
# A mora: a full-size katakana (ア..ン, ヴ) with an optional small glide or vowel, a lone small kana, or ー.
_MORA = re.compile("[\u30a2-\u30f3\u30f4][ャュョァィゥェォヮ]?|[ァィゥェォヵヶッャュョヮ]|ー")

_TOKENIZER_ARGS = {"_target_", "g2p", "punct", "non_default_punct_list", "space", "silence", "apostrophe", "sep",
                   "add_blank_at", "pad_with_space", "text_preprocessing_func"}
# JapaneseKatakanaAccentG2p's __call__ never uses word_tokenize_func, apply_to_oov_word or mapping_file.
_G2P_ARGS = {"_target_", "ascii_letter_prefix", "ascii_letter_case", "word_tokenize_func", "apply_to_oov_word",
             "mapping_file"}


def pitch_pattern(accent: int, morae: int) -> List[int]:
    """The pitch (0 low, 1 high) of each of an accent chain's `morae`, given its accent nucleus."""
    if morae == 0:
        return []
    if accent == 0:  # heiban
        return [0] + [1] * (morae - 1)
    if accent == 1:  # atamadaka
        return [1] + [0] * (morae - 1)
    if accent >= morae:  # odaka: no fall inside the chain
        return [0] + [1] * (morae - 1)
    return [0] + [1] * (accent - 1) + [0] * (morae - accent)  # nakadaka


def split_morae(katakana: str) -> List[str]:
    """The morae of a katakana pronunciation (characters outside the pattern are skipped, as in NeMo)."""
    return _MORA.findall(katakana)


def _letters(case: str) -> str:
    """get_grapheme_character_set('en-US', case)."""
    upper = string.ascii_uppercase
    letters = {"upper": upper, "lower": upper.lower(), "mixed": upper + upper.lower()}.get(case)
    if letters is None:
        raise MetalgenError(f"ascii_letter_case '{case}' is unknown (it is one of upper, lower, mixed)")
    return letters


# ------------------------------------------------------------------------------ pyopenjtalk

_LOCK = threading.Lock()
_FRONTEND: Optional[Callable[[str], List[Dict[str, Any]]]] = None


def _frontend(name: str) -> Callable[[str], List[Dict[str, Any]]]:
    """pyopenjtalk.run_frontend, imported on first use, once its dictionary is known to be on disk (pyopenjtalk
    would otherwise try to download it inside the first call)."""
    global _FRONTEND
    with _LOCK:
        if _FRONTEND is None:
            try:
                import pyopenjtalk
            except ImportError as e:
                raise MetalgenError(
                    f"the Magpie tokenizer '{name}' (Japanese) needs pyopenjtalk, which is not installed "
                    f"({e.name or e}): {INSTALL_HINT}") from None
            folder = pyopenjtalk.OPEN_JTALK_DICT_DIR
            folder = folder.decode("utf-8") if isinstance(folder, bytes) else str(folder)
            if not os.path.isfile(os.path.join(folder, "sys.dic")):
                raise MetalgenError(
                    f"the Magpie tokenizer '{name}' (Japanese) needs pyopenjtalk's dictionary {DICTIONARY}, which is "
                    f"not at {folder}: set OPEN_JTALK_DICT_DIR to it, or let pyopenjtalk download it once "
                    "(python -c \"import pyopenjtalk; pyopenjtalk.g2p('あ')\")")
            try:
                pyopenjtalk.run_frontend("あ")
            except Exception as e:  # a broken dictionary folder: OpenJTalk's own error
                raise MetalgenError(
                    f"the Magpie tokenizer '{name}' (Japanese): pyopenjtalk cannot load its dictionary at "
                    f"{folder}: {e}") from None
            _FRONTEND = pyopenjtalk.run_frontend
        return _FRONTEND


def njd_word_count(text: str) -> Optional[int]:
    """The words pyopenjtalk's front end finds in `text` (entries with a non-blank surface string), which NeMo's
    long-text chunking counts for Japanese; None where pyopenjtalk or its dictionary is missing (NeMo then
    counts characters)."""
    try:
        run = _frontend("japanese_phoneme")
    except MetalgenError:
        return None
    return sum(1 for w in run(text) if isinstance(w, dict) and str(w.get("string", "")).strip())


# ------------------------------------------------------------------------------ the tokenizer


class JapanesePhonemeTokenizer(SymbolTokenizer):
    """NeMo's JapanesePhonemeTokenizer + JapaneseKatakanaAccentG2p, rebuilt: `tokens`, `pad_id`, `encode(text)`."""

    def __init__(self, name: str, tc: Mapping[str, Any]):
        gc = tc.get("g2p") or {}
        self.name = name
        self.cls = "JapanesePhonemeTokenizer"
        self.letter_case = gc.get("ascii_letter_case", "lower")
        self.letters = frozenset(_letters(self.letter_case))
        self.space = tc.get("space", " ") if tc.get("space", " ") is not None else " "
        self.punct = bool(tc.get("punct", True))
        self.pad_with_space = bool(tc.get("pad_with_space", False))
        symbols = sorted(set(JA_KANA) | set(PITCH_MARKS))
        tokens = [self.space]
        if tc.get("silence") is not None:
            tokens.append(tc["silence"])
        tokens += symbols + sorted(self.letters)
        if tc.get("apostrophe", True):
            tokens.append("'")
        punct = tc.get("non_default_punct_list")
        self.punct_list: Tuple[str, ...] = JA_PUNCT if punct is None else tuple(str(p) for p in punct)
        tokens += list(self.punct_list)
        append_specials(tokens, tc.get("add_blank_at"))
        self.tokens = tokens
        self.pad_id = tokens.index("<pad>")
        self.ids = {t: i for i, t in enumerate(tokens)}  # a repeated symbol keeps its last id, as in NeMo
        self._g2p_symbols = frozenset(symbols) | self.letters
        self._g2p_punct = frozenset(JA_PUNCT)  # the G2P keeps the ja-JP marks whatever the tokenizer's list

    def g2p(self, text: str) -> Tuple[List[str], List[str]]:
        """(JapaneseKatakanaAccentG2p's output for the tokenizer-preprocessed `text`, the surfaces it turned
        into a space)."""
        words = _frontend(self.name)(set_case(text.lower(), self.letter_case))
        out: List[str] = []
        spaced: List[str] = []
        chain: List[Tuple[str, int, int]] = []  # (pronunciation, accent, chain_flag)

        def close_chain() -> None:
            if not chain:
                return
            head = next((w for w in chain if w[2] != 1), chain[0])
            morae = [m for pron, _, _ in chain for m in split_morae(pron)]
            for mora, pitch in zip(morae, pitch_pattern(head[1], len(morae))):
                out.append(str(pitch))
                out.extend(mora)
            chain.clear()

        def pause(surface: str) -> None:
            spaced.append(surface)
            if not out or out[-1] != " ":
                out.append(" ")

        for i, word in enumerate(words):
            pron = word.get("pron", "")
            pos = word.get("pos", "")
            surface = unicodedata.normalize("NFKC", word.get("string", ""))
            if surface and pos == _SPELLED_POS and all(c in self.letters for c in surface):
                close_chain()
                out.extend(surface)
                continue
            if pos in _SYMBOL_POS and word.get("pos_group1", "") != _ALPHABET_GROUP:
                close_chain()
                if surface.isspace():
                    if not out or out[-1] != " ":
                        out.append(" ")
                elif surface in self._g2p_punct:
                    out.append(surface)
                else:
                    pause(surface)
                continue
            if not pron or word.get("mora_size", 0) == 0:
                if surface and not surface.isspace():
                    pause(surface)
                continue
            chain.append((pron, word.get("acc", 0), word.get("chain_flag", 0)))
            if not (i + 1 < len(words) and words[i + 1].get("chain_flag", 0) == 1):
                close_chain()
        close_chain()
        return out, spaced

    def symbols(self, text: str) -> Tuple[List[str], List[str]]:
        """(the kept symbols, the ones NeMo's tokenizer drops, in order of first appearance)."""
        g2p_out, _ = self.g2p(text)  # punct is always on (build_japanese_tokenizer)
        return encode_from_g2p(self, g2p_out, [])


def build_japanese_tokenizer(name: str, tc: Mapping[str, Any]) -> JapanesePhonemeTokenizer:
    """A JapanesePhonemeTokenizer from its config entry. Building needs nothing installed; encoding imports
    pyopenjtalk and reads its dictionary."""
    gc = tc.get("g2p") or {}
    g2p_cls = config_class(gc)
    if g2p_cls != "JapaneseKatakanaAccentG2p":
        what = "JapaneseG2p (janome and an IPA dictionary)" if g2p_cls == "JapaneseG2p" else (g2p_cls or "no G2P")
        raise MetalgenError(f"Magpie tokenizer '{name}': a JapanesePhonemeTokenizer over {what} is not supported "
                            "(JapaneseKatakanaAccentG2p is)")
    reject_unknown_arguments(name, "JapanesePhonemeTokenizer", tc, _TOKENIZER_ARGS, _G2P_ARGS)
    if not tc.get("punct", True):
        # NeMo 3.0.0 then has no punctuation list at all, and its encode fails on the first mark or repeated space.
        raise MetalgenError(f"Magpie tokenizer '{name}': a JapanesePhonemeTokenizer with punct: false is not supported")
    try:
        return JapanesePhonemeTokenizer(name, tc)
    except MetalgenError as e:
        raise MetalgenError(f"Magpie tokenizer '{name}': {e}") from None

