"""Text to pre-tokens: Unicode normalization, the regex split, and the byte-level alphabet.

These are the steps Hugging Face ``tokenizers`` runs between the added-token split
and the BPE model for the Qwen family (normalizer ``NFC``; pre-tokenizer
``Split(pattern, Isolated)`` followed by ``ByteLevel(use_regex=False)``). Qwen2 to Qwen3
share one split pattern; Qwen3.5 changed it (``QWEN35_PATTERN``).
"""

from __future__ import annotations

import unicodedata
from bisect import bisect_right
from functools import lru_cache
from typing import Callable

import regex

from ._unicode_tables import (
    LETTER_RANGES,
    MARK_RANGES,
    NORMALIZATION_BARRIERS,
    NUMBER_RANGES,
    RECENT_MARK_RANGES,
    RECENT_RANGES,
)
from .errors import TokenizerError

# The split pattern Qwen2, Qwen2.5 and Qwen3 ship. Differences from GPT-2's: contractions
# are case-insensitive, digits are split one per pre-token, and a letter run may take one
# leading non-letter (so "(foo" -> "(foo", " foo" -> " foo").
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The split pattern of Qwen3.5 (transformers' Qwen3_5Tokenizer). Combining marks (\p{M}) count
# as part of a word: Qwen2's pattern cuts a word at every mark ("हिन्दी" -> "ह" "िन" "्द" "ी",
# a mark leading the next letters or standing alone), where this one keeps the word whole.
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# GPT-2's pattern, used by a plain ``ByteLevel(use_regex=True)`` pre-tokenizer.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

_NORMALIZATION_FORMS = {"NFC", "NFD", "NFKC", "NFKD"}


def bytes_to_unicode() -> list[str]:
    """The byte-level alphabet: byte value -> the printable character that stands for it.

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space,
    NBSP, soft hyphen) are moved to U+0100 onwards in byte order, so every vocab entry is
    a visible string with no whitespace (a space is ``Ġ``, a newline ``Ċ``).
    """
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept = set(keep)
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in kept:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


BYTE_TO_CHAR: list[str] = bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}


@lru_cache(maxsize=1)
def _barrier_regex() -> regex.Pattern:
    return regex.compile(f"([{_class_body(NORMALIZATION_BARRIERS)}])")


def make_normalizer(config: dict | None) -> Callable[[str], str] | None:
    """Build the normalization function for a tokenizer.json ``normalizer`` entry.

    Only the Unicode normalization forms (alone or in a ``Sequence``) are supported, which
    is all byte-level BPE tokenizers use; anything else raises ``TokenizerError``.
    """
    if config is None:
        return None
    kind = config.get("type")
    if kind in _NORMALIZATION_FORMS:
        form = kind
        barriers = _barrier_regex()

        def normalize(text: str, _form=form) -> str:
            # is_normalized is a cheap quick check, and most text is already normalized.
            # (When Python's newer data calls text normalized, the reference's older data
            # would not change it either: it knows a subset of the same marks.)
            if unicodedata.is_normalized(_form, text):
                return text
            if barriers.search(text) is None:
                return unicodedata.normalize(_form, text)
            # Marks the reference's tables do not know act as starters there: normalize
            # the runs between them separately and keep them as they are.
            parts = barriers.split(text)
            parts[::2] = [unicodedata.normalize(_form, p) for p in parts[::2]]
            return "".join(parts)

        return normalize
    if kind == "Sequence":
        steps = [make_normalizer(c) for c in config.get("normalizers", [])]
        steps = [s for s in steps if s is not None]
        if not steps:
            return None
        if len(steps) == 1:
            return steps[0]

        def normalize_all(text: str) -> str:
            for step in steps:
                text = step(text)
            return text

        return normalize_all
    raise TokenizerError(f"unsupported normalizer type {kind!r} in tokenizer.json (supported: NFC, NFD, NFKC, NFKD, Sequence)")


