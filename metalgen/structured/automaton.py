"""A byte-level pushdown automaton of the JSON texts a grammar node (schema.py) allows.

A state is a frozenset of stacks (more than one only while `anyOf` options share a prefix), a stack a
tuple of frames, each frame a tuple: states are hashable and immutable, so that transitions and the token
masks of a state (vocab.py) can be memoized. It reads bytes, not characters, because tokens split UTF-8
characters: inside a string it checks UTF-8 byte by byte (no overlong forms, surrogates or code points
past U+10FFFF), and `\\u` escapes (a high surrogate must be followed by a low one, a lone low surrogate is
refused). Every state it reaches can still be completed into a valid text (no dead ends): a `,` is taken
only if another key or item may follow, a `}` only once the required keys are there.

Whitespace: none, except one optional space after `:` and `,` (`{"a": 1, "b": [1, 2]}` or
`{"a":1,"b":[1,2]}`). Models write JSON like that; allowing newlines and indentation would let a model
pad forever and multiply the states (and masks) for nothing. Numbers are bounded (15 integer digits, 15
fraction digits, 3 exponent digits): longer ones lose precision in most readers, and a model stuck on
digits must come to an end.

A string with a `pattern` or `format` also runs its DFA (regex.py) over the decoded bytes: a raw byte
goes to it as is, a short escape (`\\n`, `\\"`, ...) as the byte it stands for, and `\\u` escapes are not
taken (the DFA has no path through a character that needs one); a byte is taken only if the DFA can still
accept within the string's length bounds. A number with bounds (numbers.py) is written without an
exponent, its digits checked against the bounds' as they come.
"""

from __future__ import annotations

from typing import FrozenSet, Optional

from .schema import Arr, Lit, Node, Num, Obj, Str, Union

State = FrozenSet[tuple]

# frame tags
_V, _O, _A, _S, _N, _L = range(6)
# object / array phases: -1 before the opening byte, 0 after it, 1 after a key, 5 inside a value,
# 2 after a value, 3 after a comma, 4 after a comma and its space
_SP, _QUOTE, _BSLASH, _COMMA, _COLON = 0x20, 0x22, 0x5C, 0x2C, 0x3A
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
_DIGITS = frozenset(b"0123456789")
_MAX_INT, _MAX_FRAC, _MAX_EXP = 15, 15, 3
_NUM_DONE = frozenset("ZIFX")  # number phases that are a complete number
# a short escape's letter -> the byte it stands for (what a string's DFA reads)
_SHORT = {0x22: 0x22, 0x5C: 0x5C, 0x2F: 0x2F, 0x62: 0x08, 0x66: 0x0C, 0x6E: 0x0A, 0x72: 0x0D, 0x74: 0x09}


def _start(node: Node, out: list) -> None:
    """The frames that begin a value of `node` (before its first byte), appended to `out`."""
    if isinstance(node, Union):
        for option in node.options:
            _start(option, out)
    elif isinstance(node, Obj):
        out.append((_O, node, frozenset(), -1, None))
    elif isinstance(node, Arr):
        out.append((_A, node, 0, -1))
    elif isinstance(node, Str):
        dfa = node.dfa
        out.append((_S, -1 if node.hi is None else node.hi, node.lo, -1, dfa, 0 if dfa is None else dfa.start))
    elif isinstance(node, Num):
        out.append((_N, node.integer, "S", 0) if node.bounds is None else (_N, node.bounds, None))
    else:
        out.append((_L, node.values, 0))


def _done(rest: tuple, result) -> tuple:
    """The stack after its top frame completed (`result`: the key a key literal matched)."""
    if not rest:
        return ()
    parent = rest[-1]
    if parent[0] == _O:
        _, node, seen, phase, key = parent
        if phase == 5:  # a value: its key is now taken
            return rest[:-1] + ((_O, node, seen if key is None else seen | {key}, 2, None),)
        return rest[:-1] + ((_O, node, seen, 1, result),)  # a key
    _, node, count, _ = parent
    count += 1
    if node.hi is None:
        count = min(count, node.lo)  # past minItems the count no longer matters: fewer states
    return rest[:-1] + ((_A, node, count, 2),)


