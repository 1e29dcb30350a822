"""Numeric bounds (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, and `multipleOf` on
integers) enforced digit by digit: a byte is allowed exactly when some number that starts with the text
so far (and the byte) is in range.

A bounded number is written without an exponent: an integer as digits, a `number` as digits with an
optional fraction of up to 15 digits; at most 15 integer digits, as everywhere in the automaton. Its value
is then a multiple of 10^-15 (1 for an integer), and the bounds are compared exactly, as decimals (a
bound is read from its shortest decimal text: `0.1` is 1/10, not the double nearest to it): an exclusive
bound becomes the next multiple of the grid inside it. `-0` (and `-0.0`) is zero.

The sign picks a side, each side an interval [A, B] of magnitudes (B None: no bound). The state of a
digit string is not the digits but their relation to the bounds' digits, which is all that decides what
may follow: `k` integer digits (or fraction digits, in the fraction), and for each bound -1, 0 or +1,
the comparison of the digits so far with the bound's digits in the same places (0: equal so far). With
`multipleOf` q the remainder mod q joins it. States stay few (at most 2 x 31 x 9 x q), hashable, and the
token masks of the automaton memoize well.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Dict, Optional, Tuple

MAX_INT, MAX_FRAC = 15, 15  # the automaton's digit bounds (automaton.py)

# a state: (phase, side, k, cA, cB, r)
# phase "M" (sign read, no digit yet), "I" (integer digits, not starting with 0), "Z" (integer part "0"),
# "D" (after the point), "F" (fraction digits); side +1 / -1; k digits in the phase; cA / cB the comparison
# with the lower / upper bound's digits (cB -1 throughout when there is no upper bound); r the remainder
State = Tuple[str, int, int, int, int, int]


def _cmp(a: int, b: int) -> int:
    return (a > b) - (a < b)


def exact(value) -> Fraction:
    """A JSON number as an exact fraction (a float by its shortest decimal text)."""
    if isinstance(value, float):
        return Fraction(Decimal(repr(value)))
    return Fraction(value)


class _Side:
    """Magnitudes A..B (grid units), as digit strings: `a_int`, `a_frac` (MAX_FRAC digits, or none for an
    integer) and the same of B."""

    __slots__ = ("A", "B", "a_int", "a_frac", "a_rest", "b_int", "b_frac", "dA", "dB")

    def __init__(self, A: int, B: Optional[int], frac: int):
        self.A, self.B = A, B
        scale = 10 ** frac
        self.a_int, self.a_frac = str(A // scale), (str(A % scale).zfill(frac) if frac else "")
        # a_rest[f]: whether the lower bound's fraction digits from f on are all zeros
        self.a_rest = tuple(set(self.a_frac[f:]) <= {"0"} for f in range(frac + 1))
        self.dA = len(self.a_int)
        if B is None:
            self.b_int, self.b_frac, self.dB = "", "", MAX_INT + 1
        else:
            self.b_int, self.b_frac = str(B // scale), (str(B % scale).zfill(frac) if frac else "")
            self.dB = len(self.b_int)


class Bounds:
    """The bounds of one integer or number schema. Identity-hashed: automaton frames hold it."""

    __slots__ = ("integer", "frac", "q", "sides", "first", "_feasible", "lo", "hi")

    def __init__(self, integer: bool, lo: Optional[Fraction], lo_excl: bool, hi: Optional[Fraction],
                 hi_excl: bool, q: Optional[int] = None):
        self.integer, self.q = integer, q
        self.frac = 0 if integer else MAX_FRAC
        scale = 10 ** self.frac
        # the bounds on the grid: value = N / scale, LO <= N <= HI
        LO = HI = None
        if lo is not None:
            x = lo * scale
            LO = -((-x.numerator) // x.denominator)  # ceil
            if lo_excl and LO == x:
                LO += 1
        if hi is not None:
            x = hi * scale
            HI = x.numerator // x.denominator  # floor
            if hi_excl and HI == x:
                HI -= 1
        self.lo, self.hi = LO, HI
        cap = 10 ** (MAX_INT + self.frac) - 1  # the largest magnitude the digits allow
        self.sides: Dict[int, Optional[_Side]] = {}
        for side, (a, b) in ((1, (LO, HI)), (-1, (None if HI is None else -HI, None if LO is None else -LO))):
            A = 0 if a is None else max(a, 0)
            B = None if b is None or b > cap else b
            self.sides[side] = None if (B is not None and B < A) or A > cap else _Side(A, B, self.frac)
        self._feasible: Dict[State, bool] = {}
        first = {d for d in b"0123456789" if self.step(self.begin(1), d) is not None}
        if self.sign() is not None:
            first.add(0x2D)
        self.first = frozenset(first)  # the bytes a number in range may start with

    def empty(self) -> bool:
        """Whether no number of the digits the automaton allows is in range."""
        return not self.first

    def begin(self, side: int) -> State:
        """The state before the first digit (after the `-` for side -1)."""
        s = self.sides[side]
        return ("M", side, 0, 0, 0 if s is not None and s.B is not None else -1, 0)

    def sign(self) -> Optional[State]:
        """The state after a `-`, None if no negative number is in range."""
        if self.sides[-1] is None:
            return None
        st = self.begin(-1)
        return st if any(self.step(st, d) is not None for d in b"0123456789") else None

    def step(self, st: State, b: int) -> Optional[State]:
        """The state after byte b (a digit or `.`), None if no number in range starts so."""
        phase, side, k, cA, cB, r = st
        s = self.sides[side]
        if s is None:
            return None
        if b == 0x2E:
            if self.integer or phase not in "IZ":
                return None
            # the integer part is complete: its comparison with each bound's is final
            cA = -1 if k < s.dA else 1 if k > s.dA else cA
            cB = -1 if s.B is None or k < s.dB else 1 if k > s.dB else cB
            new = ("D", side, 0, cA, cB, 0)
        elif 0x30 <= b <= 0x39:
            d = b - 0x30
            if phase in "DF":
                if k >= self.frac:
                    return None
                if cA == 0:
                    cA = _cmp(d, ord(s.a_frac[k]) - 0x30)
                if cB == 0:
                    cB = _cmp(d, ord(s.b_frac[k]) - 0x30)
                new = ("F", side, k + 1, cA, cB, 0)
            else:
                if phase == "Z" or k >= MAX_INT:
                    return None
                if k + 1 > s.dA:
                    cA = 1
                elif cA == 0:
                    cA = _cmp(d, ord(s.a_int[k]) - 0x30)
                if s.B is not None:
                    if k + 1 > s.dB:
                        return None
                    if cB == 0:
                        cB = _cmp(d, ord(s.b_int[k]) - 0x30)
                new = ("Z" if phase == "M" and d == 0 else "I", side, k + 1, cA, cB,
                       (r * 10 + d) % self.q if self.q else 0)
        else:
            return None
        return new if self.feasible(new) else None

    def done(self, st: State) -> bool:
        """Whether the number may end here (the digits so far are a number in range)."""
        phase, side, k, cA, cB, r = st
        s = self.sides[side]
        if phase in "IZ":
            low = k > s.dA or (k == s.dA and (cA == 1 or (cA == 0 and s.a_rest[0])))
            high = s.B is None or k < s.dB or (k == s.dB and cB <= 0)
            return low and high and r == 0
        if phase == "F":
            return (cA == 1 or (cA == 0 and s.a_rest[k])) and cB <= 0
        return False

    def feasible(self, st: State) -> bool:
        """Whether some number in range starts with the digits of `st`."""
        got = self._feasible.get(st)
        if got is None:
            got = self._feasible[st] = self._search(st)
            if len(self._feasible) > 100_000:
                self._feasible.clear()
        return got

    def _search(self, st: State) -> bool:
        phase, side, k, cA, cB, r = st
        s = self.sides[side]
        if phase in "DF":
            # A's remaining fraction digits can always be matched (or passed), B's undercut: only a comparison
            # that is already final can rule the number out
            return cA != -1 and cB != 1
        # integer digits: some length L (k..MAX_INT, or just 1 after a leading 0) with a suffix of L - k digits
        # in range; the fraction (of a `number`) can only lift the value past A's integer part, never past B's
        top = 1 if phase == "Z" else MAX_INT
        for L in range(max(k, 1), top + 1):
            j = L - k
            lo, hi = 0, 10 ** j - 1
            if L < s.dA or (L == s.dA and cA == -1):
                continue
            if L == s.dA and cA == 0 and j:
                lo = int(s.a_int[k:])
            if s.B is not None:
                if L > s.dB or (L == s.dB and cB == 1):
                    continue
                if L == s.dB and cB == 0 and j:
                    hi = int(s.b_int[k:])
            if lo > hi:
                continue
            if self.q is None:
                return True
            base = r * 10 ** j
            s0 = lo + (-(base + lo)) % self.q  # the least suffix >= lo making the number a multiple of q
            if s0 <= hi:
                return True
        return False
