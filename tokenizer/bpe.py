"""Byte-level BPE: one pre-token -> token ids, by applying merges in rank order.

Symbols are kept as vocab ids rather than strings so a pair lookup is one int hash:
a pair (left, right) is the key ``left << shift | right`` and its value packs
``rank << shift | merged_id``, so comparing two values compares ranks first and the
merged id comes out with a mask. Results are cached per pre-token, since running text
repeats the same words over and over.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from itertools import repeat
from operator import itemgetter, lshift, or_
from typing import Iterable, Sequence

from .errors import TokenizerError
from .pretokenize import BYTE_TO_CHAR

# Cached pre-tokens before the cache is emptied and refilled; bounds memory on endless
# streams of unique text while keeping a realistic working set (tens of MB at most).
_CACHE_LIMIT = 200_000


class _PieceCache(dict):
    """pre-token -> ids; a miss runs BPE (``dict.__missing__`` keeps hits in C)."""

    __slots__ = ("_compute",)

    def __init__(self, compute):
        super().__init__()
        self._compute = compute

    def __missing__(self, piece: str) -> list[int]:
        ids = self._compute(piece)
        if len(self) >= _CACHE_LIMIT:
            self.clear()
        self[piece] = ids
        return ids


def parse_merges(merges: Iterable, where: str) -> list[tuple[str, str]]:
    """Merges as (left, right) pairs, from either tokenizer.json form: "a b" or ["a", "b"]."""
    pairs: list[tuple[str, str]] = []
    for i, m in enumerate(merges):
        if isinstance(m, str):
            parts = m.split(" ")
        elif isinstance(m, (list, tuple)):
            parts = m
        else:
            parts = ()
        if len(parts) != 2 or not all(isinstance(p, str) for p in parts):
            raise TokenizerError(f"malformed {where}: merge #{i} is {m!r}, expected \"a b\" or [\"a\", \"b\"]")
        pairs.append((parts[0], parts[1]))
    return pairs


class BytePairEncoder:
    """The BPE model of a byte-level tokenizer (vocab + ranked merges).

    ``merges`` is the list from tokenizer.json (or merges.txt lines) in either form, "a b"
    strings or ["a", "b"] pairs; ``where`` names the file for error messages.
    """

    def __init__(self, vocab: dict[str, int], merges: Sequence, where: str = "tokenizer.json"):
        self.vocab = vocab
        max_id = max(vocab.values(), default=0)
        self._shift = shift = max(max_id.bit_length(), 1)
        self._mask = (1 << shift) - 1
        # Larger than any packed value: "no merge for this pair".
        self._none = (len(merges) + 1) << shift
        try:
            self._merges = self._build_table(vocab, merges, shift)
        except (KeyError, TypeError, ValueError, AttributeError):
            # Something is malformed: redo it slowly to say exactly what.
            self._explain_bad_merges(vocab, merges, where)
            raise
        get = vocab.get
        # A byte with no vocab entry is dropped (tokenizers does the same with no unk token).
        self._byte_ids = [get(BYTE_TO_CHAR[b]) for b in range(256)]
        self._complete_bytes = None not in self._byte_ids
        self.cache = _PieceCache(self.bpe)

    @staticmethod
    def _build_table(vocab: dict[str, int], merges: Sequence, shift: int) -> dict[int, int]:
        # On the CLI's startup path: 151k merges, so everything runs in C-level map()s
        # rather than a Python loop (about 4x faster).
        if merges and isinstance(merges[0], str):
            pairs = list(map(str.split, merges, repeat(" ")))
        else:
            pairs = merges
        if pairs and set(map(len, pairs)) != {2}:
            raise ValueError("a merge is not a pair")
        get = vocab.__getitem__
        left = map(get, map(itemgetter(0), pairs))
        right = map(get, map(itemgetter(1), pairs))
        merged = map(get, map("".join, pairs))
        keys = map(or_, map(lshift, left, repeat(shift)), right)
        values = map(or_, map(lshift, range(len(pairs)), repeat(shift)), merged)
        # dict() keeps the last value of a duplicated merge, as tokenizers' map does.
        return dict(zip(keys, values))

    @staticmethod
    def _explain_bad_merges(vocab: dict[str, int], merges: Sequence, where: str) -> None:
        for rank, (a, b) in enumerate(parse_merges(merges, where)):
            for part in (a, b, a + b):
                if part not in vocab:
                    raise TokenizerError(f"malformed {where}: merge #{rank} ({a!r} {b!r}) uses {part!r}, which is not in the vocab")

    def bpe(self, piece: str) -> list[int]:
        """Token ids of one pre-token (uncached).

        Merges the lowest-ranked adjacent pair first, the leftmost one among equals, until
        no pair has a merge: the order tokenizers applies them in. Symbols live in a linked
        list over the initial byte positions; a heap holds candidate merges as single ints
        ``packed_value << pos_bits | position`` (int compares beat tuple compares), and
        entries made stale by earlier merges are recognised when popped.
        """
        byte_ids = self._byte_ids
        ids = [byte_ids[b] for b in piece.encode("utf-8")]
        if not self._complete_bytes:
            ids = [i for i in ids if i is not None]
        n = len(ids)
        if n < 2:
            return ids
        get = self._merges.get
        shift = self._shift
        mask = self._mask
        pbits = n.bit_length()
        pmask = (1 << pbits) - 1
        heap = [
            v << pbits | i
            for i, v in enumerate(map(get, map(or_, map(lshift, ids, repeat(shift)), ids[1:])))
            if v is not None
        ]
        if not heap:
            return ids
        heapify(heap)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        while heap:
            entry = heappop(heap)
            i = entry & pmask
            value = entry >> pbits
            left = ids[i]
            j = nxt[i]
            if left < 0 or j < 0 or get(left << shift | ids[j]) != value:
                continue  # stale: one of the two symbols has changed since the push
            merged = value & mask
            ids[i] = merged
            ids[j] = -1  # absorbed into the symbol at i
            k = nxt[j]
            nxt[i] = k
            if k >= 0:
                prv[k] = i
                v = get(merged << shift | ids[k])
                if v is not None:
                    heappush(heap, v << pbits | i)
            p = prv[i]
            if p >= 0:
                v = get(ids[p] << shift | merged)
                if v is not None:
                    heappush(heap, v << pbits | p)
        return [x for x in ids if x >= 0]
