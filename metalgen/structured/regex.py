"""Regular expressions (a JSON schema's `pattern`, and the `format`s) compiled to byte-level DFAs, which the
string frames of the automaton (automaton.py) run over a string's decoded UTF-8 bytes.

The dialect is the ECMA-262 subset that JSON schema patterns are written in: literals, `.`, classes
(`[a-z]`, `[^...]`, `\\d \\w \\s` and their negations, ranges, escapes), groups (`(...)`, `(?:...)`,
`(?<name>...)` / `(?P<name>...)`), alternation, the quantifiers `? * + {m} {m,} {m,n}` (lazy forms too:
laziness changes what a match captures, not whether a string matches), and the anchors `^` and `$` (start
and end of the string: no multiline mode). Semantics are JSON schema's: a pattern matches *anywhere* in
the string unless anchored (`"ab"` accepts `"xaby"`; `"^ab$"` only `"ab"`). Characters are code points
(`.` and `[^a]` take a whole astral character), `\\d` and `\\w` are ASCII (as in ECMA-262), `\\s` is
ECMA's white space (Unicode spaces included), `.` anything but a line terminator (\\n \\r U+2028 U+2029).
Refused, with a PatternError naming the feature: lookarounds, backreferences, word boundaries
(`\\b \\B`), Unicode property escapes (`\\p{..}`), inline flags (`(?i)`), `\\c` control escapes, and a class
that opens with `]` (ECMA and Python read `[]a]` differently).

Only characters that a JSON string can carry without a `\\u` escape are in any class (the automaton
writes pattern strings with raw UTF-8 and the short escapes `\\" \\\\ \\/ \\b \\f \\n \\r \\t` only):
control characters other than \\b \\t \\n \\f \\r are left out, so that the DFA has no path that the string
could not write.

The DFA is built by subset construction over bytes (each code point range is split into UTF-8 byte
sequences, so the DFA takes only valid UTF-8), pruned to the states from which an accepting one can be
reached (no dead ends: -1 is the dead state) and minimized; every state is either between characters
(`pending[s] == 0`) or inside one. `feasible(state, need, left)` says whether an accepting state is
reachable within `need` to `left` more characters (minLength / maxLength on a string with a pattern).
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np

Ranges = Tuple[Tuple[int, int], ...]  # sorted, disjoint, non-adjacent code point ranges

MAX_STATES = 4000  # DFA states (before minimization): a pattern past it is refused as too complex
MAX_NFA = 60_000  # NFA states (a `{m,n}` copies its operand n times)
MAX_REPEAT = 1000  # the largest bound of a `{m,n}`


class PatternError(ValueError):
    """A pattern outside the supported regex subset, or not a valid pattern (one line)."""


# -- code point sets ----------------------------------------------------------------------------------------

def _norm(ranges) -> Ranges:
    out: List[List[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _negate(ranges: Ranges) -> Ranges:
    out, at = [], 0
    for lo, hi in ranges:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= 0x10FFFF:
        out.append((at, 0x10FFFF))
    return _intersect(tuple(out), _EXPRESSIBLE)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


# what a pattern string can hold: no surrogates, and control characters only those with a short escape
_EXPRESSIBLE = ((0x08, 0x0A), (0x0C, 0x0D), (0x20, 0xD7FF), (0xE000, 0x10FFFF))
_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = _norm([(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A), (0x2028, 0x2029),
                (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)])
_DOT = _negate(_norm([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]))
_ANY = _EXPRESSIBLE
_CLASSES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CONTROL = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D, "0": 0x00}
_SYNTAX = set("^$\\.*+?()[]{}|/-")


def _char_set(cp: int):
    return ("set", _intersect(((cp, cp),), _EXPRESSIBLE))


# -- parser: pattern -> AST ---------------------------------------------------------------------------------
# nodes: ("set", ranges) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", node, lo, hi or None) | ("bol",)
# | ("eol",)

class _Parser:
    def __init__(self, pattern: str):
        self.p, self.i = pattern, 0

    def fail(self, what: str):
        raise PatternError(f"{what} (at offset {self.i} of pattern {self.p!r})")

    def peek(self, k: int = 0) -> Optional[str]:
        j = self.i + k
        return self.p[j] if j < len(self.p) else None

    def parse(self):
        node = self.alternation()
        if self.i < len(self.p):
            self.fail("unbalanced ')'")
        return node

    def alternation(self):
        options = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else ("alt", options)

    def sequence(self):
        items = []
        while self.peek() is not None and self.peek() not in "|)":
            atom = self.atom()
            if atom[0] in ("bol", "eol"):
                if self.quantifier() is not None:
                    self.fail("a quantifier on an anchor")
                items.append(atom)
                continue
            q = self.quantifier()
            if q is not None:
                atom = ("rep", atom, q[0], q[1])
            items.append(atom)
        return ("cat", items)

    def quantifier(self) -> Optional[Tuple[int, Optional[int]]]:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.i += 1
            q = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{":
            q = self.braces()
            if q is None:
                return None
        else:
            return None
        if self.peek() == "?":  # lazy: the same strings match
            self.i += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self.braces(probe=True)):
            self.fail("a quantifier after a quantifier")
        return q

    def braces(self, probe: bool = False) -> Optional[Tuple[int, Optional[int]]]:
        """`{m}`, `{m,}` or `{m,n}` at the cursor (consumed unless probing); None if it is not one (then `{` is
        a literal, as ECMA-262's Annex B and Python read it)."""
        j = self.p.find("}", self.i)
        if j < 0:
            return None
        body = self.p[self.i + 1:j]
        lo, sep, hi = body.partition(",")
        if not lo and sep and hi.isdigit() and hi.isascii():
            self.fail("'{,n}' (a literal in ECMA-262, a quantifier in Python): write {0,n}")
        if not lo.isdigit() or (hi and not hi.isdigit()) or not lo.isascii() or not hi.isascii():
            return None
        if probe:
            return 0, 0
        self.i = j + 1
        lo_n, hi_n = int(lo), (int(hi) if hi else None) if sep else int(lo)
        if hi_n is not None and hi_n < lo_n:
            self.fail("a quantifier {m,n} with n < m")
        if max(lo_n, hi_n or 0) > MAX_REPEAT:
            self.fail(f"a repetition count past {MAX_REPEAT}")
        return lo_n, hi_n

    def atom(self):
        c = self.p[self.i]
        self.i += 1
        if c == "^":
            return ("bol",)
        if c == "$":
            return ("eol",)
        if c == ".":
            return ("set", _DOT)
        if c == "[":
            return ("set", self.char_class())
        if c == "(":
            return self.group()
        if c in "*+?":
            self.i -= 1
            self.fail(f"nothing to repeat before '{c}'")
        if c == "{":
            self.i -= 1
            if self.braces(probe=True) is not None:
                self.fail("nothing to repeat before '{'")
            self.i += 1
        if c == "\\":
            got = self.escape(in_class=False)
            return got if isinstance(got, tuple) else _char_set(got)
        return _char_set(ord(c))

    def group(self):
        if self.peek() == "?":
            rest = self.p[self.i + 1:self.i + 4]
            if rest.startswith(":"):
                self.i += 2
            elif rest.startswith(("=", "!")) or rest.startswith(("<=", "<!")):
                self.fail("lookaround assertions are not supported")
            elif rest.startswith(("<", "P<")):
                j = self.p.find(">", self.i)
                if j < 0:
                    self.fail("an unterminated group name")
                self.i = j + 1
            else:
                self.fail("inline flags and other '(?' groups are not supported")
        node = self.alternation()
        if self.peek() != ")":
            self.fail("missing ')'")
        self.i += 1
        return node

    def escape(self, in_class: bool):
        """The escape after a backslash (the cursor past the backslash): a code point, or ("set", ranges)."""
        c = self.peek()
        if c is None:
            self.fail("a trailing backslash")
        self.i += 1
        if c.lower() in _CLASSES:
            s = _intersect(_CLASSES[c.lower()], _EXPRESSIBLE)
            return ("set", _negate(s) if c.isupper() else s)
        if c == "b" and in_class:
            return 0x08
        if c in "bB":
            self.fail("word boundaries (\\b, \\B) are not supported")
        if c in "123456789" or (c == "k" and self.peek() == "<"):
            self.fail("backreferences are not supported")
        if c in "pP":
            self.fail("Unicode property escapes (\\p, \\P) are not supported")
        if c == "c":
            self.fail("control escapes (\\c) are not supported")
        if c == "0" and self.peek() is not None and self.peek().isdigit():
            self.fail("octal escapes are not supported")
        if c in _CONTROL:
            cp = _CONTROL[c]
        elif c == "x":
            cp = self.hex(2)
        elif c == "u":
            if self.peek() == "{":
                j = self.p.find("}", self.i)
                digits = self.p[self.i + 1:j] if j > 0 else ""
                if not digits or any(ch not in "0123456789abcdefABCDEF" for ch in digits) or int(digits, 16) > 0x10FFFF:
                    self.fail("a bad \\u{...} escape")
                self.i = j + 1
                cp = int(digits, 16)
            else:
                cp = self.hex(4)
                if 0xD800 <= cp <= 0xDBFF and self.p[self.i:self.i + 2] == "\\u":  # a surrogate pair
                    save = self.i
                    self.i += 2
                    low = self.hex(4)
                    if 0xDC00 <= low <= 0xDFFF:
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                    else:
                        self.i = save
        elif c in _SYNTAX or not (c.isascii() and c.isalnum()):
            cp = ord(c)  # an identity escape: \. \* \\ \- ...
        else:
            self.i -= 1
            self.fail(f"unknown escape '\\{c}'")
        return cp

    def hex(self, n: int) -> int:
        digits = self.p[self.i:self.i + n]
        if len(digits) != n or any(ch not in "0123456789abcdefABCDEF" for ch in digits):
            self.fail("a bad hex escape")
        self.i += n
        return int(digits, 16)

    def char_class(self) -> Ranges:
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        if self.peek() == "]":
            self.fail("a class that opens with ']' (ECMA-262 and Python read it differently)")
        items: List[Tuple[int, int]] = []
        while True:
            c = self.peek()
            if c is None:
                self.fail("missing ']'")
            if c == "]":
                self.i += 1
                break
            lo = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in (None, "]"):
                self.i += 1
                hi = self.class_atom()
                if isinstance(lo, tuple) or isinstance(hi, tuple):
                    self.fail("a class range with a class escape (such as \\d) at an end")
                if hi < lo:
                    self.fail("a class range out of order")
                items.append((lo, hi))
            elif isinstance(lo, tuple):
                items.extend(lo)
            else:
                items.append((lo, lo))
        s = _intersect(_norm(items), _EXPRESSIBLE)
        return _negate(s) if negated else s

    def class_atom(self):
        """A code point, or a tuple of ranges for \\d \\w \\s (and negations)."""
        c = self.p[self.i]
        self.i += 1
        if c != "\\":
            if c == "[" and self.peek() in (":", "=", "."):
                self.fail("POSIX classes ([:alpha:]) are not supported")
            return ord(c)
        got = self.escape(in_class=True)
        return got[1] if isinstance(got, tuple) else got


# -- UTF-8 ---------------------------------------------------------------------------------------------------

def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8", "surrogatepass")


def utf8_sequences(lo: int, hi: int) -> List[Tuple[Tuple[int, int], ...]]:
    """The code points lo..hi (surrogates left out) as UTF-8 byte-range sequences: each a tuple of (lo, hi)
    byte ranges whose product is a block of the code points' encodings (the split of Go's and RE2's
    compilers)."""
    out = []
    stack = [(lo, hi)]
    while stack:
        lo, hi = stack.pop()
        if lo > hi:
            continue
        if lo <= 0xDFFF and hi >= 0xD800:
            stack += [(lo, 0xD7FF), (0xE000, hi)]
            continue
        split = next((m for m in (0x7F, 0x7FF, 0xFFFF) if lo <= m < hi), None)
        if split is not None:
            stack += [(split + 1, hi), (lo, split)]
            continue
        if hi <= 0x7F:
            out.append(((lo, hi),))
            continue
        for i in range(1, 4):
            m = (1 << (6 * i)) - 1
            if lo & ~m != hi & ~m:
                if lo & m:
                    stack += [((lo | m) + 1, hi), (lo, lo | m)]
                    break
                if hi & m != m:
                    stack += [(hi & ~m, hi), (lo, (hi & ~m) - 1)]
                    break
        else:
            a, b = _encode(lo), _encode(hi)
            out.append(tuple(zip(a, b)))
    return out


# -- NFA ------------------------------------------------------------------------------------------------------

class _Nfa:
    def __init__(self):
        self.eps: List[List[int]] = []
        self.edges: List[List[Tuple[int, int, int]]] = []  # (byte lo, byte hi, target)
        self.bol: List[List[int]] = []
        self.eol: List[List[int]] = []

    def state(self) -> int:
        if len(self.eps) >= MAX_NFA:
            raise PatternError(f"pattern too large (more than {MAX_NFA} automaton states)")
        for table in (self.eps, self.edges, self.bol, self.eol):
            table.append([])
        return len(self.eps) - 1

    def ranges(self, s: int, t: int, ranges: Ranges) -> None:
        """Edges s -> t on any code point of `ranges`, as UTF-8 byte paths."""
        for lo, hi in ranges:
            for seq in utf8_sequences(lo, hi):
                at = s
                for k, (blo, bhi) in enumerate(seq):
                    nxt = t if k == len(seq) - 1 else self.state()
                    self.edges[at].append((blo, bhi, nxt))
                    at = nxt

    def build(self, node, s: int) -> int:
        """Append `node` from state s; return its end state."""
        kind = node[0]
        if kind == "set":
            t = self.state()
            self.ranges(s, t, node[1])
            return t
        if kind == "cat":
            for item in node[1]:
                s = self.build(item, s)
            return s
        if kind == "alt":
            t = self.state()
            for option in node[1]:
                a = self.state()
                self.eps[s].append(a)
                self.eps[self.build(option, a)].append(t)
            return t
        if kind in ("bol", "eol"):
            t = self.state()
            (self.bol if kind == "bol" else self.eol)[s].append(t)
            return t
        _, sub, lo, hi = node
        for _ in range(lo):
            s = self.build(sub, s)
        if hi is None:  # a loop: s -> sub -> s
            a = self.state()
            self.eps[s].append(a)
            self.eps[self.build(sub, a)].append(s)
            t = self.state()
            self.eps[s].append(t)
            return t
        t = self.state()
        for _ in range(hi - lo):
            self.eps[s].append(t)
            s = self.build(sub, s)
        self.eps[s].append(t)
        return t


# -- DFA -------------------------------------------------------------------------------------------------------

class Dfa:
    """A byte-level DFA: `trans[s][b]` the next state (-1: dead), `accept[s]`, `pending[s]` the UTF-8
    continuation bytes still owed (0: between characters), `start`. Identity-hashed (automaton states hold
    it). Every state but -1 can reach an accepting one."""

    __slots__ = ("trans", "accept", "pending", "start", "source", "_succ", "_lens", "_table", "_counts", "__weakref__")

    def __init__(self, trans, accept, pending, start, source: str):
        self.trans: List[List[int]] = trans
        self.accept: List[bool] = accept
        self.pending: List[int] = pending
        self.start, self.source = start, source
        self._succ: Optional[List[FrozenSet[int]]] = None
        # lazily built, each in one attribute (a worker thread and a request's compilation may share a DFA)
        self._lens: Tuple[List[int], int] = ([], -1)  # (per state the reachable lengths as bits, up to cap)
        self._table: Optional[np.ndarray] = None
        self._counts: Tuple[Optional[np.ndarray], int] = (None, -1)

    def __len__(self) -> int:
        return len(self.trans)

    def step(self, s: int, data: bytes) -> int:
        for b in data:
            if s < 0:
                return s
            s = self.trans[s][b]
        return s

    def matches(self, text: str) -> bool:
        """Whether the DFA accepts `text` (for tests: the pattern's search semantics)."""
        s = self.step(self.start, text.encode("utf-8", "surrogatepass"))
        return s >= 0 and self.accept[s]

    def feasible(self, s: int, need: int, left: int) -> bool:
        """Whether from state s an accepting state can be reached after `need` to `left` (-1: any number) more
        characters (s inside a character: after it, which is already counted)."""
        if s < 0:
            return False
        if need <= 0 and left < 0:
            return True  # every live state reaches an accepting one
        n = len(self.trans)
        hi = need + n if left < 0 else min(left, need + n)  # a longer path holds a cycle that can be cut
        if hi < need:
            return False
        lens, cap = self._lens
        if hi > cap:
            lens, cap = self._lengths(hi)
        return (lens[s] >> need) & ((1 << (hi - need + 1)) - 1) != 0

    def table(self) -> np.ndarray:
        """The transitions flat, int32 ((n + 1) * 256): state s, byte b at s * 256 + b; the dead state is n
        (its row leads back to it), for running many byte strings at once (vocab.py)."""
        if self._table is None:
            n = len(self.trans)
            t = np.array(self.trans + [[n] * 256], np.int32)
            t[t < 0] = n
            self._table = t.ravel()
        return self._table

    def feasible_many(self, states: np.ndarray, need: np.ndarray, left: np.ndarray) -> np.ndarray:
        """`feasible` over arrays (a state n or -1 is dead; left -1: unbounded)."""
        n = len(self.trans)
        live = (states >= 0) & (states < n)
        if not need.any() and (left < 0).all():
            return live
        hi = np.where(left < 0, need + n, np.minimum(left, need + n))
        counts, cap = self._counts
        if int(hi.max(initial=0)) > cap:
            lens, cap = self._lengths(max(int(hi.max(initial=0)), self._lens[1]))
            size = cap // 8 + 1
            bits = np.unpackbits(np.frombuffer(b"".join(x.to_bytes(size, "little") for x in lens), np.uint8)
                                 .reshape(n, size), axis=1, bitorder="little")[:, :cap + 1]
            counts = np.zeros((n + 1, cap + 2), np.int32)  # counts[s, c]: how many lengths below c are reachable
            counts[:n, 1:] = np.cumsum(bits, axis=1)
            self._counts = (counts, cap)
        s = np.where(live, states, n)
        lo = np.minimum(need, cap + 1)
        top = np.clip(hi + 1, 0, cap + 1)
        return live & (hi >= need) & (counts[s, top] > counts[s, lo])

    def _successors(self) -> List[FrozenSet[int]]:
        """Per state, the between-character states after (the rest of) one character."""
        if self._succ is None:
            memo: Dict[int, FrozenSet[int]] = {}

            def finish(s: int) -> FrozenSet[int]:  # s inside a character: where the character ends
                got = memo.get(s)
                if got is None:
                    row = self.trans[s]
                    out = set()
                    for b in range(0x80, 0xC0):
                        t = row[b]
                        if t >= 0:
                            out |= {t} if self.pending[t] == 0 else finish(t)
                    got = memo[s] = frozenset(out)
                return got

            succ = []
            for s, row in enumerate(self.trans):
                if self.pending[s]:
                    succ.append(finish(s))
                    continue
                out = set()
                for b, t in enumerate(row):
                    if t >= 0:
                        out |= {t} if self.pending[t] == 0 else finish(t)
                succ.append(frozenset(out))
            self._succ = succ
        return self._succ

    def _lengths(self, cap: int) -> Tuple[List[int], int]:
        """Per state, bit c set if an accepting state is reachable in exactly c more characters (c <= cap)."""
        succ = self._successors()
        n = len(self.trans)
        pred: List[List[int]] = [[] for _ in range(n)]
        for s in range(n):
            if not self.pending[s]:
                for t in succ[s]:
                    pred[t].append(s)
        lens = [0] * n
        layer = {s for s in range(n) if self.accept[s] and not self.pending[s]}
        for c in range(cap + 1):
            bit = 1 << c
            for s in layer:
                lens[s] |= bit
            if c == cap:
                break
            layer = {p for t in layer for p in pred[t]}
            if not layer:
                break
        for s in range(n):  # inside a character: the lengths after it ends (it is counted already)
            if self.pending[s]:
                for t in succ[s]:
                    lens[s] |= lens[t]
        self._lens = (lens, cap)
        return lens, cap


def _closure(nfa: _Nfa, states, at_start: bool, at_end: bool) -> FrozenSet[int]:
    seen = set(states)
    todo = list(states)
    while todo:
        s = todo.pop()
        nxt = nfa.eps[s] + (nfa.bol[s] if at_start else []) + (nfa.eol[s] if at_end else [])
        for t in nxt:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return frozenset(seen)


def compile_regex(pattern: str, anchored: bool = False) -> Dfa:
    """The DFA of the strings in which `pattern` matches (anywhere, JSON schema's semantics; `anchored`: the
    whole string, as for the formats). PatternError if outside the subset, too complex, or matching nothing."""
    if not isinstance(pattern, str):
        raise PatternError("a pattern must be a string")
    ast = _Parser(pattern).parse()
    if anchored:
        ast = ("cat", [("bol",), ast, ("eol",)])
    nfa = _Nfa()
    search = nfa.state()  # the unanchored search: any characters, then the pattern
    nfa.ranges(search, search, _ANY)
    begin = nfa.state()
    nfa.eps[search].append(begin)
    match = nfa.build(ast, begin)
    nfa.ranges(match, match, _ANY)  # matched: anything may follow
    return _determinize(nfa, search, match, pattern)


def _determinize(nfa: _Nfa, search: int, match: int, source: str) -> Dfa:
    bounds = {0, 256}
    for row in nfa.edges:
        for lo, hi, _ in row:
            bounds.update((lo, hi + 1))
    cuts = sorted(bounds)
    classes = [(cuts[k], cuts[k + 1] - 1) for k in range(len(cuts) - 1)]
    start = _closure(nfa, [search], True, False)
    ids: Dict[FrozenSet[int], int] = {}
    subsets: List[FrozenSet[int]] = []

    def intern(subset: FrozenSet[int]) -> int:
        if match in subset:
            subset = frozenset([match])  # matched: every continuation is accepted alike
        got = ids.get(subset)
        if got is None:
            if len(subsets) >= MAX_STATES:
                raise PatternError(f"pattern too complex (more than {MAX_STATES} automaton states): {source!r}")
            got = ids[subset] = len(subsets)
            subsets.append(subset)
        return got

    first = {lo: k for k, (lo, _) in enumerate(classes)}
    # per NFA state, its edges as (class index, target) pairs
    moves = [[(c, t) for lo, hi, t in row for c in range(first[lo], first.get(hi + 1, len(classes)))]
             for row in nfa.edges]
    s0 = intern(start)
    trans: List[List[int]] = []
    k = 0
    while k < len(subsets):
        targets: Dict[int, set] = {}
        for s in subsets[k]:
            for c, t in moves[s]:
                targets.setdefault(c, set()).add(t)
        row = [-1] * 256
        for c, ts in targets.items():
            t = intern(_closure(nfa, ts, False, False))
            lo, hi = classes[c]
            row[lo:hi + 1] = [t] * (hi - lo + 1)
        trans.append(row)
        k += 1
    accept = [match in _closure(nfa, subset, i == s0, True) for i, subset in enumerate(subsets)]
    return _finish(trans, accept, s0, source)


def _finish(trans: List[List[int]], accept: List[bool], start: int, source: str) -> Dfa:
    """Prune to the live states (those that reach an accepting one), minimize, number from the start."""
    n = len(trans)
    pred: List[set] = [set() for _ in range(n)]
    for s, row in enumerate(trans):
        for t in row:
            if t >= 0:
                pred[t].add(s)
    live = {s for s in range(n) if accept[s]}
    todo = list(live)
    while todo:
        t = todo.pop()
        for s in pred[t]:
            if s not in live:
                live.add(s)
                todo.append(s)
    if start not in live:
        raise PatternError(f"pattern {source!r} matches no string that can be written")
    # Moore refinement over the live states, on one byte of each set of bytes that no row tells apart
    states = sorted(live)
    columns: Dict[tuple, int] = {}
    for b in range(256):
        columns.setdefault(tuple(trans[s][b] if trans[s][b] in live else -1 for s in states), b)
    reps = sorted(columns.values())
    rows = {s: [trans[s][b] if trans[s][b] in live else -1 for b in reps] for s in states}
    block = {s: int(accept[s]) for s in states}
    block[-1] = -1
    while True:
        sig: Dict[tuple, int] = {}
        new = {-1: -1}
        for s in states:
            key = (block[s], tuple([block[t] for t in rows[s]]))
            new[s] = sig.setdefault(key, len(sig))
        if len(sig) == len(set(block.values())) - 1:
            block = new
            break
        block = new
    # renumber blocks in BFS order from the start
    order: Dict[int, int] = {}
    rep: Dict[int, int] = {}
    for s in sorted(live):
        rep.setdefault(block[s], s)
    queue = [block[start]]
    order[block[start]] = 0
    k = 0
    while k < len(queue):
        s = rep[queue[k]]
        for t in trans[s]:
            if t >= 0 and t in live and block[t] not in order:
                order[block[t]] = len(queue)
                queue.append(block[t])
        k += 1
    new_trans, new_accept = [], []
    for b in queue:
        s = rep[b]
        new_trans.append([order[block[t]] if t >= 0 and t in live else -1 for t in trans[s]])
        new_accept.append(accept[s])
    pending = _pending(new_trans)
    return Dfa(new_trans, new_accept, pending, 0, source)


def _pending(trans: List[List[int]]) -> List[int]:
    """The UTF-8 continuation bytes each state still owes (from the start, between characters)."""
    pending = [-1] * len(trans)
    pending[0] = 0
    todo = [0]
    while todo:
        s = todo.pop()
        for b, t in enumerate(trans[s]):
            if t < 0:
                continue
            if pending[s]:
                p = pending[s] - 1
            else:
                p = 0 if b < 0x80 else 1 if b < 0xE0 else 2 if b < 0xF0 else 3
            if pending[t] < 0:
                pending[t] = p
                todo.append(t)
            elif pending[t] != p:  # (cannot happen: UTF-8 is self-synchronizing)
                raise AssertionError("a DFA state both inside and between characters")
    return pending


def intersect(a: Dfa, b: Dfa) -> Dfa:
    """The DFA of the strings both accept (a `pattern` next to a `format`)."""
    ids: Dict[Tuple[int, int], int] = {(a.start, b.start): 0}
    pairs = [(a.start, b.start)]
    trans = []
    k = 0
    while k < len(pairs):
        x, y = pairs[k]
        row = [-1] * 256
        ra, rb = a.trans[x], b.trans[y]
        for byte in range(256):
            p, q = ra[byte], rb[byte]
            if p >= 0 and q >= 0:
                t = ids.get((p, q))
                if t is None:
                    if len(pairs) >= MAX_STATES:
                        raise PatternError("pattern and format together too complex")
                    t = ids[(p, q)] = len(pairs)
                    pairs.append((p, q))
                row[byte] = t
        trans.append(row)
        k += 1
    accept = [a.accept[x] and b.accept[y] for x, y in pairs]
    return _finish(trans, accept, 0, f"({a.source}) & ({b.source})")


# -- formats ---------------------------------------------------------------------------------------------------

_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d{2}|00[1-9]\d|000[1-9])"  # 0001-9999 (year 0 is no date in Python)
_LEAP = r"(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
              r"|02-(?:0[1-9]|1\d|2[0-8]))")
_DATE = rf"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP}-02-29)"
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_HEX = "[0-9a-fA-F]"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

# what each format's strings must match (whole): a practical subset of what the format allows, all of which
# is valid (docs/serve.md)
FORMATS: Dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}T{_TIME}",
    "uuid": rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "email": rf"{_ATOM}(?:\.{_ATOM})*@(?:{_LABEL}\.)+[A-Za-z]{{2,63}}",
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
}

_CACHE: Dict[Tuple[str, bool], Dfa] = {}


def cached(pattern: str, anchored: bool = False) -> Dfa:
    """`compile_regex`, memoized (the formats, and patterns repeated across a schema or requests)."""
    key = (pattern, anchored)
    got = _CACHE.get(key)
    if got is None:
        got = compile_regex(pattern, anchored)
        if len(_CACHE) >= 256:
            _CACHE.clear()
        _CACHE[key] = got
    return got


def format_dfa(name: str) -> Dfa:
    return cached(FORMATS[name], anchored=True)


__all__: Sequence[str] = ["Dfa", "FORMATS", "PatternError", "compile_regex", "format_dfa", "intersect",
                          "utf8_sequences"]
