"""Vocabulary sizes of Magpie tokenizers that metalgen cannot encode with, so that the tokenizers after
them in the config keep their offsets (AggregatedTTSTokenizer shifts each tokenizer by the sizes of the
ones before it).

- `AutoTokenizer` for `google/byt5-*`: NeMo counts `len(get_vocab())`, which for ByT5Tokenizer is
  3 specials + 256 bytes + 125 extra ids = 384.
- Mandarin is built by metalgen/magpie/zh_g2p.py (its vocabulary needs only the pinyin dictionary), so
  it is not counted here; `mandarin_tokens` is re-exported from there.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from .text import config_class
from .zh_g2p import mandarin_tokens  # noqa: F401

BYT5_VOCAB = 384


def unbuilt_size(tc: Mapping[str, Any], read_text: Callable[[str], str]) -> Optional[int]:
    """The vocabulary size of a tokenizer metalgen cannot build, when it is knowable, else None."""
    cls = config_class(tc)
    if cls == "AutoTokenizer" and "byt5" in str(tc.get("pretrained_model", "")).lower():
        return BYT5_VOCAB
    return None
