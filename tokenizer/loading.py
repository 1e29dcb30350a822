"""Reading a tokenizer folder: tokenizer.json, or vocab.json + merges.txt, plus configs.

Everything here checks shape and reports problems as one-line ``TokenizerError``s
that name the file; the pipeline objects are built by ``Tokenizer``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from .added_tokens import AddedToken
from .errors import TokenizerError
from .pretokenize import QWEN2_PATTERN, QWEN35_PATTERN

TOKENIZER_JSON = "tokenizer.json"
VOCAB_JSON = "vocab.json"
MERGES_TXT = "merges.txt"
CONFIG_JSON = "tokenizer_config.json"
GENERATION_CONFIG_JSON = "generation_config.json"
TEMPLATE_JINJA = "chat_template.jinja"


@dataclass
class TokenizerFiles:
    """The raw content of a tokenizer folder, checked for shape."""

    folder: str
    merges_source: str  # the file the merges came from, for error messages
    vocab: dict[str, int]
    merges: list  # "a b" strings or [a, b] pairs, checked when the BPE table is built
    added_tokens: list[AddedToken]
    normalizer: dict | None = None
    pre_tokenizer: dict | None = None
    decoder: dict | None = None
    post_processor: dict | None = None
    config: dict[str, Any] = field(default_factory=dict)
    generation_config: dict[str, Any] = field(default_factory=dict)
    chat_template: str | dict[str, str] | None = None


def _read_json(path: str, name: str) -> Any:
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except json.JSONDecodeError as exc:
        raise TokenizerError(f"malformed {name}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"malformed {name}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise TokenizerError(f"cannot read {path}: {exc.strerror}") from None


def _parse_added_token(entry: Any, where: str, index: Any, token_id: int | None = None) -> AddedToken:
    if not isinstance(entry, dict):
        raise TokenizerError(f"malformed {where}: added token {index} is {type(entry).__name__}, expected an object")
    content = entry.get("content")
    tid = entry.get("id", token_id)
    if not isinstance(content, str) or not content:
        raise TokenizerError(f"malformed {where}: added token {index} has no 'content' string")
    if not isinstance(tid, int) or isinstance(tid, bool) or tid < 0:
        raise TokenizerError(f"malformed {where}: added token {content!r} has no valid 'id' (got {tid!r})")
    special = bool(entry.get("special", False))
    return AddedToken(
        id=tid,
        content=content,
        special=special,
        single_word=bool(entry.get("single_word", False)),
        lstrip=bool(entry.get("lstrip", False)),
        rstrip=bool(entry.get("rstrip", False)),
        # tokenizers' default: special tokens are matched on raw text, others on normalized.
        normalized=bool(entry.get("normalized", not special)),
    )


def _check_vocab(vocab: Any, where: str) -> dict[str, int]:
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"malformed {where}: the vocab is missing or not a non-empty object")
    ids = vocab.values()
    # Set-of-types check first: it runs in C, and the vocab has 151k entries.
    if set(map(type, ids)) != {int} or min(ids) < 0:
        for token, tid in vocab.items():
            if type(tid) is not int or tid < 0:
                raise TokenizerError(f"malformed {where}: vocab entry {token!r} has id {tid!r}, expected a non-negative integer")
    return vocab


def _from_tokenizer_json(folder: str, path: str) -> TokenizerFiles:
    data = _read_json(path, TOKENIZER_JSON)
    if not isinstance(data, dict):
        raise TokenizerError(f"malformed {TOKENIZER_JSON}: top level is {type(data).__name__}, expected an object")
    model = data.get("model")
    if not isinstance(model, dict):
        raise TokenizerError(f"malformed {TOKENIZER_JSON}: no 'model' object")
    kind = model.get("type", "BPE" if "merges" in model else None)
    if kind != "BPE":
        raise TokenizerError(f"unsupported model type {kind!r} in {TOKENIZER_JSON} (only BPE)")
    for option in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            raise TokenizerError(f"unsupported BPE option in {TOKENIZER_JSON}: {option}={model[option]!r}")
    if model.get("dropout"):
        raise TokenizerError(f"unsupported BPE option in {TOKENIZER_JSON}: dropout={model['dropout']!r}")
    vocab = _check_vocab(model.get("vocab"), TOKENIZER_JSON)
    merges = model.get("merges")
    if not isinstance(merges, list):
        raise TokenizerError(f"malformed {TOKENIZER_JSON}: model.merges is missing or not a list")
    added = data.get("added_tokens")
    if added is None:
        added = []
    if not isinstance(added, list):
        raise TokenizerError(f"malformed {TOKENIZER_JSON}: 'added_tokens' is not a list")
    return TokenizerFiles(
        folder=folder,
        merges_source=TOKENIZER_JSON,
        vocab=vocab,
        merges=merges,
        added_tokens=[_parse_added_token(e, TOKENIZER_JSON, i) for i, e in enumerate(added)],
        normalizer=data.get("normalizer"),
        pre_tokenizer=data.get("pre_tokenizer"),
        decoder=data.get("decoder"),
        post_processor=data.get("post_processor"),
    )


# tokenizer_class names (tokenizer_config.json) whose transformers class splits with Qwen3.5's
# pattern; every other name keeps Qwen2's, which Qwen2 to Qwen3 ship.
_QWEN35_CLASSES = {"Qwen3_5Tokenizer"}


def fallback_pipeline(config: dict) -> tuple[dict, dict]:
    """The normalizer and pre_tokenizer entries (tokenizer.json form) a vocab.json + merges.txt
    folder gets, chosen by the ``tokenizer_class`` in its tokenizer_config.json.

    These are what transformers' Qwen2Tokenizer / Qwen3_5Tokenizer build for such a folder:
    NFC, then Split(pattern, Isolated) and ByteLevel without its own regex. The pattern is
    Qwen3.5's for ``Qwen3_5Tokenizer`` and Qwen2's otherwise.
    """
    name = config.get("tokenizer_class")
    # transformers reads "XTokenizerFast" as "XTokenizer", so the suffix does not matter here either.
    if isinstance(name, str) and name.removesuffix("Fast") in _QWEN35_CLASSES:
        pattern = QWEN35_PATTERN
    else:
        pattern = QWEN2_PATTERN
    normalizer = {"type": "NFC"}
    pre_tokenizer = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ],
    }
    return normalizer, pre_tokenizer


def _from_vocab_merges(folder: str, vocab_path: str, merges_path: str, config: dict) -> TokenizerFiles:
    vocab = _check_vocab(_read_json(vocab_path, VOCAB_JSON), VOCAB_JSON)
    try:
        with open(merges_path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"malformed {MERGES_TXT}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise TokenizerError(f"cannot read {merges_path}: {exc.strerror}") from None
    if lines and lines[0].startswith("#version"):
        lines = lines[1:]
    merges = [ln.rstrip("\r") for ln in lines if ln.strip()]
    # Without tokenizer.json the added tokens live in tokenizer_config.json.
    decoder_map = config.get("added_tokens_decoder") or {}
    added = []
    for key, entry in decoder_map.items():
        try:
            tid = int(key)
        except ValueError:
            raise TokenizerError(f"malformed {CONFIG_JSON}: added_tokens_decoder key {key!r} is not an integer id") from None
        added.append(_parse_added_token(entry, CONFIG_JSON, key, tid))
    normalizer, pre_tokenizer = fallback_pipeline(config)
    return TokenizerFiles(
        folder=folder,
        merges_source=MERGES_TXT,
        vocab=vocab,
        merges=merges,
        added_tokens=added,
        normalizer=normalizer,
        pre_tokenizer=pre_tokenizer,
    )


def load_folder(folder: str | os.PathLike) -> TokenizerFiles:
    """Read and shape-check every tokenizer file in ``folder``."""
    folder = os.fspath(folder)
    if not os.path.exists(folder):
        raise TokenizerError(f"tokenizer folder not found: {folder}")
    if not os.path.isdir(folder):
        raise TokenizerError(f"not a folder: {folder} (pass the model folder holding {TOKENIZER_JSON})")
    join = lambda name: os.path.join(folder, name)  # noqa: E731

    config: dict = {}
    if os.path.isfile(join(CONFIG_JSON)):
        config = _read_json(join(CONFIG_JSON), CONFIG_JSON)
        if not isinstance(config, dict):
            raise TokenizerError(f"malformed {CONFIG_JSON}: top level is {type(config).__name__}, expected an object")

    if os.path.isfile(join(TOKENIZER_JSON)):
        files = _from_tokenizer_json(folder, join(TOKENIZER_JSON))
    elif os.path.isfile(join(VOCAB_JSON)) and os.path.isfile(join(MERGES_TXT)):
        files = _from_vocab_merges(folder, join(VOCAB_JSON), join(MERGES_TXT), config)
    else:
        raise TokenizerError(
            f"no tokenizer files in {folder}: looked for {TOKENIZER_JSON}, or {VOCAB_JSON} with {MERGES_TXT}"
        )
    files.config = config

    if os.path.isfile(join(GENERATION_CONFIG_JSON)):
        gen = _read_json(join(GENERATION_CONFIG_JSON), GENERATION_CONFIG_JSON)
        files.generation_config = gen if isinstance(gen, dict) else {}

    # A chat_template.jinja file (newer transformers save it so) wins over the config entry.
    if os.path.isfile(join(TEMPLATE_JINJA)):
        with open(join(TEMPLATE_JINJA), encoding="utf-8") as f:
            files.chat_template = f.read()
    else:
        template = config.get("chat_template")
        if isinstance(template, list):
            # The named-templates form: [{"name": "default", "template": "..."}, ...]
            named = {}
            for entry in template:
                if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not isinstance(entry.get("template"), str):
                    raise TokenizerError(f"malformed {CONFIG_JSON}: chat_template list entries need 'name' and 'template' strings")
                named[entry["name"]] = entry["template"]
            files.chat_template = named
        elif isinstance(template, str):
            files.chat_template = template
        elif template is not None:
            raise TokenizerError(f"malformed {CONFIG_JSON}: chat_template is {type(template).__name__}, expected a string or a list")
    return files
