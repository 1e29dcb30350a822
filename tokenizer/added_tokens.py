"""Added and special tokens: found in the text before any splitting, never broken up.

Follows tokenizers' AddedVocabulary: tokens flagged ``normalized=False`` are matched
on the raw text; the rest of the text is then normalized and tokens flagged
``normalized=True`` are matched on that. Matching is leftmost-longest and
non-overlapping; ``single_word`` rejects a match glued to word characters, ``lstrip`` /
``rstrip`` make the token swallow the whitespace beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable

import regex

# The Unicode White_Space / word-character classes of Rust's regex crate, which
# tokenizers uses for lstrip/rstrip/single_word (str.isspace also counts U+001C-1F).
_SPACE = regex.compile(r"\s")
_WORD = regex.compile(r"\w")


@dataclass(frozen=True)
class AddedToken:
    """One entry of tokenizer.json's ``added_tokens`` (or tokenizer_config's ``added_tokens_decoder``)."""

    id: int
    content: str
    special: bool = False
    single_word: bool = False
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False


class _Matcher:
    """Leftmost-longest search for a fixed set of token strings."""

    def __init__(self, tokens: dict[str, AddedToken]):
        self.tokens = tokens
        # Longest first: at one start position the regex takes the first alternative that
        # matches, which then is the longest one; the scan itself finds the leftmost start.
        # These are plain literals, so the stdlib engine (faster here) is enough.
        alternatives = sorted(tokens, key=len, reverse=True)
        self.pattern = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
        self._plain = not any(t.single_word or t.lstrip or t.rstrip for t in tokens.values())

    def split(self, text: str, out: list) -> None:
        """Append to ``out`` the pieces of ``text``: str for plain text, int for a token id."""
        if self.pattern is None:
            out.append(text)
            return
        pos = 0
        n = len(text)
        tokens = self.tokens
        for m in self.pattern.finditer(text):
            start, stop = m.span()
            if start < pos:  # inside whitespace an earlier rstrip token swallowed
                continue
            token = tokens[m.group()]
            if not self._plain:
                if token.single_word and (
                    (start > 0 and _WORD.match(text, start - 1)) or (stop < n and _WORD.match(text, stop))
                ):
                    continue
                if token.lstrip:
                    while start > pos and _SPACE.match(text, start - 1):
                        start -= 1
                if token.rstrip:
                    while stop < n and _SPACE.match(text, stop):
                        stop += 1
            if start > pos:
                out.append(text[pos:start])
            out.append(token.id)
            pos = stop
        if pos < n:
            out.append(text[pos:])


class AddedVocabulary:
    """Splits input text around added tokens and normalizes the text in between."""

    def __init__(self, tokens: Iterable[AddedToken], normalizer: Callable[[str], str] | None):
        self.tokens = sorted(tokens, key=lambda t: t.id)
        self.by_content = {t.content: t for t in self.tokens}
        self.by_id = {t.id: t for t in self.tokens}
        self.special_ids = frozenset(t.id for t in self.tokens if t.special)
        self._normalizer = normalizer
        self._matchers: dict[bool, tuple[_Matcher, _Matcher]] = {}

    def _get_matchers(self, split_special: bool) -> tuple[_Matcher, _Matcher]:
        matchers = self._matchers.get(split_special)
        if matchers is None:
            usable = [t for t in self.tokens if not (split_special and t.special)]
            raw = {t.content: t for t in usable if not t.normalized}
            norm = self._normalizer or (lambda s: s)
            normalized = {norm(t.content): t for t in usable if t.normalized}
            matchers = self._matchers[split_special] = (_Matcher(raw), _Matcher(normalized))
        return matchers

    def split(self, text: str, split_special_tokens: bool = False) -> list:
        """``text`` as a list of normalized text pieces (str) and added-token ids (int).

        With ``split_special_tokens`` the special tokens are left in the text as ordinary
        characters (tokenizers' ``encode_special_tokens``); other added tokens still match.
        """
        raw_matcher, norm_matcher = self._get_matchers(split_special_tokens)
        first: list = []
        raw_matcher.split(text, first)
        normalize = self._normalizer
        if normalize is None and norm_matcher.pattern is None:
            return first
        out: list = []
        for piece in first:
            if type(piece) is int:
                out.append(piece)
            else:
                if normalize is not None:
                    piece = normalize(piece)
                norm_matcher.split(piece, out)
        return out