def split_pattern(config: dict | None) -> str | None:
    """The split regex a tokenizer.json ``pre_tokenizer`` entry uses (None: no splitting).

    Reads the pattern of a ``Split`` step (Qwen's case); a lone ``ByteLevel`` uses GPT-2's
    pattern with ``use_regex`` and none without; no pre_tokenizer at all falls back to
    Qwen2's pattern. (vocab.json + merges.txt folders come with the pre_tokenizer that
    ``loading.fallback_pipeline`` picks for their tokenizer_class.)
    """
    if config is None:
        return QWEN2_PATTERN
    steps = config.get("pretokenizers", []) if config.get("type") == "Sequence" else [config]
    found = None
    byte_level = False
    for step in steps:
        kind = step.get("type")
        if kind == "Split":
            if found is not None:
                raise TokenizerError("unsupported pre_tokenizer in tokenizer.json: more than one regex split step")
            behavior = step.get("behavior", "Isolated")
            if behavior != "Isolated" or step.get("invert", False):
                raise TokenizerError(
                    f"unsupported Split pre_tokenizer in tokenizer.json: behavior {behavior!r}, "
                    f"invert {step.get('invert', False)!r} (only Isolated, not inverted)"
                )
            pattern = step.get("pattern") or {}
            if "Regex" in pattern:
                found = pattern["Regex"]
            elif "String" in pattern:
                found = regex.escape(pattern["String"])
            else:
                raise TokenizerError("malformed tokenizer.json: Split pre_tokenizer has no Regex or String pattern")
        elif kind == "ByteLevel":
            byte_level = True
            if step.get("add_prefix_space", False):
                raise TokenizerError("unsupported pre_tokenizer in tokenizer.json: ByteLevel with add_prefix_space")
            if step.get("use_regex", True):
                if found is not None:
                    raise TokenizerError("unsupported pre_tokenizer in tokenizer.json: a Split step and a ByteLevel step with use_regex")
                found = GPT2_PATTERN
        else:
            raise TokenizerError(f"unsupported pre_tokenizer type {kind!r} in tokenizer.json")
    if not byte_level:
        # Without a ByteLevel step tokenizers would run BPE on raw characters; this
        # package only implements byte-level BPE.
        raise TokenizerError("unsupported pre_tokenizer in tokenizer.json: no ByteLevel step (only byte-level BPE is supported)")
    return found


def _escape(cp: int) -> str:
    return f"\\u{cp:04X}" if cp < 0x10000 else f"\\U{cp:08X}"


def _class_body(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in ranges)


_PINNED_CLASSES = {"L": _class_body(LETTER_RANGES), "M": _class_body(MARK_RANGES), "N": _class_body(NUMBER_RANGES)}
# \p{X} or \pX for the three classes pinned above (\p{Lu}, \p{Mn}, ... are not matched).
_PROPERTY = regex.compile(r"\\[pP](?:\{([LMN])\}|([LMN]))")


def pin_unicode_classes(pattern: str) -> str:
    """Replace ``\\p{L}`` / ``\\p{M}`` / ``\\p{N}`` in a split pattern with fixed Unicode 16.0 ranges.

    So the split follows the reference's Unicode version rather than the regex module's
    (see ``_unicode_tables``). Inside a character class the ranges are spliced in; outside
    one they become a class of their own (so ``[\\p{L}\\p{M}]`` and ``[^\\s\\p{L}\\p{M}\\p{N}]``
    become one class of all their ranges). Negated forms outside a class become a negated
    class; a negated form inside a class is left alone (no pattern we know uses it).
    """
    out = []
    i = 0
    in_class = False
    n = len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            m = _PROPERTY.match(pattern, i)
            if m:
                body = _PINNED_CLASSES[m.group(1) or m.group(2)]
                negated = m.group(0)[1] == "P"
                if in_class:
                    out.append(m.group(0) if negated else body)
                else:
                    out.append(f"[^{body}]" if negated else f"[{body}]")
                i = m.end()
                continue
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            i += 1
            # A ']' right after '[' or '[^' is a literal, not the end of the class.
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("]")
                i += 1
            continue
        if c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def _in_ranges(cp: int, ranges: tuple[tuple[int, int], ...], starts: list[int]) -> bool:
    i = bisect_right(starts, cp) - 1
    return i >= 0 and cp <= ranges[i][1]


