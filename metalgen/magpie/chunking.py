"""Long text for Magpie, as NeMo 3.0.0's `do_tts` runs it: the text cut into sentence chunks, then one
generation per chunk with state carried from chunk to chunk.

Two halves, both plain Python / numpy so either generation loop can use them:

- Chunking (`chunk_texts`): a text whose word count reaches its language's threshold (45 words for
  English: about 20 s of speech) is cut into sentences; anything shorter stays one chunk, exactly as
  given. Each chunk is then encoded on its own (tokenizer ids + text EOS).
- The cross-chunk rules (`ChunkState`, `ChunkWindow`, `ChunkProgress`): chunk k > 0 sees a text
  window of its own tokens plus up to 20 tokens of the previous window (the text encoder's outputs
  for those history tokens are the ones computed for the previous window), starts with a prior on
  the first new tokens, and is steered by a different, shaped prior; a chunk that is not the last
  ends on its EOS or is cut 2 steps after the alignment reaches its text's end. The audio itself is
  not carried: every chunk starts again from the speaker context and the BOS block.

docs/magpie.md, "Long text", lists the NeMo facts this follows.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

# NeMo's LanguageThresholds: words (characters for zh and ja) at which a text is cut into sentences.
LANGUAGE_THRESHOLDS: Dict[str, int] = {
    "en": 45, "es": 73, "fr": 69, "de": 50, "it": 53, "vi": 50, "zh": 100, "hi": 50, "ja": 80,
}
# Sentence ends of every language; the ones after them are split on even without a following space
# (those languages do not put spaces between sentences).
SENTENCE_ENDS = (".", "?", "!")
NATIVE_SENTENCE_ENDS: Dict[str, Tuple[str, ...]] = {
    "ja": ("。", "？", "！", "…"),
    "zh": ("。", "？", "！", "…"),
    "hi": ("।", "॥"),
}
# A period after one of these words never ends a sentence (a name follows).
TITLES = frozenset({"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "rev", "gov", "gen", "col", "lt", "sgt", "capt"})


def word_count(text: str, language: str) -> int:
    """Words in `text` (whitespace-separated), non-space characters for zh, and for ja the words of
    pyopenjtalk's front end where it is installed (characters otherwise, or where it finds none), as
    NeMo counts them."""
    if not text or not text.strip():
        return 0
    if language == "ja":
        from .ja_g2p import njd_word_count

        words = njd_word_count(text)
        if words:
            return words
    if language in ("zh", "ja"):
        return sum(1 for c in text if not c.isspace())
    return len(text.split())


def needs_split(text: str, language: str, thresholds: Optional[Mapping[str, int]] = None) -> bool:
    """Whether `text` reaches its language's threshold (unknown languages use English's)."""
    table = LANGUAGE_THRESHOLDS if thresholds is None else thresholds
    limit = table.get(language, table.get("en", 45))
    return word_count(text, language) >= limit


def split_sentences(text: str, language: str = "en") -> List[str]:
    """NeMo's sentence splitter: hyphens become spaces and asterisks go; a sentence ends at ".", "?"
    or "!" followed by whitespace or the end of the text (not after a title such as "Dr."), or at the
    language's own marks ("。", "।", ...) wherever they stand; each sentence is stripped and its first
    letter upper-cased; text after the last end is a sentence of its own."""
    if not text or not text.strip():
        return []
    native = NATIVE_SENTENCE_ENDS.get(language, ())
    ends = set(SENTENCE_ENDS) | set(native)
    text = text.replace("-", " ").replace("*", "")
    out: List[str] = []
    start = 0  # where the current sentence starts
    for i, ch in enumerate(text):
        if ch not in ends:
            continue
        following = text[i + 1] if i + 1 < len(text) else ""
        if ch not in native and not (following == "" or following.isspace()):
            continue  # "3.5", "a.m.": a Western mark ends a sentence only before a space
        if ch == ".":
            words = text[start:i].split()
            if words and words[-1].lower() in TITLES:
                continue
        out.append(text[start:i + 1].strip())
        # Skip the one whitespace character after the mark (the strip takes any others).
        start = i + 2 if following.isspace() else i + 1
    if start < len(text):
        rest = text[start:].strip()
        if rest:
            out.append(rest)
    return [s if s[0].isupper() else s[0].upper() + s[1:] for s in out if s]


def chunk_texts(text: str, language: str, thresholds: Optional[Mapping[str, int]] = None) -> List[str]:
    """The chunks `do_tts` speaks one after another: `text` itself when it is below its language's
    threshold, else its sentences. Japanese loses its whitespace first, as in do_tts."""
    if language == "ja":
        text = "".join(text.split())
    if needs_split(text, language, thresholds):
        return split_sentences(text, language)
    return [text]


def chunk_ids(text: str, language: str, encode: Callable[[str], Sequence[int]],
              thresholds: Optional[Mapping[str, int]] = None) -> List[List[int]]:
    """The model's input ids of each chunk: `encode(chunk)` (tokenizer ids + text EOS) per chunk of
    `chunk_texts`."""
    return [list(encode(t)) for t in chunk_texts(text, language, thresholds)]


# ------------------------------------------------------------------------------- cross-chunk rules


@dataclasses.dataclass(frozen=True)
class ChunkRules:
    """NeMo 3.0.0's `ChunkedInferenceConfig` (fixed in its code, not in the checkpoint)."""

    history_tokens: int = 20  # at most this many tokens of the previous window are kept
    init_weights: Tuple[float, ...] = (0.5, 1.0, 0.8, 0.2, 0.2)  # first prior, from the first new token on
    weights: Tuple[float, ...] = (0.2, 1.0, 0.6, 0.4, 0.2, 0.2)  # attended - 1, attended, then lookahead
    flat_prior_max_len: int = 35  # windows this short get a flat (all ones) prior
    sink_count: int = 10  # a position attended this often pushes itself and all before it down
    near_end: int = 3  # later chunks: attended >= L - 3 is "near the end"
    first_near_end: int = 2  # first chunk (NeMo's single-chunk prior): attended >= L - 2
    forced_end_after: int = 3  # a chunk that is not the last is cut when this count is reached


