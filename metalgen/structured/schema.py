"""A JSON-schema subset compiled to grammar nodes, which the byte automaton (automaton.py) runs.

Supported: `type` (object, array, string, integer, number, boolean, null, or a list of them), object
`properties` / `required` / `additionalProperties`, array `items` / `minItems` / `maxItems`, string
`minLength` / `maxLength`, `enum`, `const`, `anyOf`, nesting; annotations (`title`, `description`,
`default`, `examples`, `$schema`, `$id`, `$comment`) are ignored. Anything else (`pattern`, `format`,
`$ref`, `minimum`, `oneOf`, ...) is refused with a SchemaError rather than silently ignored: a client
must never get output that only looks as if it honoured its schema.

An object with `properties` allows only those keys (as if `additionalProperties` were false: the
output then validates whatever the schema says of other keys, and no free key text has to be kept in
the automaton's state); one without `properties` allows any keys, their values matching
`additionalProperties` (any JSON value when absent or true, none when false: only `{}`).
"""

from __future__ import annotations

import json
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from ..errors import MetalgenError

_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "strict",
                "deprecated", "readOnly", "writeOnly"}
_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength"},
    "integer": set(), "number": set(), "boolean": set(), "null": set(),
}
_COMMON = {"type", "enum", "const", "anyOf"}


class SchemaError(MetalgenError):
    """A schema outside the supported subset, or not a valid schema; one line, with the path of the fault."""


class Node:
    """A grammar node; identity-hashed, so that automaton states holding nodes are hashable and cheap."""

    __slots__ = ("first",)  # the bytes a value of this node may start with

    def __init__(self):
        self.first: FrozenSet[int] = frozenset()


class Obj(Node):
    """An object: `props` quoted key bytes -> node (only these keys; empty: any key), `required` keys,
    `extra` the value node of free keys (None: no free keys)."""

    __slots__ = ("props", "required", "extra", "keys")

    def __init__(self, props: Dict[bytes, Node], required: FrozenSet[bytes], extra: Optional[Node]):
        super().__init__()
        self.props, self.required, self.extra = props, required, extra
        self.keys = tuple(props)
        self.first = frozenset(b"{")


class Arr(Node):
    """An array of `item`s, `lo` to `hi` (None: unbounded) of them."""

    __slots__ = ("item", "lo", "hi")

    def __init__(self, item: Node, lo: int, hi: Optional[int]):
        super().__init__()
        self.item, self.lo, self.hi = item, lo, hi
        self.first = frozenset(b"[")


class Str(Node):
    """A string of `lo` to `hi` (None: unbounded) characters (code points, as JSON schema counts them)."""

    __slots__ = ("lo", "hi")

    def __init__(self, lo: int = 0, hi: Optional[int] = None):
        super().__init__()
        self.lo, self.hi = lo, hi
        self.first = frozenset(b'"')


class Num(Node):
    """A number; `integer`: digits only (no fraction or exponent)."""

    __slots__ = ("integer",)

    def __init__(self, integer: bool):
        super().__init__()
        self.integer = integer
        self.first = frozenset(b"-0123456789")


class Lit(Node):
    """One of fixed JSON texts (enum, const, true, false, null), as compact serialized bytes."""

    __slots__ = ("values",)

    def __init__(self, values: Tuple[bytes, ...]):
        super().__init__()
        self.values = values
        self.first = frozenset(v[0] for v in values)


class Union(Node):
    """Any of `options` (anyOf, a list of types, any JSON value)."""

    __slots__ = ("options",)

    def __init__(self, options: Tuple[Node, ...]):
        super().__init__()
        self.options = options
        self.first = frozenset().union(*(o.first for o in options))


