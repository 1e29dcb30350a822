"""NeMo's dictionary G2P (`IpaG2p`, NeMo 3.0.0) without NeMo: text -> a list of IPA symbols and graphemes.

Read from nemo/collections/tts/g2p/models/i18n_ipa.py and
nemo/collections/common/tokenizers/text_to_speech/tokenizer_utils.py; restated here, not copied.

The pipeline for one text (already preprocessed by the tokenizer):

1. NFC, then a word split. A "word" starts and ends with a word character and may hold hyphens and
   apostrophes inside; `|...|` spans pass through untouched; every other run of characters
   (spaces, punctuation, digits, letters outside the word alphabet) is one more chunk. English's word
   alphabet is ASCII letters and its words are lower-cased here; the other locales also take Latin-1
   accented letters, Devanagari and the other Indic blocks, and Hangul. A `|` without a closing `|`
   matches nothing and vanishes in NeMo.
2. Each chunk goes through `parse_one_word`: after applying the grapheme case, a chunk without any
   word character or digit is emitted as its characters; a heteronym stays as graphemes; en-US
   derives `X's` / `Xs` from `X` plus /s/, /z/ or /ɪz/; a dictionary word gives its first
   pronunciation (or none, if ambiguous words are ignored); the mixed-case German dictionary also
   matches the upper-cased word; anything else is spelled as graphemes (each with the grapheme
   prefix) and counts as unhandled, and an unhandled chunk holding `-` is split there and retried
   part by part.

NeMo also keeps a word as graphemes with probability 1 - `phoneme_probability`, drawn from an unseeded
RNG. The port never does (docs/magpie.md 3.2): it behaves as with probability 1.0.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..errors import MetalgenError

# The locales NeMo's ipa_lexicon.validate_locale accepts.
SUPPORTED_LOCALES = ("en-US", "de-DE", "es-ES", "it-IT", "fr-FR", "vi-VN", "ja-JP", "hi-IN", "ar-MSA", "pt-BR", "ko-KR")

# Character classes of tokenizer_utils (regex class bodies). The Devanagari range leaves out the danda
# and double danda (U+0964/5) so that they stay punctuation.
_ASCII_LETTERS = "A-Za-z"
_LATIN = _ASCII_LETTERS + "\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u00ff"
_INDIC = (
    "\u0900-\u0963\u0966-\u097f"  # Devanagari
    "\u0980-\u09ff"  # Bengali
    "\u0b80-\u0bff"  # Tamil
    "\u0c00-\u0c7f"  # Telugu
    "\u0c80-\u0cff"  # Kannada
    "\u0a80-\u0aff"  # Gujarati
)
_KOREAN = "\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f"
WORD_CHARS = _LATIN + _INDIC + _KOREAN

# A chunk is "a word" for parse_one_word when it holds a word character or a (Unicode) digit.
_HAS_WORD_CHAR = re.compile(f"[{WORD_CHARS}\\d]")
# What is stripped from a dictionary word before its graphemes join the symbol set.
_NOT_WORD_CHAR = re.compile(f"[^{WORD_CHARS}\\d]")
# Dictionary lines start with one of these (others, e.g. ";;;" comments, are skipped).
_ENTRY_START = re.compile(f"[{_LATIN}{_INDIC}{_KOREAN}']")
_VARIANT_MARK = re.compile(r"\([0-9]+\)")


def _word_splitter(letters: str) -> "re.Pattern[str]":
    # Alternatives in NeMo's order: a word (letter first and last, letters / "-" / "'" between; greedy,
    # so the longest such span), a |...| span, or a run of anything else except "|".
    return re.compile(f"([{letters}](?:[{letters}'\\-]*[{letters}])?)|(\\|[^|]*\\|)|([^{letters}|]+)")


_SPLIT_EN = _word_splitter(_ASCII_LETTERS)
_SPLIT_ANY = _word_splitter(WORD_CHARS)

STRESS_MARKS = ("ˈ", "ˌ")

# fr-FR elided prefixes (grapheme, phonemes) that IpaG2p strips before a dictionary lookup.
_FRENCH_ELISIONS = (
    ("l", "l"), ("c", "s"), ("d", "d"), ("j", "ʒ"), ("m", "m"), ("n", "n"), ("qu", "k"), ("s", "s"),
    ("t", "t"), ("puisqu", "pyisk"), ("lorsqu", "loʁsk"), ("jusqu", "ʒysk"),
)


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def set_case(text: str, case: str) -> str:
    """nemo.collections.tts.g2p.utils.set_grapheme_case: 'upper', 'lower' or 'mixed' (unchanged)."""
    if case == "upper":
        return text.upper()
    if case == "lower":
        return text.lower()
    if case == "mixed":
        return text
    raise MetalgenError(f"grapheme case '{case}' is unknown (it is one of upper, lower, mixed)")


Chunk = Tuple[List[str], bool]  # (the chunk, or a |...| span's words; whether it passes unchanged)


def split_words(text: str, english: bool) -> Tuple[List[Chunk], List[str]]:
    """(chunks, stray bars): NeMo's english_word_tokenize / any_locale_word_tokenize, plus every `|`
    that no `|...|` span took (NeMo loses those silently)."""
    pattern = _SPLIT_EN if english else _SPLIT_ANY
    chunks: List[Chunk] = []
    stray: List[str] = []
    pos = 0
    for m in pattern.finditer(text):
        stray.extend("|" for c in text[pos:m.start()] if c == "|")
        pos = m.end()
        word, span, other = m.groups()
        if word is not None:
            chunks.append(([word.lower() if english else word], False))
        elif span is not None:
            chunks.append((span[1:-1].split(" "), True))
        else:
            chunks.append(([other], False))
    stray.extend("|" for c in text[pos:] if c == "|")
    return chunks, stray


# ------------------------------------------------------------------------------ dictionaries

Pronunciations = Dict[str, List[List[str]]]


def parse_dictionary(text: str, source: str = "dictionary") -> Pronunciations:
    """A CMUdict-style IPA dictionary (NeMo's file format) -> {word: [variant, ...]}, in file order.

    A line is taken when it starts with a letter of the word alphabets or an apostrophe: the first
    whitespace-separated field is the word (a `(2)` variant mark removed), the rest with all
    whitespace removed is the pronunciation, one symbol per character. Other lines are skipped."""
    entries: Pronunciations = {}
    # NFC of the whole text equals NFC line by line (a line break never composes), and is one call.
    for number, line in enumerate(file_lines(nfc(text)), 1):
        if not line or not _ENTRY_START.match(line[0]):
            continue
        parts = line.strip().split(maxsplit=1)
        if len(parts) < 2:
            raise MetalgenError(f"{source}, line {number}: the entry {parts[0]!r} has no pronunciation")
        word = _VARIANT_MARK.sub("", parts[0]) if "(" in parts[0] else parts[0]
        # str.split() and re's \s agree on what whitespace is.
        entries.setdefault(word, []).append(list("".join(parts[1].split())))
    return entries


def file_lines(text: str) -> List[str]:
    """The lines Python's text-mode file iteration yields (\r\n and \r read as \n; no other breaks)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def merge_dictionaries(sources: Sequence[Pronunciations]) -> Pronunciations:
    """Several dictionaries as one (NeMo's list form): a word's variants in source order."""
    if len(sources) == 1:
        return sources[0]
    merged: Pronunciations = {}
    for source in sources:
        for word, variants in source.items():
            merged.setdefault(word, []).extend(variants)
    return merged


def parse_heteronyms(text: str) -> List[str]:
    """A heteronym file: one word per line, trailing whitespace removed (blank lines kept, harmlessly)."""
    lines = file_lines(text)
    if lines and lines[-1] == "":
        lines.pop()  # the end of the last line, not a line
    return [line.rstrip() for line in lines]


# ------------------------------------------------------------------------------ the G2P


class IpaG2p:
    """NeMo's IpaG2p with phoneme probability 1.0: `g2p(text)` -> symbols; `symbols` is its vocabulary
    (every phoneme of the dictionary, plus the prefixed graphemes of its words when `use_chars`)."""

    def __init__(
        self,
        dictionary: Pronunciations,
        locale: Optional[str] = "en-US",
        heteronyms: Optional[Iterable[str]] = None,
        use_chars: bool = False,
        use_stresses: bool = True,
        grapheme_case: str = "upper",
        grapheme_prefix: str = "",
        ignore_ambiguous_words: bool = True,
    ):
        if locale is not None and locale not in SUPPORTED_LOCALES:
            raise MetalgenError(f"G2P locale '{locale}' is unknown (NeMo knows {', '.join(SUPPORTED_LOCALES)})")
        if not dictionary:
            raise MetalgenError("the G2P dictionary has no entries")
        set_case("", grapheme_case)  # validates the case name
        self.locale = locale
        self.use_chars = bool(use_chars)
        self.use_stresses = bool(use_stresses)
        self.grapheme_case = grapheme_case
        self.grapheme_prefix = grapheme_prefix or ""
        self.ignore_ambiguous_words = bool(ignore_ambiguous_words)
        self.english = locale == "en-US"
        self.words, self.symbols = self._normalize(dictionary)
        # An empty heteronym list behaves as none; the words are compared in the grapheme case.
        self.heteronyms: Set[str] = {set_case(w, grapheme_case) for w in heteronyms or ()}

    def _normalize(self, dictionary: Pronunciations) -> Tuple[Pronunciations, Set[str]]:
        words: Pronunciations = {}
        symbols: Set[str] = set()
        mixed = self.grapheme_case == "mixed"
        for word, variants in dictionary.items():
            key = set_case(word, self.grapheme_case)
            if self.use_chars:
                symbols.update(self.graphemes(_NOT_WORD_CHAR.sub("", key)))
            if not self.use_stresses:
                variants = [[s for s in v if s not in STRESS_MARKS] for v in variants]
            for v in variants:
                symbols.update(v)
            # Two spellings that meet in one case: the later entry replaces the earlier one, as in NeMo.
            words[key] = variants
            # Mixed case also files a word under its upper-case form, so "HALLO" finds "Hallo"; the
            # upper-case letters do not join the symbols for that.
            if mixed and not key.isupper():
                words[key.upper()] = variants
        return words, symbols

    def graphemes(self, word: str) -> List[str]:
        return [self.grapheme_prefix + c for c in word]

    def _usable(self, word: str) -> bool:
        return not self.ignore_ambiguous_words or len(self.words[word]) == 1

    def _part_key(self, word: str, part: str) -> Optional[str]:
        """The dictionary key of `part` (a piece of `word`, as given or upper-cased) when `word`
        itself is not in the dictionary and that entry is usable, else None."""
        if word in self.words or word.upper() in self.words:
            return None
        for key in (part, part.upper()):
            if key in self.words:
                return key if self._usable(key) else None
        return None

    def parse_word(self, word: str) -> Tuple[List[str], bool]:
        """(symbols, handled) for one chunk, as IpaG2p.parse_one_word with phoneme probability 1."""
        word = set_case(word, self.grapheme_case)
        if not _HAS_WORD_CHAR.search(word):
            return list(word), True
        if word in self.heteronyms:
            return self.graphemes(word), True
        if self.english:
            if len(word) > 2 and word[-2:] in ("'s", "'S"):
                stem = self._part_key(word, word[:-2])
                if stem is not None:
                    last = stem[-1]
                    tail = ["s"] if last in "Tt" else ["ɪ", "z"] if last in "Ss" else ["z"]
                    return self.words[stem][0] + tail, True
            if len(word) > 1 and word[-1] in "sS":
                stem = self._part_key(word, word[:-1])
                if stem is not None:
                    return self.words[stem][0] + (["s"] if stem[-1] in "Tt" else ["z"]), True
        if self.locale == "fr-FR":
            for prefix, sounds in _FRENCH_ELISIONS:
                starter = prefix + "'"
                if len(word) > 2 and (word.startswith(starter) or word.startswith(starter.upper())):
                    stem = self._part_key(word, word[len(starter):])
                    if stem is not None:
                        return list(sounds) + self.words[stem][0], True
        if word in self.words and self._usable(word):
            return self.words[word][0], True
        if self.grapheme_case == "mixed" and word not in self.words and word.upper() in self.words:
            # NeMo spells an ambiguous word in its upper-case form when it ignores ambiguous words.
            word = word.upper()
            if self._usable(word):
                return self.words[word][0], True
        return self.graphemes(word), False

    def __call__(self, text: str) -> Tuple[List[str], List[str]]:
        """(symbols, stray `|` characters) for `text`."""
        chunks, stray = split_words(nfc(text), self.english)
        out: List[str] = []
        for words, unchanged in chunks:
            if unchanged:
                out.extend(self.grapheme_prefix + w for w in words)
                continue
            word = words[0]
            symbols, handled = self.parse_word(word)
            if not handled and "-" in word:
                # An out-of-dictionary compound: each part on its own, joined by "-".
                symbols = []
                for i, part in enumerate(word.split("-")):
                    if i:
                        symbols.append("-")
                    symbols.extend(self.parse_word(part)[0])
            out.extend(symbols)
        return out, stray
