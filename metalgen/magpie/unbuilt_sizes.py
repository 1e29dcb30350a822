"""Vocabulary sizes of Magpie tokenizers that metalgen cannot encode with, so that the tokenizers after
them in the config keep their offsets (AggregatedTTSTokenizer shifts each tokenizer by the sizes of the
ones before it).

- Mandarin, `ChinesePhonemesTokenizer` over `ChineseG2p` (NeMo 3.0.0, tts_tokenizers.py and
  zh_cn_pinyin.py): its vocabulary is fixed by the pinyin dictionary alone; only encoding needs jieba
  and pypinyin. Tokens: space, optional silence, the dictionary's phonemes (sorted, prefixed, in the
  phoneme case), the 5 tone marks, the 26 ASCII letters, the apostrophe, the punctuation list, then
  `<pad>`, optional `<blank>`, `<oov>`.
- `AutoTokenizer` for `google/byt5-*`: NeMo counts `len(get_vocab())`, which for ByT5Tokenizer is
  3 specials + 256 bytes + 125 extra ids = 384.
"""

from __future__ import annotations

import string
from typing import Any, Callable, List, Mapping, Optional

from .g2p import set_case

# ChinesePhonemesTokenizer.ZH_PUNCT_LIST: full-width marks, then NeMo's default (LJSpeech) list.
_ZH_PUNCT = tuple("，。？！；：、‘’“”（）【】「」《》") + (
    ",", ".", "!", "?", "-", ":", ";", "/", '"', "(", ")", "[", "]", "{", "}")
BYT5_VOCAB = 384


def mandarin_tokens(tc: Mapping[str, Any], read_text: Callable[[str], str]) -> List[str]:
    """The token list of a ChinesePhonemesTokenizer config entry, its pinyin dictionary read through
    `read_text` (a `nemo:` reference -> the file's text)."""
    gc = tc.get("g2p") or {}
    ref = gc.get("phoneme_dict")
    if not isinstance(ref, str) or not ref:
        raise ValueError("its g2p has no phoneme_dict file")
    prefix = gc.get("phoneme_prefix", "#") or ""
    case = gc.get("phoneme_case", "upper")
    tone_prefix = gc.get("tone_prefix", "#") or ""
    letter_prefix = gc.get("ascii_letter_prefix", "") or ""
    letter_case = gc.get("ascii_letter_case", "lower")
    # Later lines for the same syllable replace earlier ones, so only the final entries count.
    entries = {}
    for line in read_text(ref).splitlines(keepends=True):
        if line.startswith(";;;") or not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            raise ValueError(f"the pinyin dictionary line {line.strip()!r} has no tab-separated pronunciation")
        entries[parts[0].lower()] = [prefix + p for p in set_case(parts[1], case).split()]
    phonemes = sorted({p for pron in entries.values() for p in pron})
    # get_grapheme_character_set("en-US", case): "mixed" is the upper-case letters, then the lower-case ones.
    upper = string.ascii_uppercase
    alphabet = {"upper": upper, "lower": upper.lower(), "mixed": upper + upper.lower()}.get(letter_case)
    if alphabet is None:
        raise ValueError(f"ascii_letter_case '{letter_case}' is unknown")
    letters = sorted({letter_prefix + c for c in alphabet})
    tokens = [tc.get("space", " ") or " "]
    if tc.get("silence") is not None:
        tokens.append(tc["silence"])
    tokens += phonemes + sorted(tone_prefix + str(t) for t in range(1, 6)) + letters
    if tc.get("apostrophe", True):
        tokens.append("'")
    if tc.get("punct", True):
        punct = tc.get("non_default_punct_list")
        tokens += list(_ZH_PUNCT if punct is None else punct)
    tokens.append("<pad>")
    if tc.get("add_blank_at") is not None:
        tokens.append("<blank>")
    tokens.append("<oov>")
    return tokens


def unbuilt_size(tc: Mapping[str, Any], read_text: Callable[[str], str]) -> Optional[int]:
    """The vocabulary size of a tokenizer metalgen cannot build, when it is knowable, else None."""
    cls = str(tc.get("_target_", "")).rsplit(".", 1)[-1]
    if cls == "AutoTokenizer" and "byt5" in str(tc.get("pretrained_model", "")).lower():
        return BYT5_VOCAB
    if cls == "ChinesePhonemesTokenizer":
        try:
            return len(mandarin_tokens(tc, read_text))
        except Exception:  # noqa: BLE001 - an unreadable dictionary only leaves the size unknown
            return None
    return None