def _char(frame: tuple, sub) -> Optional[tuple]:
    """A string frame after the start of one more character (None: past maxLength)."""
    left, need = frame[1], frame[2]
    if left == 0:
        return None
    return (_S, left - 1 if left > 0 else -1, need - 1 if need > 0 else 0, sub) + frame[4:]


def _string(frame: tuple, rest: tuple, b: int) -> list:
    # frame: (_S, characters still allowed (-1: any), characters still needed, sub, dfa or None, DFA state)
    _, left, need, sub, dfa, d = frame
    if sub == 0:
        if b == _QUOTE:
            return [_done(rest, None)] if need == 0 and (dfa is None or dfa.accept[d]) else []
        if b == _BSLASH:
            f = _char(frame, 1)
            if f is not None and dfa is not None:  # some short escape must keep the pattern matchable
                row = dfa.trans[d]
                if not any(dfa.feasible(row[x], f[2], f[1]) for x in _SHORT.values()):
                    return []
        elif b < 0x20:
            return []  # raw control characters are not allowed in JSON strings
        else:
            if b < 0x80:
                utf8 = 0
            elif 0xC2 <= b <= 0xDF:
                utf8 = (0x80, 0xBF, 0)
            elif b == 0xE0:
                utf8 = (0xA0, 0xBF, 1)  # no overlong 3-byte forms
            elif b == 0xED:
                utf8 = (0x80, 0x9F, 1)  # no UTF-16 surrogates
            elif 0xE1 <= b <= 0xEF:
                utf8 = (0x80, 0xBF, 1)
            elif b == 0xF0:
                utf8 = (0x90, 0xBF, 2)
            elif 0xF1 <= b <= 0xF3:
                utf8 = (0x80, 0xBF, 2)
            elif b == 0xF4:
                utf8 = (0x80, 0x8F, 2)  # nothing past U+10FFFF
            else:
                return []
            f = _char(frame, utf8)
            if f is not None and dfa is not None:
                t = dfa.trans[d][b]
                if not dfa.feasible(t, f[2], f[1]):
                    return []
                f = f[:5] + (t,)
        return [] if f is None else [rest + (f,)]
    if sub == -1:
        return [rest + ((_S, left, need, 0, dfa, d),)] if b == _QUOTE else []
    if sub == 1:  # after a backslash
        if b in _ESCAPES:
            if dfa is not None:
                d = dfa.trans[d][_SHORT[b]]
                if not dfa.feasible(d, need, left):
                    return []
            return [rest + ((_S, left, need, 0, dfa, d),)]
        if b != 0x75 or dfa is not None:  # (a string with a pattern takes no \u escapes)
            return []
        return [rest + ((_S, left, need, ("u", 0, 0), dfa, d),)]
    kind = sub[0]
    if isinstance(kind, int):  # UTF-8 continuation bytes pending: (lo, hi, more after this one)
        if not sub[0] <= b <= sub[1]:
            return []
        if dfa is not None:
            d = dfa.trans[d][b]
            if not dfa.feasible(d, need, left):
                return []
        return [rest + ((_S, left, need, (0x80, 0xBF, sub[2] - 1) if sub[2] else 0, dfa, d),)]
    if kind == "u":  # \u escape, `k` hex digits read; flag "d": the first was d, "H": a high surrogate
        _, k, flag = sub
        if b not in _HEX:
            return []
        lower = b | 0x20
        if k == 0:
            nxt = ("u", 1, "d" if lower == 0x64 else 0)
        elif k == 1 and flag == "d":
            if lower >= 0x63:  # dc00-dfff: a lone low surrogate
                return []
            nxt = ("u", 2, "H" if lower >= 0x38 else 0)
        elif k == 3:
            nxt = ("L", 0) if flag == "H" else 0
        else:
            nxt = ("u", k + 1, flag)
        return [rest + ((_S, left, need, nxt, dfa, d),)]
    # "L": the low surrogate that must follow a high one: \ u d [c-f] hex hex
    k = sub[1]
    ok = (b == _BSLASH if k == 0 else b == 0x75 if k == 1 else (b | 0x20) == 0x64 if k == 2
          else 0x63 <= (b | 0x20) <= 0x66 if k == 3 else b in _HEX)
    if not ok:
        return []
    return [rest + ((_S, left, need, ("L", k + 1) if k < 5 else 0, dfa, d),)]


