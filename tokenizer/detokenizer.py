"""Incremental decoding for generation: text out as soon as it is whole UTF-8."""

from __future__ import annotations

import codecs
from typing import Callable, Iterable

from .pretokenize import CHAR_TO_BYTE


def token_bytes(token: str) -> bytes:
    """The bytes a token decodes to, as tokenizers' ByteLevel decoder computes them.

    Every character is mapped back through the byte-level alphabet; a token with any
    character outside it (only possible for an added token) contributes its own UTF-8.
    """
    try:
        return bytes([CHAR_TO_BYTE[c] for c in token])
    except KeyError:
        return token.encode("utf-8")


class StreamingDetokenizer:
    """Turns token ids, fed one at a time, into text pieces.

    ``add(id)`` returns the text that this token completes: bytes of a character split
    across byte-level tokens are held back until the character is whole, so no U+FFFD
    appears for a character that is merely unfinished. ``finalize()`` flushes what is
    held (as U+FFFD if the stream ended mid-character). All pieces joined equal
    ``Tokenizer.decode(ids)``. Each call costs O(length of the token), not of the text.
    Make one with ``Tokenizer.detokenizer()``.
    """

    def __init__(self, lookup: Callable[[int], bytes], skip_ids: frozenset[int] = frozenset()):
        self._lookup = lookup
        self._skip = skip_ids
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.token_count = 0

    def add(self, token_id: int) -> str:
        """Feed one id; return the newly completed text ('' if none yet)."""
        self.token_count += 1
        if token_id in self._skip:
            return ""
        return self._decoder.decode(self._lookup(token_id))

    def add_many(self, token_ids: Iterable[int]) -> str:
        """Feed several ids; return the text they complete."""
        return "".join(map(self.add, token_ids))

    def finalize(self) -> str:
        """End of stream: return any held-back bytes (as U+FFFD) and reset for reuse."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        self.token_count = 0
        return text

    def reset(self) -> None:
        """Drop held-back bytes and start a new stream."""
        self._decoder.reset()
        self.token_count = 0
