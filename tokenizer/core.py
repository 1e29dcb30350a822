"""The ``Tokenizer``: the pieces of the pipeline put together behind one API."""

from __future__ import annotations

import os
from itertools import chain
from typing import Any, Iterable, Mapping, Sequence

from .added_tokens import AddedToken, AddedVocabulary
from .bpe import BytePairEncoder
from .chat_template import render_chat, select_template
from .detokenizer import StreamingDetokenizer, token_bytes
from .errors import TokenizerError
from .loading import TokenizerFiles, load_folder
from .pretokenize import Splitter, make_normalizer, split_pattern

# The named special tokens of transformers, passed to chat templates by these names.
_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _token_text(value: Any) -> str | None:
    # tokenizer_config.json writes a special token either as a string or as an AddedToken dict.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


class _TokenBytes(dict):
    """id -> decoded bytes, filled on first use (most of the vocab is never decoded)."""

    __slots__ = ("_tok",)

    def __init__(self, tokenizer: "Tokenizer"):
        super().__init__()
        self._tok = tokenizer

    def __missing__(self, token_id: int) -> bytes:
        text = self._tok.id_to_token(token_id)
        if text is None:
            raise TokenizerError(self._tok._out_of_range(token_id))
        data = self[token_id] = token_bytes(text)
        return data