def _bounded(frame: tuple, rest: tuple, b: int) -> list:
    """A number with bounds: (_N, Bounds, its state, None before the first byte)."""
    _, bounds, st = frame
    if st is None:
        nxt = bounds.sign() if b == 0x2D else bounds.step(bounds.begin(1), b)
    else:
        nxt = bounds.step(st, b)
    if nxt is not None:
        return [rest + ((_N, bounds, nxt),)]
    if st is not None and rest and bounds.done(st):  # the number ended before this byte: its parent reads it
        return _advance(_done(rest, None), b)
    return []


def _number(frame: tuple, rest: tuple, b: int) -> list:
    if len(frame) == 3:
        return _bounded(frame, rest, b)
    _, integer, phase, n = frame
    digit = b in _DIGITS
    nxt = None
    if phase == "S" and b == 0x2D:
        nxt = ("M", 0)
    elif phase in "SM" and digit:
        nxt = ("Z", 1) if b == 0x30 else ("I", 1)
    elif phase == "I" and digit and n < _MAX_INT:
        nxt = ("I", n + 1)
    elif phase in "ZI" and b == 0x2E and not integer:
        nxt = ("D", 0)
    elif phase in "DF" and digit and n < _MAX_FRAC:
        nxt = ("F", n + 1)
    elif phase in "ZIF" and b in (0x65, 0x45) and not integer:
        nxt = ("E", 0)
    elif phase == "E" and b in (0x2B, 0x2D):
        nxt = ("G", 0)
    elif phase in "EGX" and digit and n < _MAX_EXP:
        nxt = ("X", n + 1)
    if nxt is not None:
        return [rest + ((_N, integer, nxt[0], nxt[1]),)]
    if phase in _NUM_DONE and rest:  # the number ended before this byte: its parent reads it
        return _advance(_done(rest, None), b)
    return []


def _literal(frame: tuple, rest: tuple, b: int) -> list:
    _, values, pos = frame
    out = []
    if any(len(v) == pos for v in values) and rest:  # complete (a shorter enum value), parent reads b
        out = _advance(_done(rest, None), b)
    values = tuple(v for v in values if len(v) > pos and v[pos] == b)
    if not values:
        return out
    pos += 1
    if len(values) == 1 and len(values[0]) == pos:  # complete, and nothing longer: done now
        return out + [_done(rest, values[0])]
    return out + [rest + ((_L, values, pos),)]


def _object(frame: tuple, rest: tuple, b: int) -> list:
    _, node, seen, phase, key = frame
    if phase == -1:
        return [rest + ((_O, node, seen, 0, None),)] if b == 0x7B else []
    if phase == 1:
        if b != _COLON:
            return []
        value = node.props[key] if node.props else node.extra
        return [rest + ((_O, node, seen, 5, key), (_V, value, True))]
    if phase in (0, 2) and b == 0x7D:
        return [_done(rest, None)] if node.required <= seen else []
    if phase == 2:
        if b != _COMMA or not _more_keys(node, seen):
            return []
        return [rest + ((_O, node, seen, 3, None),)]
    if phase == 3 and b == _SP:
        return [rest + ((_O, node, seen, 4, None),)]
    if b != _QUOTE:
        return []
    if node.props:  # a declared key not yet used
        keys = tuple(k for k in node.keys if k not in seen)
        return [rest + (frame, (_L, keys, 1))] if keys else []
    if node.extra is None:
        return []
    return [rest + (frame, (_S, -1, 0, 0, None, 0))]


def _more_keys(node: Obj, seen: frozenset) -> bool:
    return len(seen) < len(node.keys) if node.props else node.extra is not None


