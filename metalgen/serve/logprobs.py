"""Token logprobs in OpenAI's shapes: a chat's `logprobs.content[]` entries (token, logprob, bytes,
top_logprobs) and a text completion's `tokens` / `token_logprobs` / `top_logprobs` / `text_offset` lists.

The engine hands each generated token's id, logprob and (id, logprob) alternatives (computed on the
device, metalgen.generate.top_logprobs); `TokenLogprobs` collects them for one choice and gives them back
in the request's shape, all at once or as the pieces of a stream."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:
    from tokenizer.detokenizer import token_bytes as _bpe_bytes
except ImportError:  # pragma: no cover - another tokenizer: decode each id on its own
    _bpe_bytes = None

_FLOOR = -9999.0  # JSON has no -inf: a token the model rules out gets this, as vLLM does


def _finite(x: float) -> float:
    return x if math.isfinite(x) else _FLOOR


class TokenStrings:
    """Each id's text and bytes (a byte-level token may hold part of a character: its text then has
    U+FFFD, its bytes are exact)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: Dict[int, Tuple[str, bytes]] = {}

    def __call__(self, token: int) -> Tuple[str, bytes]:
        hit = self.cache.get(token)
        if hit is None:
            piece = self.tokenizer.id_to_token(token) if hasattr(self.tokenizer, "id_to_token") else None
            if piece is None:  # a padding id past the tokenizer's vocabulary has no text
                data = b"" if hasattr(self.tokenizer, "id_to_token") else self.tokenizer.decode([token]).encode()
            else:
                data = _bpe_bytes(piece) if _bpe_bytes else piece.encode()
            hit = self.cache[token] = (data.decode("utf-8", "replace"), data)
        return hit


class TokenLogprobs:
    """One choice's logprobs: `add` each token, `take` what was added since the last take, in the shape of
    a chat ("chat") or a text completion ("text")."""

    def __init__(self, strings: TokenStrings, kind: str, top: int):
        self.strings, self.kind, self.top = strings, kind, top
        self.pending: List[Tuple[int, float, Sequence[Tuple[int, float]]]] = []
        self.offset = 0  # a text completion's: where the next token starts in the choice's text

    def add(self, token: int, logprob: float, top: Optional[Sequence[Tuple[int, float]]]) -> None:
        self.pending.append((token, logprob, top or ()))

    def take(self) -> Optional[Dict[str, Any]]:
        """The tokens added since the last take in OpenAI's shape, or None when there are none."""
        if not self.pending:
            return None
        pending, self.pending = self.pending, []
        if self.kind == "chat":
            return {"content": [self._entry(t, lp, top) for t, lp, top in pending]}
        out: Dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [] if self.top else None,
                               "text_offset": []}
        for token, lp, top in pending:
            text = self.strings(token)[0]
            out["tokens"].append(text)
            out["token_logprobs"].append(_finite(lp))
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if self.top:
                alternatives: Dict[str, float] = {}
                for t, v in top[:self.top]:
                    alternatives.setdefault(self.strings(t)[0], _finite(v))  # the likelier of two equal texts
                out["top_logprobs"].append(alternatives)
        return out

    def _entry(self, token: int, logprob: float, top) -> Dict[str, Any]:
        text, data = self.strings(token)
        alternatives = []
        for t, v in top[:self.top]:
            alt_text, alt_data = self.strings(t)
            alternatives.append({"token": alt_text, "logprob": _finite(v), "bytes": list(alt_data)})
        return {"token": text, "logprob": _finite(logprob), "bytes": list(data), "top_logprobs": alternatives}
