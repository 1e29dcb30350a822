"""Token masks: for an automaton state, the token ids whose bytes the automaton accepts from it.

The vocabulary's token bytes are kept as a byte trie in flat arrays, nodes in depth-first (sorted) order,
so that a node's subtree is the range of nodes up to its `end`: a walk runs the automaton down the trie
and skips a whole subtree at the first byte refused. Two things keep that to a few ms:

* inside a string (the common case: most tokens of a JSON answer are string content) nearly the whole
  vocabulary is allowed, and a walk would visit all of it. Tokens of "plain" string bytes (no quote,
  backslash or control byte, whole UTF-8 characters) keep any such state where it is, so they come from
  a precomputed boolean array (and their character counts, for maxLength), and only the other tokens
  (about 6,000 of Qwen's 151,643) are walked, in a trie of their own. In a string with a pattern or
  format the plain tokens move its DFA (regex.py), so the DFA is run over all of them at once (numpy, a
  gather per byte position) and its end states checked against the characters left;
* masks are memoized by state (states are hashable): a free string, or the same place in a schema,
  makes the same mask, so most steps look one up.
"""

from __future__ import annotations

import collections
from array import array
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .automaton import Grammar, State


class _Trie:
    """Token byte strings as a trie in depth-first arrays: `byte`, `depth`, `end` (one past the node's
    subtree) and `token` (the id ending at the node, -1 if none) of each node."""

    def __init__(self, items: Sequence[Tuple[bytes, int]]):
        self.byte, self.depth, self.token = array("B"), array("H"), array("i")
        ends: List[int] = []
        path: List[int] = []  # the node indices of the previous token's bytes
        prev = b""
        for data, tid in sorted(items):
            shared = 0
            limit = min(len(prev), len(data))
            while shared < limit and prev[shared] == data[shared]:
                shared += 1
            del path[shared:]
            for d in range(shared, len(data)):
                path.append(len(self.byte))
                self.byte.append(data[d])
                self.depth.append(d)
                self.token.append(-1)
                ends.append(0)
            self.token[path[-1]] = tid
            prev = data
        # a node's subtree ends where the next node at its depth or shallower begins
        n = len(self.byte)
        end = array("i", [n]) * n
        open_nodes: List[int] = []
        for i in range(n):
            d = self.depth[i]
            while open_nodes and self.depth[open_nodes[-1]] >= d:
                end[open_nodes.pop()] = i
            open_nodes.append(i)
        self.end = end
        self.max_depth = max(self.depth, default=0) + 1

    def walk(self, grammar: Grammar, state: State, out: List[int]) -> None:
        """Append to `out` the ids of the tokens `grammar` accepts from `state`."""
        byte, depth, end, token = self.byte, self.depth, self.end, self.token
        advance = grammar.advance
        states: List[Optional[State]] = [state] + [None] * self.max_depth
        i, n = 0, len(byte)
        while i < n:
            d = depth[i]
            s = advance(states[d], byte[i])
            if s is None:
                i = end[i]  # the whole subtree shares the refused prefix
                continue
            states[d + 1] = s
            t = token[i]
            if t >= 0:
                out.append(t)
            i += 1


def _plain_chars(data: bytes) -> int:
    """The characters of `data` if it is plain string content (whole UTF-8, no quote, backslash or
    control character), else -1."""
    if any(b < 0x20 or b in (0x22, 0x5C) for b in data):
        return -1
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return -1
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # (Python's strict decoder refuses these already)
        return -1
    return len(text)