def _array(frame: tuple, rest: tuple, b: int) -> list:
    _, node, count, phase = frame
    if phase == -1:
        return [rest + ((_A, node, count, 0),)] if b == 0x5B else []
    if b == 0x5D:
        return [_done(rest, None)] if count >= node.lo else []
    if phase == 0:
        if node.hi == 0:
            return []
        return _advance(rest + ((_A, node, count, 5), (_V, node.item, False)), b)
    if b != _COMMA or (node.hi is not None and count >= node.hi):
        return []
    return [rest + ((_A, node, count, 5), (_V, node.item, True))]


def _advance(stack: tuple, b: int) -> list:
    """The stacks after byte `b` (none: refused)."""
    if not stack:
        return []  # the value is complete: nothing may follow
    frame = stack[-1]
    rest = stack[:-1]
    tag = frame[0]
    if tag == _S:
        return _string(frame, rest, b)
    if tag == _V:
        node = frame[1]
        if b == _SP and frame[2]:
            return [rest + ((_V, node, False),)]
        if b not in node.first:
            return []
        starts: list = []
        _start(node, starts)
        out = []
        for f in starts:
            out += _advance(rest + (f,), b)
        return out
    if tag == _N:
        return _number(frame, rest, b)
    if tag == _L:
        return _literal(frame, rest, b)
    if tag == _O:
        return _object(frame, rest, b)
    return _array(frame, rest, b)


def _complete(stack: tuple) -> bool:
    if not stack:
        return True
    if len(stack) > 1:
        return False
    frame = stack[0]
    if frame[0] == _N:
        if len(frame) == 3:
            return frame[2] is not None and frame[1].done(frame[2])
        return frame[2] in _NUM_DONE
    return frame[0] == _L and any(len(v) == frame[2] for v in frame[1])


class Grammar:
    """The automaton of one compiled schema: `start`, `advance` (memoized), `feed`, `can_end`."""

    MAX_MEMO = 200_000  # transitions kept; cleared past it (a long free-form value makes many states)

    def __init__(self, root: Node):
        self.root = root
        self.start: State = frozenset([((_V, root, False),)])
        self._memo: dict = {}

    def advance(self, state: State, b: int) -> Optional[State]:
        """The state after byte `b`, None if the grammar refuses it."""
        key = (state, b)
        try:
            return self._memo[key]
        except KeyError:
            pass
        out = set()
        for stack in state:
            out.update(_advance(stack, b))
        new = frozenset(out) if out else None
        if len(self._memo) >= self.MAX_MEMO:
            self._memo.clear()
        self._memo[key] = new
        return new

    def feed(self, state: Optional[State], data: bytes) -> Optional[State]:
        """The state after `data`, None if refused at any byte."""
        for b in data:
            if state is None:
                return None
            state = self.advance(state, b)
        return state

    def can_end(self, state: State) -> bool:
        """Whether the text so far is a complete value (EOS may come now)."""
        return any(_complete(stack) for stack in state)

    def must_end(self, state: State) -> bool:
        """Whether nothing but the end may follow (the value is closed)."""
        return state == _ENDED

    def accepts(self, text: bytes) -> bool:
        """Whether `text` is a complete JSON text of this grammar."""
        state = self.feed(self.start, text)
        return state is not None and self.can_end(state)

    def accepts_prefix(self, text: bytes) -> bool:
        """Whether `text` can still be completed into one."""
        return self.feed(self.start, text) is not None

    @staticmethod
    def string_frames(state: State) -> Optional[list]:
        """If every stack is inside a string between characters (no escape or UTF-8 sequence pending), their
        (characters still allowed (-1: any), characters still needed, DFA or None, DFA state); else None.
        Tokens of plain string bytes (no quote, backslash or control byte, whole UTF-8 characters) keep such
        a stack in its string: their masks then come without a walk (vocab.py)."""
        out = []
        for stack in state:
            if not stack:
                return None
            frame = stack[-1]
            if frame[0] != _S or frame[3] != 0:
                return None
            out.append((frame[1], frame[2], frame[4], frame[5]))
        return out


_ENDED: State = frozenset([()])
