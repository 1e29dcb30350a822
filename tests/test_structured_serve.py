"""response_format end to end: the openai client against a live server over the tiny random model (CPU),
one serving a request at a time and one batching; answers must parse and validate against their schema."""

from __future__ import annotations

import ipaddress
import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

import metalgen  # noqa: E402
from metalgen.serve.app import make_app  # noqa: E402
from metalgen.serve.engine import Engine  # noqa: E402
from live_server import live_server  # noqa: E402

NAME = "tiny"
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"], "properties": {
    "name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["red", "green", 7, None]}, "minItems": 1, "maxItems": 3},
    "ok": {"type": "boolean"}}}
NESTED = {"type": "array", "minItems": 2, "maxItems": 3, "items": {"anyOf": [
    {"type": "number"}, {"type": "object", "properties": {"x": {"type": "null"}, "y": {"const": "k"}},
                         "required": ["x"], "additionalProperties": False}]}}
SCALAR = {"type": "string", "minLength": 1, "maxLength": 4}


def check(value, schema) -> None:
    """Assert that `value` (parsed JSON) validates against `schema` (the subset the tests use)."""
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                return check(value, option)
            except AssertionError as e:
                errors.append(e)
        raise AssertionError(f"{value!r} matches no option: {errors}")
    if "enum" in schema or "const" in schema:
        assert value in (schema["enum"] if "enum" in schema else [schema["const"]]), value
        return
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    kind = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}[type(value)]
    assert kind in types or (kind == "integer" and "number" in types), (value, types)
    if kind == "object":
        assert set(schema.get("required", [])) <= set(value), value
        assert set(value) <= set(schema["properties"]), value
        for k, v in value.items():
            check(v, schema["properties"][k])
    elif kind == "array":
        assert schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 10 ** 9), value
        for v in value:
            check(v, schema["items"])
    elif kind == "string":
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", 10 ** 9), value


@pytest.fixture(scope="module")
def loaded():
    # one tokenizer for both servers: its token index (about 1 s to build) is built once
    return metalgen.load("dummy:tiny-qwen3", dtype="float32")


@pytest.fixture(scope="module", params=[1, 4], ids=["one-at-a-time", "batched"])
def client(request, loaded):
    model, tok = loaded
    engine = Engine(model, tok, NAME, decode="reference", max_batch=request.param)
    with live_server(make_app(engine, 64)) as port:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)


def fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


@pytest.mark.parametrize("schema", [PERSON, NESTED, SCALAR], ids=["person", "nested", "scalar"])
@pytest.mark.parametrize("seed", [0, 1])
def test_answers_parse_and_validate(client, schema, seed):
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=64, seed=seed, temperature=1.0,
                                       response_format=fmt(schema))
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content  # the value completed, EOS forced
    check(json.loads(choice.message.content), schema)


def test_json_object_streamed_with_n(client):
    # (a random model's free keys rarely end: seeds 0 and 1 close the object at once, others write on)
    chunks = list(client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=64, seed=0, n=2,
                                                 temperature=1.0, response_format={"type": "json_object"},
                                                 stream=True))
    texts, finishes = ["", ""], [None, None]
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.delta.content or ""
            finishes[ch.index] = ch.finish_reason or finishes[ch.index]
    assert finishes == ["stop", "stop"]
    assert all(isinstance(json.loads(t), dict) for t in texts)


def test_greedy_answer_is_a_person(client):
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=64, temperature=0,
                                       response_format=fmt(PERSON))
    check(json.loads(r.choices[0].message.content), PERSON)


@pytest.mark.parametrize("schema, words", [
    ({"type": "object", "properties": {"d": {"type": "string", "format": "duration"}}}, ["format", "duration"]),
    ({"type": "string", "pattern": "^(?=a)"}, ["pattern", "lookaround"]),
    ({"$ref": "https://example.com/a.json"}, ["remote", "$ref"]),
])
def test_unsupported_schema_is_a_400(client, schema, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=4, response_format=fmt(schema))
    assert e.value.body["param"] == "response_format" and all(w in e.value.body["message"] for w in words)


def _order_model():
    """A Pydantic model with what clients send: a nested model through $defs/$ref (recursive too), formats
    (date-time, uuid, ipv4), a constr pattern, conint / confloat bounds and a multipleOf."""
    import datetime
    import uuid
    from typing import List, Optional

    from pydantic import BaseModel, Field

    class Part(BaseModel):
        sku: str = Field(pattern=r"^[A-Z]{2}-\d{3}$")
        qty: int = Field(ge=1, le=12)
        sub: Optional["Part"] = None

    class Order(BaseModel):
        id: uuid.UUID
        when: datetime.datetime
        ip: str = Field(json_schema_extra={"format": "ipv4"})
        price: float = Field(gt=0, lt=100)
        pack: int = Field(multiple_of=6, ge=-30, le=30)
        parts: List[Part] = Field(min_length=1, max_length=2)

    return Order


def test_pydantic_model_answers_validate(client, request):
    """A Pydantic model's schema as the OpenAI SDK sends it; each answer must validate with the model itself
    (and with jsonschema and its format checker, where that is installed)."""
    if request.node.callspec.params["client"] != 1:
        pytest.skip("one server is enough: the batched one runs the same constraint (and costs ~3 s more)")
    model = _order_model()
    schema = model.model_json_schema()
    assert "$defs" in schema and "$ref" in json.dumps(schema)
    for seed in (0,):  # (a random model writes ~100 tokens of this at ~20 ms each on the CPU)
        r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=300, seed=seed, temperature=1.0,
                                           response_format=fmt(schema))
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        value = model.model_validate_json(choice.message.content)  # raises if it does not validate
        assert str(value.id) == json.loads(choice.message.content)["id"].lower()
        ip = json.loads(choice.message.content)["ip"]
        assert ipaddress.IPv4Address(ip) and str(ipaddress.IPv4Address(ip)) == ip
        try:
            import jsonschema
        except ImportError:
            continue
        jsonschema.validate(json.loads(choice.message.content), schema, format_checker=jsonschema.FormatChecker())