def literal(value: Any) -> bytes:
    """A JSON value's text as the automaton expects it (compact, UTF-8 rather than \\u escapes)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def any_value() -> Node:
    """Any JSON value (nested objects and arrays included): a recursive union."""
    value = Union(())  # its options refer back to it: filled in below
    obj = Obj({}, frozenset(), value)
    arr = Arr(value, 0, None)
    options = [obj, arr, Str(), Num(False), Lit((b"true", b"false", b"null"))]
    value.options = tuple(options)
    value.first = frozenset().union(*(o.first for o in options))
    return value


def json_object() -> Node:
    """`{"type": "json_object"}`: any JSON object."""
    return Obj({}, frozenset(), any_value())


def _int(schema: dict, key: str, path: str) -> Optional[int]:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"'{key}' must be a non-negative integer at {path}")
    return value


def compile_schema(schema: Any, path: str = "$") -> Node:
    """The grammar node of a JSON schema (the supported subset); SchemaError otherwise."""
    if schema is True or schema == {}:
        return any_value()
    if not isinstance(schema, dict):
        raise SchemaError(f"a schema must be an object at {path}")
    types = schema.get("type")
    if isinstance(types, str):
        types = [types]
    if types is not None and (not isinstance(types, list) or not types
                              or any(t not in _KEYWORDS for t in types)):
        raise SchemaError(f"unsupported 'type' {schema.get('type')!r} at {path}")
    if types is None and ("properties" in schema or "additionalProperties" in schema):
        types = ["object"]  # an object's keywords without its type
    allowed = set(_COMMON) | _ANNOTATIONS
    for t in types or []:
        allowed |= _KEYWORDS[t]
    for key in schema:
        if key not in allowed:
            raise SchemaError(f"unsupported schema keyword '{key}' at {path}")
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"'enum' must be a non-empty list at {path}")
        try:
            return Lit(tuple(dict.fromkeys(literal(v) for v in values)))
        except ValueError:
            raise SchemaError(f"'enum' values must be finite JSON values at {path}") from None
    if "anyOf" in schema:
        options = schema["anyOf"]
        if not isinstance(options, list) or not options:
            raise SchemaError(f"'anyOf' must be a non-empty list at {path}")
        if types is not None:
            raise SchemaError(f"'anyOf' next to 'type' is not supported at {path}")
        return _union([compile_schema(s, f"{path}.anyOf[{i}]") for i, s in enumerate(options)])
    if types is None:
        return any_value()  # annotations alone constrain nothing
    return _union([_typed(t, schema, path) for t in types])


def _union(nodes: List[Node]) -> Node:
    return nodes[0] if len(nodes) == 1 else Union(tuple(nodes))


def _typed(kind: str, schema: dict, path: str) -> Node:
    if kind == "string":
        lo, hi = _int(schema, "minLength", path) or 0, _int(schema, "maxLength", path)
        if hi is not None and hi < lo:
            raise SchemaError(f"'maxLength' is below 'minLength' at {path}")
        return Str(lo, hi)
    if kind in ("integer", "number"):
        return Num(kind == "integer")
    if kind == "boolean":
        return Lit((b"true", b"false"))
    if kind == "null":
        return Lit((b"null",))
    if kind == "array":
        items = schema.get("items", True)
        lo, hi = _int(schema, "minItems", path) or 0, _int(schema, "maxItems", path)
        if hi is not None and hi < lo:
            raise SchemaError(f"'maxItems' is below 'minItems' at {path}")
        return Arr(compile_schema(items, f"{path}.items"), lo, hi)
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaError(f"'properties' must be an object at {path}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaError(f"'required' must be a list of strings at {path}")
    missing = [r for r in required if r not in props] if props else required
    if missing:
        raise SchemaError(f"required property '{missing[0]}' is not among the properties at {path}")
    extra = schema.get("additionalProperties", True)
    if not isinstance(extra, (bool, dict)):
        raise SchemaError(f"'additionalProperties' must be a boolean or a schema at {path}")
    compiled = {literal(k): compile_schema(v, f"{path}.properties.{k}") for k, v in props.items()}
    if compiled:
        # declared keys only (module docstring): additionalProperties changes nothing then
        return Obj(compiled, frozenset(literal(r) for r in required), None)
    return Obj({}, frozenset(), None if extra is False else compile_schema(extra, f"{path}.additionalProperties"))