@dataclasses.dataclass
class ChunkWindow:
    """What one chunk is generated from: `ids` the text window (history tokens, then the chunk's own
    tokens ending with the text EOS), `n_new` the chunk's own tokens, `left_offset` the window's first
    position in the whole text's tokens (attended positions are counted in those), `first` / `last`
    whether it is the first / last chunk."""

    ids: np.ndarray
    n_new: int
    left_offset: int
    first: bool
    last: bool

    @property
    def n_history(self) -> int:
        return len(self.ids) - self.n_new

    def initial_prior(self, eps: float, rules: ChunkRules) -> Optional[np.ndarray]:
        """The conditional row's prior (L,) for the chunk's first step (None for the first chunk):
        eps^2 on the history, `rules.init_weights` on the first new tokens, eps after them."""
        if self.first:
            return None
        row = np.full((len(self.ids),), eps, dtype=np.float32)
        start = self.n_history
        row[:start] = eps * eps
        for d, w in enumerate(rules.init_weights):
            if start + d < len(row):
                row[start + d] = w
        return row


@dataclasses.dataclass
class ChunkState:
    """What one chunk leaves to the next (NeMo's `ChunkState`, one item): the previous window's ids
    and its text encoder output (history rows included), the window offset, the last attended text
    position (in the whole text's tokens), and whether speech has ended."""

    rules: ChunkRules = dataclasses.field(default_factory=ChunkRules)
    history_ids: Optional[np.ndarray] = None
    history_memory: Any = None  # (1, W, d) array of the previous window
    previous_window: Optional[int] = None
    left_offset: int = 0
    last_attended: int = 1
    ended: bool = False
    chunks: int = 0  # chunks opened so far

    def open(self, ids: Sequence[int], last: bool) -> ChunkWindow:
        """The next chunk's window from its ids (tokens + text EOS). Its history is the tail of the
        previous window (previous history included), as many tokens as the chunk has, at most
        `rules.history_tokens`."""
        new = np.asarray(ids, dtype=np.int64).reshape(-1)
        first = self.chunks == 0
        if first:
            window = new
        else:
            keep = len(new) + min(len(new), self.rules.history_tokens)
            window = np.concatenate([self.history_ids, new])[-keep:]
        if self.previous_window is not None:
            # The tokens that slid out of the window on the left.
            self.left_offset += self.previous_window + len(new) - len(window)
        self.previous_window = len(window)
        self.history_ids = window
        self.chunks += 1
        return ChunkWindow(window, len(new), self.left_offset, first, bool(last))

    def splice(self, window: ChunkWindow, memory):
        """The text encoder's output (1, L, d) for `window` with its history rows replaced by the
        previous window's last rows (the encoder is causal with learned positions, so those rows as
        first computed are kept); remembered for the next chunk."""
        if not window.first and window.n_history:
            import mlx.core as mx

            memory = mx.concatenate([self.history_memory[:, -window.n_history:], memory[:, window.n_history:]],
                                    axis=1)
        self.history_memory = memory
        return memory


