"""The Tokenizer API: vocabulary and special-token lookups, loading options."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from tokenizer import AddedToken, Tokenizer
from tokenizer.pretokenize import BYTE_TO_CHAR

from conftest import ASSET_TOKENIZER

ASSETS = str(ASSET_TOKENIZER)


@pytest.fixture
def tok(ours) -> Tokenizer:
    return ours


def test_sizes(tok):
    assert tok.vocab_size == len(tok) == 151669
    assert len(tok.get_vocab()) == 151669


def test_special_token_lookups(tok):
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.eos_token_ids == [151645]
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert tok.bos_token is None and tok.bos_token_id is None
    assert tok.unk_token is None and tok.unk_token_id is None
    assert tok.special_tokens_map == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    assert tok.token_to_id("<|im_start|>") == 151644
    assert tok.id_to_token(151667) == "<think>"
    assert tok.token_to_id("Ġthe") == 279 and tok.id_to_token(279) == "Ġthe"
    assert tok.token_to_id("not a token at all") is None
    assert tok.id_to_token(10**7) is None and tok.id_to_token(-1) is None


def test_added_and_special_tokens(tok):
    added = tok.added_tokens
    assert len(added) == 26 and all(isinstance(t, AddedToken) for t in added)
    assert added[0] == AddedToken(id=151643, content="<|endoftext|>", special=True)
    assert "<|im_start|>" in tok.special_tokens and "<think>" not in tok.special_tokens
    assert tok.special_token_ids == frozenset(t.id for t in added if t.special)
    assert len(tok.special_token_ids) == 14


def test_decode_roundtrip_and_skip(tok):
    text = "<|im_start|>user\nHello 世界 👋🏽<|im_end|>"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHello 世界 👋🏽"
    assert tok.decode([]) == ""


def test_from_pretrained_is_fast():
    # On the CLI's startup path; typically ~0.4 s here, the bound leaves room for slow CI.
    start = time.perf_counter()
    Tokenizer.from_pretrained(ASSETS)
    assert time.perf_counter() - start < 3.0


def test_generation_config_adds_eos_ids(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ASSETS, name), tmp_path / name)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}), encoding="utf-8")
    assert Tokenizer.from_pretrained(tmp_path).eos_token_ids == [151645, 151643]


def test_template_processing_post_processor(tmp_path):
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    data = {
        "added_tokens": [
            {"id": i, "content": c, "special": True, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
            for i, c in ((256, "<s>"), (257, "</s>"))
        ],
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [256], "tokens": ["<s>"]}, "</s>": {"id": "</s>", "ids": [257], "tokens": ["</s>"]}},
        },
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": []},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<s>"}}), encoding="utf-8")
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.encode("a") == [256, ord("a"), 257]
    assert tok.encode("a", add_special_tokens=False) == [ord("a")]
    assert tok.bos_token == "<s>" and tok.bos_token_id == 256
    hf = pytest.importorskip("tokenizers").Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.encode("ab c") == hf.encode("ab c").ids


def test_repr(tok):
    assert "vocab_size=151669" in repr(tok)


@pytest.mark.parametrize("use_regex", [True, False])
def test_lone_byte_level_pre_tokenizer(tmp_path, use_regex):
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    merges = [("Ġ", "b"), ("a", "Ġb")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    data = {
        "added_tokens": [],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    tok = Tokenizer.from_pretrained(tmp_path)
    hf = pytest.importorskip("tokenizers").Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    for text in ["a b", "a b's 12 x", "  a  b  "]:
        assert tok.encode(text) == hf.encode(text).ids
    assert (tok.encode("a b") == [vocab["aĠb"]]) is (not use_regex)