class TokenIndex:
    """The vocabulary of a tokenizer, indexed for masks: `mask(grammar, state)` is a boolean array over
    the model's `vocab_size` ids. Added tokens (specials, <think>, <tool_call>, ...) are never allowed;
    `eos_ids` are allowed exactly when the value is complete (and alone once nothing else may follow)."""

    MAX_MASKS = 256  # masks memoized (each vocab_size bytes: 39 MB at most for Qwen)

    def __init__(self, token_bytes: Dict[int, bytes], vocab_size: int, eos_ids: Sequence[int]):
        self.vocab_size = vocab_size
        self.token_bytes = token_bytes  # id -> bytes, for the processor to advance the automaton
        self.eos_ids = np.array(sorted(set(int(e) for e in eos_ids if 0 <= e < vocab_size)), np.int64)
        items = [(b, i) for i, b in token_bytes.items() if b and i < vocab_size]
        self.trie = _Trie(items)
        chars = np.full(vocab_size, -1, np.int32)
        irregular = []
        for b, i in items:
            chars[i] = _plain_chars(b)
            if chars[i] < 0:
                irregular.append((b, i))
        self.chars = chars  # plain tokens' character counts, -1 for the others
        self.plain = chars >= 0
        self.irregular = _Trie(irregular)
        # the plain tokens longest first, and their bytes by position (column i: those longer than i), for
        # running a string's DFA over all of them at once
        plain = sorted(((b, i) for b, i in items if chars[i] >= 0), key=lambda x: -len(x[0]))
        self.plain_ids = np.array([i for _, i in plain], np.int64)
        self.plain_chars = chars[self.plain_ids]
        lengths = np.array([len(b) for b, _ in plain], np.int64)
        flat = np.frombuffer(b"".join(b for b, _ in plain), np.uint8)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.columns = [flat[starts[:int((lengths > k).sum())] + k].astype(np.int32)
                        for k in range(int(lengths.max(initial=0)))]
        self.eos_mask = np.zeros(vocab_size, bool)  # after the EOS: EOS alone (a step already enqueued)
        self.eos_mask[self.eos_ids] = True
        self._masks: "collections.OrderedDict" = collections.OrderedDict()

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: Optional[int] = None) -> "TokenIndex":
        """The index of a `tokenizer.Tokenizer`'s BPE vocabulary (its byte-level tokens' bytes) for a model of
        `vocab_size` ids (default: the tokenizer's; a model's may be padded past it)."""
        from tokenizer.detokenizer import token_bytes

        added = {t.id for t in tokenizer.added_tokens}
        found = {}
        for i in range(tokenizer.vocab_size):
            text = None if i in added else tokenizer.id_to_token(i)
            if text is not None:
                found[i] = token_bytes(text)  # the bytes the detokenizer gives for it
        return cls(found, vocab_size or tokenizer.vocab_size, tokenizer.eos_token_ids)

    def allowed_ids(self, grammar: Grammar, state: State) -> np.ndarray:
        """The token ids allowed from `state` (sorted), EOS included where the value may end."""
        return np.flatnonzero(self.mask(grammar, state))

    def mask(self, grammar: Grammar, state: State) -> np.ndarray:
        """Boolean (vocab_size,): the tokens allowed from `state`; memoized by state (read-only: a copy
        before changing it)."""
        key = (id(grammar), state)
        mask = self._masks.get(key)
        if mask is not None:
            self._masks.move_to_end(key)
            return mask
        mask = self._compute(grammar, state)
        mask.flags.writeable = False
        self._masks[key] = mask
        if len(self._masks) > self.MAX_MASKS:
            self._masks.popitem(last=False)
        return mask

    def _compute(self, grammar: Grammar, state: State) -> np.ndarray:
        ids: List[int] = []
        if grammar.must_end(state):
            mask = np.zeros(self.vocab_size, bool)
        else:
            frames = grammar.string_frames(state)
            mask = np.zeros(self.vocab_size, bool)
            if frames is None:
                self.trie.walk(grammar, state, ids)
            else:  # inside a string: plain tokens that fit (and keep its pattern matchable), a walk of the others
                for left, need, dfa, d in frames:
                    if dfa is None:
                        mask |= self.plain if left < 0 else (self.plain & (self.chars <= left))
                    else:
                        mask[self.plain_ids[self._pattern(dfa, d, need, left)]] = True
                self.irregular.walk(grammar, state, ids)
            mask[np.array(ids, np.int64)] = True
        if grammar.can_end(state) or not mask.any():
            # a complete value may end here; a state with no token left (none should be) ends rather than
            # sample from nothing
            mask[self.eos_ids] = True
        return mask

    def _pattern(self, dfa, d: int, need: int, left: int) -> np.ndarray:
        """Boolean over `plain_ids`: the plain tokens after which a string at DFA state d (between
        characters, `need` / `left` characters to go) can still match: the DFA run over all of them at once,
        then its state checked against the characters left."""
        table = dfa.table()
        s = np.full(self.plain_ids.size, d, np.int32)
        for col in self.columns:
            k = col.size
            s[:k] = table[s[:k] * 256 + col]
        chars = self.plain_chars
        after_need = np.maximum(need - chars, 0)
        after_left = np.full(chars.size, -1, np.int64) if left < 0 else left - chars
        ok = dfa.feasible_many(s, after_need, after_left)
        return ok if left < 0 else ok & (after_left >= 0)


_INDEXES: Dict[Tuple[int, int], Tuple[object, TokenIndex]] = {}


def token_index(tokenizer, vocab_size: Optional[int] = None) -> TokenIndex:
    """`TokenIndex.from_tokenizer`, built once per tokenizer and vocabulary size (about 1 s for Qwen's)."""
    key = (id(tokenizer), vocab_size or tokenizer.vocab_size)
    hit = _INDEXES.get(key)
    if hit is None or hit[0] is not tokenizer:
        hit = _INDEXES[key] = (tokenizer, TokenIndex.from_tokenizer(tokenizer, vocab_size))
    return hit[1]