def attended_position(scores: np.ndarray, last: int, counter: Dict[int, int], text_len: int, window: int,
                      left_offset: int) -> int:
    """NeMo's get_most_attended_text_timestep for one row, positions counted in the whole text:
    step over a sink at `last` (attended 8 times), search `window` positions from it (in the
    window's coordinates, never the last 3), text_len - 1 if nothing is left; counts the result.
    A `last` left of the window gives a negative start, which NeMo slices as Python does (from the
    end); numpy slices the same way."""
    from .generate import IGNORED_TAIL, SINK_SKIP_COUNT

    if counter.get(last, 0) >= SINK_SKIP_COUNT:
        last += 1
    rel = last - left_offset
    seg = scores[rel:min(rel + window, text_len - IGNORED_TAIL)]
    attended = text_len - 1 + left_offset if seg.size == 0 else last + int(np.argmax(seg))
    counter[attended] = counter.get(attended, 0) + 1
    return attended


def multi_chunk_prior_row(attended: int, counter: Dict[int, int], text_len: int, left_offset: int, eps: float,
                          rules: ChunkRules) -> np.ndarray:
    """NeMo's construct_multi_chunk_prior for one row of a later chunk: flat for windows of at most
    `rules.flat_prior_max_len` tokens, else eps^2 before attended - 1 and from attended + 5 on,
    `rules.weights` between; every position attended `rules.sink_count` times (right of the window
    start) pushes itself and all before it to eps^2. Indices follow NeMo's (a negative attended
    position wraps as a Python index)."""
    eps2 = eps * eps
    row = np.full((text_len,), eps, dtype=np.float32)
    pos = attended - left_offset
    if text_len <= rules.flat_prior_max_len:
        row[:] = 1.0
    else:
        w = rules.weights
        before = max(1, pos - 1)
        row[:before] = eps2
        row[before] = w[0]
        row[pos] = w[1]
        for d, weight in enumerate(w[2:], start=1):
            if pos + d < text_len:
                row[pos + d] = weight
        if pos + len(w) - 1 < text_len:
            row[pos + len(w) - 1:] = eps2
    for t, n in counter.items():
        if t > left_offset and n >= rules.sink_count:
            row[: t - left_offset + 1] = eps2
    return row


class ChunkProgress:
    """The per-step alignment bookkeeping of one chunk: the attended position, the next prior row
    and the "near the end" count that cuts a chunk which is not the last (`forced_end`)."""

    def __init__(self, state: ChunkState, window: ChunkWindow, prior_window: int, eps: float):
        self.state, self.window = state, window
        self.prior_window, self.eps = prior_window, eps
        self.counter: Dict[int, int] = {}
        self.near_end_steps: Optional[int] = None  # steps since the alignment first neared the end

    def step(self, scores: np.ndarray) -> Tuple[int, np.ndarray]:
        """One step's alignment scores (L,) -> (attended position, the next prior's conditional row)."""
        from .generate import _prior_row

        st, w, rules = self.state, self.window, self.state.rules
        L = len(w.ids)
        attended = attended_position(scores, st.last_attended, self.counter, L, self.prior_window, w.left_offset)
        st.last_attended = attended
        if w.first:
            # The first chunk keeps NeMo's single-chunk prior (its offset is 0).
            row = _prior_row(attended, self.counter, L, self.prior_window, self.eps)
            near = attended >= L - rules.first_near_end
        else:
            row = multi_chunk_prior_row(attended, self.counter, L, w.left_offset, self.eps, rules)
            near = attended - w.left_offset >= L - rules.near_end
        if near and self.near_end_steps is None:
            self.near_end_steps = 0
        if self.near_end_steps is not None:
            self.near_end_steps += 1
        return attended, row

    @property
    def forced_end(self) -> bool:
        """Whether a chunk that is not the last ends after this step (all its frames kept)."""
        return (not self.window.last and self.near_end_steps is not None
                and self.near_end_steps >= self.state.rules.forced_end_after)
