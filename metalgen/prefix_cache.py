"""A prefix cache for the batched engine: the keys and values of sequences already computed (finished
requests, and the prompts of those still running), kept by their token ids, so that a prompt that begins
like one of them (the same system prompt, the previous turns of a chat) starts from their KV and prefills
only the rest. Bounded by a byte budget; the least recently used tails go first.

The index is a radix tree of token ids: each node holds a run of tokens and the KV of exactly those
positions (every layer stacked: (layers, kv_heads, n, head_dim)), its children the runs that may follow.
Why a tree of tokens rather than hashes of fixed blocks (vLLM's 16 tokens, or 64): a match may end at any
token, which is what a chat needs (the next turn's rendering agrees with the last one up to wherever the
template renders the reply differently, e.g. Qwen3's dropped thinking block, rarely at a block boundary);
and a shared prefix is held once, as one node that the sequences after it branch from, so a system prompt
that a thousand requests share costs its KV once and a sequence that is a prefix of another is never held
twice. Eviction removes leaves, least recently used first (a lookup or an insertion marks its whole path as
used, so a node is never older than what follows it): what goes first is the tail of the stalest
conversation, and a shared prefix stays while anything after it is in use.

Positions are absolute: a node's KV is valid only after the exact tokens on its path (RoPE has turned the
keys at their positions), which is what a prefix match guarantees.

Hybrid stacks: a Gated DeltaNet layer's state is not a per-position array and cannot be cut at a prefix, so
a sequence inserted with its `states` (every such layer's conv and recurrent state after its last token)
keeps them at the node that ends there, a snapshot. A prompt may then start only at a snapshot
(`match_state`): the longest held sequence that ends on one, and the attention layers' KV up to there.
Not thread-safe: the engine's worker thread is its only user.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mlx.core as mx

from .cache import common_prefix
from .errors import MetalgenError

# (begin, end) -> (keys, values) of tokens[begin:end], each (layers, kv_heads, end - begin, head_dim)
KVSlicer = Callable[[int, int], Tuple[mx.array, mx.array]]
# () -> the Gated DeltaNet layers' states after a sequence's last token (arrays of its own, in layer order)
StateSnapshot = Callable[[], List[mx.array]]


class _Node:
    __slots__ = ("tokens", "keys", "values", "states", "children", "parent", "used")

    def __init__(self, tokens: Tuple[int, ...], keys: Optional[mx.array], values: Optional[mx.array],
                 parent: Optional["_Node"]):
        self.tokens = tokens  # the run of ids this node adds after its parent's path
        self.keys, self.values = keys, values  # (layers, kv_heads, len(tokens), head_dim); None at the root
        self.states: Optional[List[mx.array]] = None  # a hybrid stack's states after this node's last token
        self.children: Dict[int, "_Node"] = {}  # by each child's first id
        self.parent = parent
        self.used = 0  # the clock of the last lookup or insertion that went through it

    @property
    def nbytes(self) -> int:
        kv = 0 if self.keys is None else self.keys.nbytes + self.values.nbytes
        return kv + (sum(a.nbytes for a in self.states) if self.states else 0)


def _common(run: Tuple[int, ...], ids: Sequence[int], at: int) -> int:
    """How many ids of `run` equal ids[at:] from its start."""
    part = tuple(ids[at : at + len(run)])
    if part == run:  # the usual case, compared in C
        return len(run)
    return common_prefix(run, part)


def _copy(a: mx.array) -> mx.array:
    # a slice is a view that keeps its whole source buffer alive: a node holds a buffer of its own, so that
    # its bytes are what the budget counts and evicting it frees them
    return mx.contiguous(a)


class PrefixCache:
    """Keys and values of token sequences, found by longest prefix, bounded by `max_bytes` (least recently
    used out). `match(ids)` says how many leading ids are held, `fetch(ids, n)` gives their KV, `insert(ids,
    slicer)` adds a sequence (asking `slicer` only for the positions not already held)."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise MetalgenError(f"a prefix cache's budget must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self.nbytes = 0  # the KV held, all nodes
        self._root = _Node((), None, None, None)
        self._clock = itertools.count(1)

    def clear(self) -> None:
        """Forget everything (e.g. after a fault, when what was inserted may never have been computed)."""
        self._root = _Node((), None, None, None)
        self.nbytes = 0

    @property
    def tokens(self) -> int:
        """The positions held, all nodes (a shared prefix counts once)."""
        return sum(len(n.tokens) for n in self._nodes())

    def _nodes(self):
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _walk(self, ids: Sequence[int]) -> Tuple[List[Tuple[_Node, int]], int]:
        """The nodes `ids` runs through from the root, each with how many of its tokens match (all but maybe
        the last's), and the ids matched in all."""
        node, at, path = self._root, 0, []
        while at < len(ids):
            child = node.children.get(ids[at])
            if child is None:
                break
            m = _common(child.tokens, ids, at)  # >= 1: its first id is ids[at]
            path.append((child, m))
            at += m
            if m < len(child.tokens):
                break
            node = child
        return path, at

    def _touch(self, path: List[Tuple[_Node, int]]) -> None:
        now = next(self._clock)
        for node, _ in path:
            node.used = now

    def match(self, ids: Sequence[int]) -> int:
        """How many leading ids of `ids` have their KV here (0 if none); marks nothing as used."""
        return self._walk(ids)[1]

    def match_state(self, ids: Sequence[int], limit: int) -> int:
        """The longest held prefix of `ids` of at most `limit` ids that ends on a state snapshot (0 if none):
        where a hybrid stack's prompt may start (`fetch` and `fetch_states` give what it starts from)."""
        best, at = 0, 0
        for node, m in self._walk(ids)[0]:
            at += m
            if m < len(node.tokens) or at > limit:
                break
            if node.states is not None:
                best = at
        return best

    def fetch_states(self, ids: Sequence[int], n: int) -> List[mx.array]:
        """The state snapshot held after ids[:n] (n from `match_state`); the path is marked as used."""
        path, at = self._walk(ids[:n])
        node, m = path[-1] if path else (None, 0)
        if at != n or node is None or m < len(node.tokens) or node.states is None:
            raise MetalgenError(f"the prefix cache holds no state after the first {n} ids of this sequence")
        self._touch(path)
        return node.states

    def fetch(self, ids: Sequence[int], n: int) -> Tuple[mx.array, mx.array]:
        """The keys and values of ids[:n], each (layers, kv_heads, n, head_dim), for 0 < n <= match(ids); the
        path is marked as used. The arrays are the caller's: evicting their nodes later does not touch them."""
        path, held = self._walk(ids)
        if not 0 < n <= held:
            raise MetalgenError(f"the prefix cache holds {held} leading ids of this sequence, not {n}")
        self._touch(path)
        keys, values, left = [], [], n
        for node, _ in path:
            take = min(left, len(node.tokens))
            keys.append(node.keys if take == len(node.tokens) else node.keys[:, :, :take])
            values.append(node.values if take == len(node.tokens) else node.values[:, :, :take])
            left -= take
            if not left:
                break
        if len(keys) == 1:
            return keys[0], values[0]
        return mx.concatenate(keys, axis=2), mx.concatenate(values, axis=2)

    def insert(self, ids: Sequence[int], slicer: KVSlicer, states: Optional[StateSnapshot] = None) -> int:
        """Hold the KV of the sequence `ids`: the positions already held are shared (a held sequence that
        `ids` extends grows, one that extends `ids` already covers it), and `slicer(begin, end)` is asked
        for the keys and values of ids[begin:end] only. At most what fits the budget with the prefix it
        hangs from is stored; then the least recently used tails of other sequences go until the cache is
        within its budget. `states` (hybrid stacks): asked, unless held already, for the snapshot to keep
        at the node ending after the last id (a node is cut there if need be), when the whole sequence is
        held. Returns the positions added."""
        if self.max_bytes == 0 or not ids:
            return 0
        path, at = self._walk(ids)
        if at == len(ids):  # held already, whole or as the prefix of a longer sequence
            if states is not None:
                node, m = path[-1]
                if m < len(node.tokens):  # the sequence ends inside a node: cut it there for the snapshot
                    node = self._split(node, m)
                    path[-1] = (node, m)
                if node.states is None:
                    self._keep_states(node, states)
            self._touch(path)
            self._evict()
            return 0
        parent = self._root
        if path:
            node, m = path[-1]
            parent = self._split(node, m) if m < len(node.tokens) else node
            path[-1] = (parent, m)
        self._touch(path)
        keys, values = slicer(at, len(ids))
        per_token = (keys.nbytes + values.nbytes) // (len(ids) - at)
        held = sum(node.nbytes for node, _ in path)  # the prefix it hangs from: kept while it is in use
        fits = (self.max_bytes - held) // max(1, per_token)
        if fits < 1:
            return 0
        end = min(len(ids), at + fits)
        if end < len(ids):  # ask again rather than slice: a view would keep the whole array alive
            keys, values = slicer(at, end)
        leaf = _Node(tuple(ids[at:end]), keys, values, parent)
        leaf.used = next(self._clock)
        parent.children[leaf.tokens[0]] = leaf
        self.nbytes += leaf.nbytes
        # evaluated now: the lazy slices would otherwise keep the arrays they were cut from (a batch's whole
        # cache buffers) alive until someone reads them
        mx.async_eval(keys, values)
        if states is not None and end == len(ids):
            self._keep_states(leaf, states)
        self._evict()
        return end - at

    def _keep_states(self, node: _Node, states: StateSnapshot) -> None:
        node.states = [_copy(a) for a in states()]  # buffers of its own, as the KV's (they are counted)
        self.nbytes += sum(a.nbytes for a in node.states)
        mx.async_eval(node.states)

    def _split(self, node: _Node, m: int) -> _Node:
        """Cut `node` after its first m tokens: a new node holds those (in its place under the parent) and
        `node`, keeping the rest, becomes its only child. Returns the new node."""
        head = _Node(node.tokens[:m], _copy(node.keys[:, :, :m]), _copy(node.values[:, :, :m]), node.parent)
        head.used = node.used
        node.parent.children[head.tokens[0]] = head
        before = node.nbytes
        node.tokens = node.tokens[m:]
        node.keys, node.values = _copy(node.keys[:, :, m:]), _copy(node.values[:, :, m:])
        node.parent = head
        head.children[node.tokens[0]] = node
        self.nbytes += head.nbytes + node.nbytes - before
        mx.async_eval(head.keys, head.values, node.keys, node.values)
        return head

    def _evict(self) -> None:
        """Remove leaves, least recently used first, until the cache is within its budget."""
        if self.nbytes <= self.max_bytes:
            return
        # (the `id` only keeps the heap from comparing nodes: no two leaves share a clock)
        heap = [(n.used, id(n), n) for n in self._nodes() if not n.children]
        heapq.heapify(heap)
        while self.nbytes > self.max_bytes and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.tokens[0]]
            self.nbytes -= node.nbytes
            node.keys = node.values = node.states = None
            if parent is not self._root and not parent.children:  # a leaf now, as old as its last use
                heapq.heappush(heap, (parent.used, id(parent), parent))
