"""Make (or check) the Unicode class tables of tokenizer/_unicode_tables.py, with tokenizers as the oracle.

The split patterns' ``\\p{L}``, ``\\p{M}`` and ``\\p{N}`` must class every character the way Hugging
Face tokenizers (its Oniguruma, Unicode 16.0) does, whatever Unicode version the regex module was
built with. This script asks tokenizers itself about every code point (surrogates aside) and
prints the tables as Python source, in the layout _unicode_tables.py keeps:

    LETTER_RANGES, MARK_RANGES, NUMBER_RANGES   the reference's classes
    RECENT_RANGES                               letters and numbers assigned after Unicode 14.0
    RECENT_MARK_RANGES                          marks assigned after Unicode 14.0

"Assigned after 14.0" is read from Python's unicodedata, so the recent tables need a Python whose
unicodedata is at Unicode 14.0 (3.11); the script refuses to make them otherwise. It also checks
the claim the recent tables rest on: on every character assigned by 14.0, the reference, the
regex module and unicodedata 14.0 agree on all three classes.

    python3 tools/unicode_tables.py           # print the tables
    python3 tools/unicode_tables.py --check   # compare with tokenizer/_unicode_tables.py; exit 1 on a difference

NORMALIZATION_BARRIERS is not made here (it comes from the normalizer, not from these classes).
"""

from __future__ import annotations

import argparse
import os
import sys
import unicodedata

import regex
from tokenizers import Regex, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROPERTIES = ("L", "M", "N")
# Code points per pre_tokenize_str call: a few calls keep memory small, and since each pattern
# below matches exactly one character, where the text is cut cannot change the answer.
CHUNK = 0x10000
PAIRS_PER_LINE = 6


def code_points() -> list[int]:
    """Every code point that can be put into a Python str handed to Rust (no surrogates)."""
    return [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]


def runs(members: set[int]) -> tuple[tuple[int, int], ...]:
    """Sorted code points as inclusive (first, last) pairs of consecutive runs."""
    out: list[tuple[int, int]] = []
    for cp in sorted(members):
        if out and out[-1][1] == cp - 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return tuple(out)


def reference_members(prop: str, cps: list[int]) -> set[int]:
    """The code points tokenizers' ``\\p{prop}`` matches.

    A Split with behavior "removed" hands back the text between matches, with character
    offsets; the code points it does not hand back are the matches.
    """
    split = pre_tokenizers.Split(Regex(rf"\p{{{prop}}}"), "removed")
    kept: set[int] = set()
    for start in range(0, len(cps), CHUNK):
        chunk = cps[start : start + CHUNK]
        for _piece, (a, b) in split.pre_tokenize_str("".join(map(chr, chunk))):
            kept.update(chunk[a:b])
    return set(cps) - kept


def regex_module_members(prop: str, cps: list[int]) -> set[int]:
    """The code points this regex module's ``\\p{prop}`` matches (its own Unicode version)."""
    return {ord(c) for c in regex.findall(rf"\p{{{prop}}}", "".join(map(chr, cps)))}


def unicodedata_members(prop: str, cps: list[int]) -> set[int]:
    """The code points whose general category in this Python's unicodedata starts with ``prop``."""
    return {cp for cp in cps if unicodedata.category(chr(cp))[0] == prop}


def make_tables() -> dict[str, tuple[tuple[int, int], ...]]:
    """All five tables, after checking that outside the recent ranges nothing can disagree."""
    if unicodedata.unidata_version != "14.0.0":
        sys.exit(f"needs unicodedata at Unicode 14.0.0 (Python 3.11); this one is {unicodedata.unidata_version}")
    cps = code_points()
    unassigned_in_14 = {cp for cp in cps if unicodedata.category(chr(cp)) == "Cn"}
    ref = {p: reference_members(p, cps) for p in PROPERTIES}
    mod = {p: regex_module_members(p, cps) for p in PROPERTIES}
    ucd = {p: unicodedata_members(p, cps) for p in PROPERTIES}
    recent = {p: (ref[p] | mod[p]) & unassigned_in_14 for p in PROPERTIES}
    for p in PROPERTIES:
        # Any character assigned by 14.0 whose class moved between 14.0 and the newer versions
        # would be a disagreement the recent tables do not cover: the Splitter would miss it.
        moved = ((ref[p] ^ mod[p]) | (ref[p] ^ ucd[p])) - unassigned_in_14
        if moved:
            sys.exit(f"\\p{{{p}}}: characters assigned by 14.0 that change class: {[hex(c) for c in sorted(moved)][:20]}")
    return {
        "LETTER_RANGES": runs(ref["L"]),
        "MARK_RANGES": runs(ref["M"]),
        "NUMBER_RANGES": runs(ref["N"]),
        "RECENT_RANGES": runs(recent["L"] | recent["N"]),
        "RECENT_MARK_RANGES": runs(recent["M"]),
    }


def source(name: str, table: tuple[tuple[int, int], ...]) -> str:
    """``NAME = (...)`` laid out as in _unicode_tables.py: six pairs a line, upper-case hex."""
    pairs = [f"(0x{a:X}, 0x{b:X})," for a, b in table]
    lines = [" ".join(pairs[i : i + PAIRS_PER_LINE]) for i in range(0, len(pairs), PAIRS_PER_LINE)]
    return f"{name} = (\n" + "".join(f"    {line}\n" for line in lines) + ")\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with tokenizer/_unicode_tables.py instead of printing")
    args = parser.parse_args()
    tables = make_tables()
    if not args.check:
        print("\n".join(source(name, table) for name, table in tables.items()), end="")
        return 0
    sys.path.insert(0, ROOT)
    from tokenizer import _unicode_tables as shipped

    bad = [name for name, table in tables.items() if getattr(shipped, name, None) != table]
    for name in tables:
        print(f"{name}: {'DIFFERS' if name in bad else 'ok'} ({len(tables[name])} ranges)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
