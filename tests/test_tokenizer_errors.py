"""Every TokenizerError: raised for the right input, one line, naming what is wrong."""

from __future__ import annotations

import json

import pytest

from tokenizer import Tokenizer, TokenizerError
from tokenizer.pretokenize import BYTE_TO_CHAR

from conftest import ASSET_TOKENIZER

ASSETS = str(ASSET_TOKENIZER)


@pytest.fixture
def tok(ours) -> Tokenizer:
    return ours


def _raises(match, fn, *args):
    with pytest.raises(TokenizerError, match=match) as info:
        fn(*args)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def _write(folder, name, content):
    path = folder / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return folder


def _minimal(**model_overrides):
    vocab = {c: i for i, c in enumerate(BYTE_TO_CHAR)}
    vocab["ab"] = 256
    model = {"type": "BPE", "vocab": vocab, "merges": ["a b"]}
    model.update(model_overrides)
    return {"added_tokens": [], "model": model}


def test_missing_folder(tmp_path):
    missing = tmp_path / "nope"
    msg = _raises("tokenizer folder not found", Tokenizer.from_pretrained, missing)
    assert str(missing) in msg


def test_path_is_a_file(tmp_path):
    _write(tmp_path, "tokenizer.json", "{}")
    _raises("not a folder", Tokenizer.from_pretrained, tmp_path / "tokenizer.json")


def test_folder_without_tokenizer_files(tmp_path):
    _write(tmp_path, "config.json", {})
    _write(tmp_path, "vocab.json", {})  # vocab.json alone is not enough
    msg = _raises("no tokenizer files in", Tokenizer.from_pretrained, tmp_path)
    assert "tokenizer.json" in msg and "vocab.json" in msg and "merges.txt" in msg


def test_tokenizer_json_not_json(tmp_path):
    _write(tmp_path, "tokenizer.json", '{"model": {"vocab": {')
    _raises(r"malformed tokenizer.json: not valid JSON \(.* at line 1 column \d+\)", Tokenizer.from_pretrained, tmp_path)


@pytest.mark.parametrize(
    "data, match",
    [
        ([], "malformed tokenizer.json: top level is list"),
        ({"added_tokens": []}, "malformed tokenizer.json: no 'model' object"),
        ({"model": {"type": "WordPiece", "vocab": {"a": 0}}}, "unsupported model type 'WordPiece'"),
        (_minimal(vocab=[]), "malformed tokenizer.json: the vocab is missing"),
        (_minimal(vocab={"a": "zero"}), "vocab entry 'a' has id 'zero'"),
        (_minimal(merges="a b"), "model.merges is missing or not a list"),
        (_minimal(merges=["a b c"]), r"merge #0 is 'a b c', expected"),
        (_minimal(merges=[["a"]]), r"merge #0 is \['a'\]"),
        (_minimal(merges=[3]), "merge #0 is 3"),
        (_minimal(merges=["a b", "a zz"]), r"merge #1 \('a' 'zz'\) uses 'zz', which is not in the vocab"),
        (_minimal(merges=[["b", "a"]]), r"merge #0 \('b' 'a'\) uses 'ba', which is not in the vocab"),
        ({**_minimal(), "added_tokens": [{"id": 300}]}, "added token 0 has no 'content' string"),
        ({**_minimal(), "added_tokens": [{"content": "<x>", "id": -1}]}, "added token '<x>' has no valid 'id'"),
        ({**_minimal(), "added_tokens": {}}, "'added_tokens' is not a list"),
        ({**_minimal(), "normalizer": {"type": "Lowercase"}}, "unsupported normalizer type 'Lowercase'"),
        ({**_minimal(), "pre_tokenizer": {"type": "Whitespace"}}, "unsupported pre_tokenizer type 'Whitespace'"),
        ({**_minimal(), "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Isolated"}}, "no ByteLevel step"),
        (
            {
                **_minimal(),
                "pre_tokenizer": {
                    "type": "Sequence",
                    "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": False}],
                },
            },
            "split pattern does not compile",
        ),
        (
            {**_minimal(), "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "a"}}, {"type": "ByteLevel"}]}},
            "a Split step and a ByteLevel step with use_regex",
        ),
        ({**_minimal(), "decoder": {"type": "WordPiece"}}, "unsupported decoder type 'WordPiece'"),
        ({**_minimal(), "post_processor": {"type": "BertProcessing"}}, "unsupported post_processor type 'BertProcessing'"),
        (_minimal(continuing_subword_prefix="##"), "unsupported BPE option"),
    ],
)
def test_malformed_tokenizer_json(tmp_path, data, match):
    _write(tmp_path, "tokenizer.json", data)
    _raises(match, Tokenizer.from_pretrained, tmp_path)


def test_minimal_tokenizer_json_loads(tmp_path):
    _write(tmp_path, "tokenizer.json", _minimal())
    tok = Tokenizer.from_pretrained(tmp_path)
    assert tok.encode("ab a") == [256, tok.token_to_id("Ġ"), tok.token_to_id("a")]


def test_malformed_merges_txt(tmp_path):
    _write(tmp_path, "vocab.json", _minimal()["model"]["vocab"])
    _write(tmp_path, "merges.txt", "#version: 0.2\na b\nonly\n")
    _raises(r"malformed merges.txt: merge #1 is 'only'", Tokenizer.from_pretrained, tmp_path)


def test_malformed_tokenizer_config(tmp_path):
    _write(tmp_path, "tokenizer.json", _minimal())
    _write(tmp_path, "tokenizer_config.json", "[1, 2")
    _raises("malformed tokenizer_config.json: not valid JSON", Tokenizer.from_pretrained, tmp_path)
    _write(tmp_path, "tokenizer_config.json", {"chat_template": 5})
    _raises("chat_template is int", Tokenizer.from_pretrained, tmp_path)


@pytest.mark.parametrize("bad", [151669, 10**9, -1])
def test_decode_id_out_of_range(tok, bad):
    msg = _raises(f"token id {bad} is out of range for vocab size 151669", tok.decode, [1, 2, bad])
    assert str(bad) in msg


def test_decode_non_integer_id(tok):
    _raises("token id 'x' is out of range", tok.decode, [1, "x"])


def test_encode_non_string(tok):
    with pytest.raises(TypeError, match="encode\\(\\) takes a str"):
        tok.encode(b"bytes")