_PINNED_RANGES = {"L": LETTER_RANGES, "M": MARK_RANGES, "N": NUMBER_RANGES}


@lru_cache(maxsize=8)
def disagreeing_characters(classes: str = "LMN") -> str:
    """Characters the regex module puts in a different one of ``classes`` than the reference
    does (``"LMN"``: letters, marks, numbers), as a class body.

    Only characters assigned after Unicode 14.0 can differ, so only those are checked:
    about 14k characters, a few milliseconds. Empty when the versions agree.
    """
    # Every recent character is checked against every class asked for, not only the class it
    # is recent in: that covers a character that moved from one class to another, too.
    recent = "".join(chr(cp) for a, b in RECENT_RANGES + RECENT_MARK_RANGES for cp in range(a, b + 1))
    odd: set[int] = set()
    for prop in classes:
        ranges = _PINNED_RANGES[prop]
        starts = [a for a, _ in ranges]
        theirs = {ord(c) for c in recent if _in_ranges(ord(c), ranges, starts)}
        ours = set(map(ord, regex.findall(rf"\p{{{prop}}}", recent)))
        odd |= theirs ^ ours
    odd = sorted(odd)
    runs: list[tuple[int, int]] = []
    for cp in odd:
        if runs and runs[-1][1] == cp - 1:
            runs[-1] = (runs[-1][0], cp)
        else:
            runs.append((cp, cp))
    return _class_body(tuple(runs))


class Splitter:
    """Splits normalized text into pre-tokens with a compiled split pattern.

    The pattern runs with the regex module's own ``\\p{L}`` / ``\\p{M}`` / ``\\p{N}`` (fast). Only a
    segment containing a character whose class differs between the regex module's
    Unicode version and the reference's is split with the pattern rewritten to fixed
    Unicode 16.0 ranges, which is exact but about 15x slower.
    """

    def __init__(self, pattern: str | None):
        self.pattern = pattern
        if pattern is None:  # no split step: each text segment is one pre-token
            self._regex = self._odd = None
            return
        try:
            self._regex = regex.compile(pattern)
            # Only the classes the pattern names matter: a Qwen2 pattern need not leave the
            # fast path for a mark the two Unicode versions disagree on.
            used = {m.group(1) or m.group(2) for m in _PROPERTY.finditer(pattern)}
            odd = disagreeing_characters("".join(sorted(used))) if used else ""
            self._odd = regex.compile(f"[{odd}]") if odd else None
            self._pinned = None
            self._pinned_source = pin_unicode_classes(pattern) if odd else None
        except regex.error as exc:
            raise TokenizerError(f"malformed tokenizer.json: split pattern does not compile: {exc}") from None

    def split(self, text: str) -> list[str]:
        """Every match of the pattern, plus (as ``Isolated`` does) the text between matches."""
        compiled = self._regex
        if compiled is None:
            return [text]
        if self._odd is not None and self._odd.search(text):
            if self._pinned is None:
                self._pinned = regex.compile(self._pinned_source)
            compiled = self._pinned
        # findall gives group contents instead of whole matches when there are groups.
        if compiled.groups == 0:
            pieces = compiled.findall(text)
            # Qwen's pattern matches every character, so the matches tile the text; only
            # patterns that leave gaps take the slow path below.
            if sum(map(len, pieces)) == len(text):
                return pieces
        out: list[str] = []
        pos = 0
        for m in compiled.finditer(text):
            start, end = m.span()
            if start > pos:
                out.append(text[pos:start])
            if end > start:
                out.append(text[start:end])
            pos = end
        if pos < len(text):
            out.append(text[pos:])
        return out