class Tokenizer:
    """Byte-level BPE tokenizer of the Qwen2 / Qwen2.5 / Qwen3 / Qwen3.5 family.

    Produces the same ids as Hugging Face ``tokenizers`` for the same files. Build it
    with :meth:`from_pretrained`.
    """

    def __init__(self, files: TokenizerFiles):
        self.folder = files.folder
        self._config = files.config
        normalizer = make_normalizer(files.normalizer)
        self._splitter = Splitter(split_pattern(files.pre_tokenizer))
        self._check_decoder(files.decoder)
        self._model = BytePairEncoder(files.vocab, files.merges, files.merges_source)
        self._vocab = files.vocab
        self._added = AddedVocabulary(files.added_tokens, normalizer)
        self._id_to_model_token: list[str | None] | None = None
        self._bos_ids, self._eos_ids = self._post_processor_ids(files.post_processor)
        self._token_bytes = _TokenBytes(self)
        self._chat_templates = files.chat_template
        max_id = max(max(self._vocab.values()), max((t.id for t in files.added_tokens), default=0))
        self._vocab_size = max_id + 1
        self._generation_eos = files.generation_config.get("eos_token_id")
        self._extra_eos: list[int] = []

    # ----------------------------------------------------------------- loading

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> "Tokenizer":
        """Load from a model folder: ``tokenizer.json`` (or ``vocab.json`` + ``merges.txt``),
        ``tokenizer_config.json`` for special tokens and the chat template, a
        ``chat_template.jinja`` if present, and ``generation_config.json`` for extra eos ids.

        Raises ``TokenizerError`` for a missing folder, a folder without tokenizer files,
        or malformed / unsupported files.
        """
        return cls(load_folder(folder))

    @staticmethod
    def _check_decoder(decoder: dict | None) -> None:
        if decoder is None:
            return
        steps = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else [decoder]
        for step in steps:
            if step.get("type") != "ByteLevel":
                raise TokenizerError(f"unsupported decoder type {step.get('type')!r} in tokenizer.json (only ByteLevel)")

    def _post_processor_ids(self, config: dict | None) -> tuple[list[int], list[int]]:
        # Ids add_special_tokens puts before / after the text. ByteLevel (Qwen) adds none;
        # a TemplateProcessing's "single" template may wrap the sequence in special tokens.
        if config is None:
            return [], []
        steps = config.get("processors", []) if config.get("type") == "Sequence" else [config]
        before: list[int] = []
        after: list[int] = []
        for step in steps:
            kind = step.get("type")
            if kind == "ByteLevel":
                continue
            if kind != "TemplateProcessing":
                raise TokenizerError(f"unsupported post_processor type {kind!r} in tokenizer.json")
            specials = step.get("special_tokens", {})
            seen_sequence = False
            for item in step.get("single", []):
                if "Sequence" in item:
                    seen_sequence = True
                elif "SpecialToken" in item:
                    name = item["SpecialToken"].get("id")
                    ids = specials.get(name, {}).get("ids")
                    if not isinstance(ids, list):
                        raise TokenizerError(f"malformed tokenizer.json: post_processor special token {name!r} has no ids")
                    (after if seen_sequence else before).extend(ids)
        return before, after

    # ---------------------------------------------------------------- encoding

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``.

        Added and special tokens written in the text (``<|im_start|>``, ``<think>``, ...)
        become their single ids. ``add_special_tokens`` applies the post-processor's
        wrapping tokens (none for Qwen). ``split_special_tokens=True`` encodes special
        tokens in the text as plain characters instead, for untrusted input.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        lookup = self._model.cache.__getitem__
        split = self._splitter.split
        ids: list[int] = []
        for piece in self._added.split(text, split_special_tokens):
            if type(piece) is int:
                ids.append(piece)
            elif piece:
                ids.extend(chain.from_iterable(map(lookup, split(piece))))
        if add_special_tokens and (self._bos_ids or self._eos_ids):
            ids = [*self._bos_ids, *ids, *self._eos_ids]
        return ids

    def encode_batch(self, texts: Iterable[str], add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` over several texts."""
        return [self.encode(t, add_special_tokens) for t in texts]

    # ---------------------------------------------------------------- decoding

    def _out_of_range(self, token_id: Any) -> str:
        return f"token id {token_id!r} is out of range for vocab size {self._vocab_size}"

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; bytes that do not form valid UTF-8 become U+FFFD, as in tokenizers.

        Raises ``TokenizerError`` for an id that is not in the vocabulary.
        """
        if skip_special_tokens:
            special = self._added.special_ids
            ids = [i for i in ids if i not in special]
        try:
            data = b"".join(map(self._token_bytes.__getitem__, ids))
        except TypeError:
            bad = next(i for i in ids if not isinstance(i, int))
            raise TokenizerError(self._out_of_range(bad)) from None
        return data.decode("utf-8", "replace")

    def detokenizer(self, skip_special_tokens: bool = False) -> StreamingDetokenizer:
        """A new :class:`StreamingDetokenizer` for one generated sequence."""
        skip = self._added.special_ids if skip_special_tokens else frozenset()
        return StreamingDetokenizer(self._token_bytes.__getitem__, skip)

    # ------------------------------------------------------------- vocabulary

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (highest id + 1)."""
        return self._vocab_size

    def __len__(self) -> int:
        return self._vocab_size

    def get_vocab(self) -> dict[str, int]:
        """token -> id for the BPE vocab and the added tokens (a copy)."""
        vocab = dict(self._vocab)
        vocab.update((t.content, t.id) for t in self._added.tokens)
        return vocab

    def token_to_id(self, token: str) -> int | None:
        """Id of a token string (added tokens first, then the BPE vocab), or None."""
        added = self._added.by_content.get(token)
        if added is not None:
            return added.id
        return self._vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        """Token string of an id (byte-level form for BPE tokens, e.g. 'Ġthe'), or None."""
        added = self._added.by_id.get(token_id)
        if added is not None:
            return added.content
        table = self._id_to_model_token
        if table is None:
            table = [None] * self._vocab_size
            for tok, i in self._vocab.items():
                table[i] = tok
            self._id_to_model_token = table
        if isinstance(token_id, int) and 0 <= token_id < len(table):
            return table[token_id]
        return None

    @property
    def added_tokens(self) -> list[AddedToken]:
        """All added tokens, special or not, by id."""
        return list(self._added.tokens)

    @property
    def special_tokens(self) -> list[str]:
        """Contents of the added tokens flagged special (what ``skip_special_tokens`` drops)."""
        return [t.content for t in self._added.tokens if t.special]

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of the special added tokens."""
        return self._added.special_ids

    def _named(self, name: str) -> str | None:
        return _token_text(self._config.get(name))

    @property
    def bos_token(self) -> str | None:
        return self._named("bos_token")

    @property
    def bos_token_id(self) -> int | None:
        tok = self.bos_token
        return None if tok is None else self.token_to_id(tok)

    @property
    def eos_token(self) -> str | None:
        return self._named("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        tok = self.eos_token
        return None if tok is None else self.token_to_id(tok)

    @property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends generation: the config's eos token, then generation_config's."""
        ids: list[int] = []
        if self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        extra = self._generation_eos
        for i in extra if isinstance(extra, list) else [extra]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
        ids.extend(i for i in self._extra_eos if i not in ids)
        return ids

    def add_eos_token_ids(self, ids: Iterable[int]) -> None:
        """Also end generation on these ids (e.g. the model config's `eos_token_id`)."""
        for i in ids:
            if int(i) not in self._extra_eos:
                self._extra_eos.append(int(i))

    @property
    def pad_token(self) -> str | None:
        return self._named("pad_token")

    @property
    def pad_token_id(self) -> int | None:
        tok = self.pad_token
        return None if tok is None else self.token_to_id(tok)

    @property
    def unk_token(self) -> str | None:
        return self._named("unk_token")

    @property
    def unk_token_id(self) -> int | None:
        tok = self.unk_token
        return None if tok is None else self.token_to_id(tok)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set (bos_token, eos_token, pad_token, ...)."""
        out = {}
        for name in _NAMED_SPECIAL:
            tok = self._named(name)
            if tok is not None:
                out[name] = tok
        return out

    # ---------------------------------------------------------- chat template

    @property
    def chat_template(self) -> str | dict[str, str] | None:
        """The folder's chat template (a string, or named templates), or None for ChatML."""
        return self._chat_templates

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[Mapping[str, Any]] | None = None,
        tokenize: bool = False,
        chat_template: str | None = None,
        documents: list[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render a conversation into the model's prompt text (or ids, with ``tokenize=True``).

        Uses the folder's template (ChatML if it has none), or ``chat_template``: the name
        of one of the folder's named templates, or a template string. Extra keyword
        arguments become template variables, e.g. ``enable_thinking=False`` for Qwen3.
        The output equals transformers' ``apply_chat_template(..., tokenize=False)``.
        """
        source = select_template(self._chat_templates, chat_template, bool(tools))
        variables = {**self.special_tokens_map, **kwargs}
        text = render_chat(
            source,
            list(messages),
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            variables=variables,
        )
        if tokenize:
            return self.encode(text, add_special_tokens=False)
        return text

    def __repr__(self) -> str:
        return f"Tokenizer(folder={self.folder!r}, vocab_size={self._vocab_size}, added_tokens={len(self._added.tokens)})"
