"""NeMo's `IPATokenizer` (NeMo 3.0.0) over metalgen's IpaG2p, built from a Magpie config entry, and the
`.nemo` artifacts its dictionaries live in.

Read from nemo/collections/common/tokenizers/text_to_speech/tts_tokenizers.py (IPATokenizer) and
nemo/collections/tts/models/magpietts.py (`_register_tokenizer_artifacts`); restated, not copied.

Vocabulary: sorted(G2P symbols, plus "'" when `apostrophe`, plus the punctuation list when `punct`),
then a space (unless a G2P symbol already is one, where it keeps its sorted place), an optional
silence, `<pad>`, an optional `<blank>` and `<oov>`.

`encode(text)`: the locale's preprocessing (en-US: strip combining marks and map curly quotes, keeping
case; other locales: NFC and U+2019 as an apostrophe), the G2P, then every symbol in the vocabulary
is kept; spaces are NOT collapsed (the space is itself a vocabulary symbol, so NeMo's "skip a repeated
space" branch never decides anything), trailing spaces are dropped and `pad_with_space` adds one at
each end. NeMo drops a symbol outside the vocabulary with a warning; here that is a MetalgenError
naming it, as for the character tokenizers.

Artifacts: NeMo saves each tokenizer file into the `.nemo` tar as `<32 hex>_<file name>` and writes
`nemo:<that name>` into the config's `g2p.phoneme_dict` / `g2p.heteronyms`.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import MetalgenError
from .g2p import SUPPORTED_LOCALES, IpaG2p, merge_dictionaries, parse_dictionary, parse_heteronyms
from .text import (SymbolTokenizer, _version_tuple, any_locale_preprocess, append_specials, config_class,
                   english_preprocess_cased, finish_symbols, locale_punctuation, reject_unknown_arguments)

PathLike = Union[str, Path]


class NemoArtifacts:
    """Reads the files a config names: `nemo:<name>` from the `.nemo` tar, any other string as a
    local file, or else (NeMo's older layout) the tar member with that file name."""

    def __init__(self, nemo_path: Optional[PathLike] = None):
        self.nemo_path = None if nemo_path is None else Path(nemo_path)
        self._members: Optional[Dict[str, str]] = None

    def _names(self) -> Dict[str, str]:
        if self._members is None:
            self._members = {}
            if self.nemo_path is not None:
                try:
                    with tarfile.open(self.nemo_path, "r:*") as tar:
                        for m in tar.getmembers():
                            if m.isfile():
                                self._members.setdefault(m.name.rsplit("/", 1)[-1], m.name)
                except (tarfile.TarError, OSError) as e:
                    raise MetalgenError(f"cannot read {self.nemo_path} as a .nemo archive: {e}")
        return self._members

    def read_text(self, ref: str) -> str:
        """The UTF-8 text of the file `ref` names."""
        ref = str(ref)
        name = ref[len("nemo:"):] if ref.startswith("nemo:") else None
        if name is None and Path(ref).is_file():
            return Path(ref).read_text(encoding="utf-8")
        base = (name if name is not None else ref).rsplit("/", 1)[-1]
        member = self._names().get(base)
        if member is None:
            where = f"in {self.nemo_path}" if self.nemo_path is not None else "(no .nemo file was given to look in)"
            raise MetalgenError(f"the tokenizer file {ref} is not found {where}")
        with tarfile.open(self.nemo_path, "r:*") as tar:
            data = tar.extractfile(member).read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MetalgenError(f"the tokenizer file {ref} in {self.nemo_path} is not UTF-8 text: {e}")


# ------------------------------------------------------------------------------ the tokenizer


class IPATokenizer(SymbolTokenizer):
    """One of NeMo's IPATokenizer + IpaG2p pairs, rebuilt: `tokens`, `pad_id`, `encode(text)`."""

    def __init__(self, name: str, g2p: IpaG2p, locale: Optional[str], punct: bool, punct_list: Sequence[str],
                 apostrophe: bool, pad_with_space: bool, space: str = " ", silence: Optional[str] = None,
                 oov: str = "<oov>", add_blank_at: Any = None):
        self.name = name
        self.cls = "IPATokenizer"
        self.g2p = g2p
        self.locale = locale
        self.punct = punct
        self.punct_list = tuple(punct_list)
        self.pad_with_space = pad_with_space
        self.preprocess = english_preprocess_cased if locale == "en-US" else any_locale_preprocess
        symbols = set(g2p.symbols)
        if apostrophe:
            symbols.add("'")
        if punct:
            symbols.update(self.punct_list)
        tokens = sorted(symbols)
        if space not in g2p.symbols:
            tokens.append(space)
        self.space = space
        if silence is not None:
            tokens.append(silence)
        self.pad_id = len(tokens)
        append_specials(tokens, add_blank_at, oov)
        self.tokens = tokens
        self.ids = {t: i for i, t in enumerate(tokens)}  # a repeated symbol keeps its last id, as in NeMo

    def symbols(self, text: str) -> Tuple[List[str], List[str]]:
        """(the kept symbols, the ones outside the vocabulary, shown without the grapheme prefix)."""
        g2p_out, stray = self.g2p(self.preprocess(text))
        kept: List[str] = []
        bad: List[str] = list(dict.fromkeys(stray))
        prefix = self.g2p.grapheme_prefix
        for s in g2p_out:
            if s in self.ids or (self.punct and s in self.punct_list):
                kept.append(s)
            elif s != self.space:
                shown = s[len(prefix):] if prefix and s.startswith(prefix) and len(s) > len(prefix) else s
                if shown not in bad:
                    bad.append(shown)
        return finish_symbols(kept, self.space, self.pad_with_space), bad


# ------------------------------------------------------------------------------ from the config

_TOKENIZER_ARGS = {"_target_", "g2p", "locale", "punct", "non_default_punct_list", "locale_specific_punct",
                   "fixed_vocab", "space", "silence", "apostrophe", "oov", "sep", "add_blank_at", "pad_with_space"}
_G2P_ARGS = {"_target_", "phoneme_dict", "locale", "apply_to_oov_word", "ignore_ambiguous_words", "heteronyms",
             "use_chars", "phoneme_probability", "use_stresses", "grapheme_case", "grapheme_prefix", "mapping_file"}
# NeMo dates pt-BR's locale punctuation by the config's nemo_version (resolve_versioned_tokenizer_defaults).
_LOCALE_PUNCT_SINCE = (2, 8, 0)


def _file_list(value: Any, what: str, name: str) -> List[str]:
    if isinstance(value, str) and value.strip():
        return [value]
    raise MetalgenError(f"Magpie tokenizer '{name}': its g2p {what} is {value!r}, not a file path")


def build_ipa_tokenizer(name: str, tc: Mapping[str, Any], nemo_version: Any = None,
                        artifacts: Optional[NemoArtifacts] = None) -> IPATokenizer:
    """An IPATokenizer from its config entry, reading its dictionaries through `artifacts`."""
    gc = tc.get("g2p") or {}
    g2p_cls = config_class(gc)
    if g2p_cls != "IpaG2p":
        raise MetalgenError(f"Magpie tokenizer '{name}': an IPATokenizer over {g2p_cls or 'no G2P'} is not supported")
    reject_unknown_arguments(name, "IPATokenizer", tc, _TOKENIZER_ARGS, _G2P_ARGS)
    if tc.get("fixed_vocab"):
        raise MetalgenError(f"Magpie tokenizer '{name}': IPATokenizer with fixed_vocab is not supported")
    if gc.get("apply_to_oov_word") is not None:
        raise MetalgenError(f"Magpie tokenizer '{name}': a G2P apply_to_oov_word function is not supported")

    artifacts = artifacts or NemoArtifacts()
    sources = gc.get("phoneme_dict")
    dictionary = merge_dictionaries(
        [parse_dictionary(artifacts.read_text(ref), ref) for ref in _file_list(sources, "phoneme_dict", name)])
    heteronyms_ref = gc.get("heteronyms")
    heteronyms: Optional[List[str]] = None
    if isinstance(heteronyms_ref, str) and heteronyms_ref:
        heteronyms = parse_heteronyms(artifacts.read_text(heteronyms_ref))
    # A YAML list of heteronyms reaches NeMo's IpaG2p as an OmegaConf ListConfig, which its
    # `isinstance(..., list)` test rejects: NeMo then uses no heteronyms at all, and so does the port.
    probability = gc.get("phoneme_probability")
    g2p = IpaG2p(
        dictionary,
        locale=gc.get("locale", "en-US"),
        heteronyms=heteronyms,
        # NeMo turns graphemes on whenever a phoneme probability is set (words may then be spelled).
        use_chars=bool(gc.get("use_chars", False)) or probability is not None,
        use_stresses=bool(gc.get("use_stresses", True)),
        grapheme_case=gc.get("grapheme_case", "upper") or "upper",
        grapheme_prefix=gc.get("grapheme_prefix", "") or "",
        ignore_ambiguous_words=bool(gc.get("ignore_ambiguous_words", True)),
    )

    locale = tc.get("locale", "en-US")
    if locale is not None and locale not in SUPPORTED_LOCALES:
        raise MetalgenError(f"Magpie tokenizer '{name}': locale '{locale}' is unknown")
    punct = bool(tc.get("punct", True))
    punct_list: Sequence[str] = ()
    if punct:
        punct_list = tc.get("non_default_punct_list")
        if punct_list is None:
            specific = tc.get("locale_specific_punct")
            if specific is None:
                version = _version_tuple(nemo_version) if nemo_version is not None else None
                specific = not (locale == "pt-BR" and version is not None and version[:3] < _LOCALE_PUNCT_SINCE)
            if specific and locale == "ja-JP":
                raise MetalgenError(f"Magpie tokenizer '{name}': IPATokenizer punctuation for ja-JP is not supported")
            punct_list = locale_punctuation(locale) if specific else locale_punctuation(None)
        punct_list = [str(p) for p in punct_list]
    return IPATokenizer(
        name, g2p, locale, punct, punct_list,
        apostrophe=bool(tc.get("apostrophe", False)),
        pad_with_space=bool(tc.get("pad_with_space", False)),
        space=tc.get("space", " ") or " ",
        silence=tc.get("silence"),
        oov=tc.get("oov", "<oov>") or "<oov>",
        add_blank_at=tc.get("add_blank_at"),
    )
