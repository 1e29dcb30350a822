"""A JSON-schema subset compiled to grammar nodes, which the byte automaton (automaton.py) runs.

Supported: `type` (object, array, string, integer, number, boolean, null, or a list of them), object
`properties` / `required` / `additionalProperties`, array `items` / `minItems` / `maxItems`, string
`minLength` / `maxLength` / `pattern` / `format` (regex.py), integer and number `minimum` / `maximum` /
`exclusiveMinimum` / `exclusiveMaximum`, integer `multipleOf` (numbers.py), `enum`, `const`, `anyOf`,
local `$ref`s (`#/$defs/X`, `#/definitions/X`, any `#/...` JSON pointer, recursion included), nesting;
annotations (`title`, `description`, `default`, `examples`, `$schema`, `$id`, `$comment`) are ignored.
Anything else (`oneOf`, `allOf`, `not`, `if`, `uniqueItems`, `patternProperties`, a remote `$ref`, an
unknown `format`, a lookahead in a `pattern`, ...) is refused with a SchemaError rather than silently
ignored: a client must never get output that only looks as if it honoured its schema.

An object with `properties` allows only those keys (as if `additionalProperties` were false: the
output then validates whatever the schema says of other keys, and no free key text has to be kept in
the automaton's state); one without `properties` allows any keys, their values matching
`additionalProperties` (any JSON value when absent or true, none when false: only `{}`). `enum` /
`const` next to a `type` keep only the values that the rest of the schema accepts.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from ..errors import MetalgenError
from .numbers import Bounds, exact
from .regex import FORMATS, Dfa, PatternError, cached, format_dfa, intersect

_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "strict",
                "deprecated", "readOnly", "writeOnly"}
_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": _BOUNDS, "number": _BOUNDS, "boolean": set(), "null": set(),
}
_COMMON = {"type", "enum", "const", "anyOf", "$ref", "$defs", "definitions"}


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
    """A string of `lo` to `hi` (None: unbounded) characters (code points, as JSON schema counts them);
    `dfa` (regex.py): the one its decoded bytes must match (pattern, format), None: any."""

    __slots__ = ("lo", "hi", "dfa")

    def __init__(self, lo: int = 0, hi: Optional[int] = None, dfa: Optional[Dfa] = None):
        super().__init__()
        self.lo, self.hi, self.dfa = lo, hi, dfa
        self.first = frozenset(b'"')


class Num(Node):
    """A number; `integer`: digits only (no fraction or exponent); `bounds` (numbers.py): its range, None:
    any."""

    __slots__ = ("integer", "bounds")

    def __init__(self, integer: bool, bounds: Optional[Bounds] = None):
        super().__init__()
        self.integer, self.bounds = integer, bounds
        self.first = frozenset(b"-0123456789") if bounds is None else bounds.first


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
    compiler = _Compiler(schema)
    root = compiler.node(schema, path)
    compiler.finish(root)
    return root


class _Compiler:
    """One schema's compilation: `$ref` targets compiled once each (a recursive one through a placeholder
    union, filled in once its target is compiled), then the unions' first bytes settled and the `enum`s
    filtered (finish)."""

    def __init__(self, root: Any):
        self.root = root
        self.refs: Dict[str, Node] = {}  # "#/..." -> its node (its placeholder while it compiles)
        self.compiling: Dict[str, Union] = {}
        self.enums: List[Tuple[Lit, Node, str]] = []  # (enum node, the typed rest of its schema, path)

    def node(self, schema: Any, path: str) -> Node:
        if schema is True or schema == {}:
            return any_value()
        if not isinstance(schema, dict):
            raise SchemaError(f"a schema must be an object at {path}")
        if "$ref" in schema:
            others = [k for k in schema if k not in _ANNOTATIONS and k not in ("$ref", "$defs", "definitions")]
            if others:
                raise SchemaError(f"'$ref' next to '{others[0]}' is not supported at {path}")
            return self.ref(schema["$ref"], path)
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
                lit = Lit(tuple(dict.fromkeys(literal(v) for v in values)))
            except ValueError:
                raise SchemaError(f"'enum' values must be finite JSON values at {path}") from None
            if types is not None:  # the values must also be of the type (and its bounds, pattern, ...)
                self.enums.append((lit, _union([self.typed(t, schema, path) for t in types]), path))
            return lit
        if "anyOf" in schema:
            options = schema["anyOf"]
            if not isinstance(options, list) or not options:
                raise SchemaError(f"'anyOf' must be a non-empty list at {path}")
            if types is not None:
                raise SchemaError(f"'anyOf' next to 'type' is not supported at {path}")
            return _union([self.node(s, f"{path}.anyOf[{i}]") for i, s in enumerate(options)])
        if types is None:
            return any_value()  # annotations alone constrain nothing
        return _union([self.typed(t, schema, path) for t in types])

    def ref(self, ref: Any, path: str) -> Node:
        """The node of a local `$ref` (compiled once; a recursive one through a placeholder)."""
        if not isinstance(ref, str):
            raise SchemaError(f"'$ref' must be a string at {path}")
        if not ref.startswith("#"):
            raise SchemaError(f"remote '$ref' {ref!r} is not supported (only local ones, such as '#/$defs/Name') "
                              f"at {path}")
        if ref != "#" and not ref.startswith("#/"):
            raise SchemaError(f"'$ref' {ref!r}: anchors are not supported, only JSON pointers ('#/$defs/Name') "
                              f"at {path}")
        got = self.refs.get(ref)
        if got is not None:
            return got
        holder = self.compiling.get(ref)
        if holder is not None:  # a recursive reference: the placeholder, filled in below
            holder.options = (holder,)  # (marks it used; replaced once its target is compiled)
            return holder
        target: Any = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise SchemaError(f"'$ref' {ref!r} points to nothing at {path}")
        holder = self.compiling[ref] = Union(())
        node = self.node(target, ref)
        del self.compiling[ref]
        if holder.options:  # it was referred to while compiling: the placeholder stands for the node
            holder.options = (node,)
        self.refs[ref] = node
        return node

    def typed(self, kind: str, schema: dict, path: str) -> Node:
        if kind == "string":
            lo, hi = _int(schema, "minLength", path) or 0, _int(schema, "maxLength", path)
            if hi is not None and hi < lo:
                raise SchemaError(f"'maxLength' is below 'minLength' at {path}")
            return Str(lo, hi, _string_dfa(schema, lo, hi, path))
        if kind in ("integer", "number"):
            return Num(kind == "integer", _bounds(kind, schema, path))
        if kind == "boolean":
            return Lit((b"true", b"false"))
        if kind == "null":
            return Lit((b"null",))
        if kind == "array":
            items = schema.get("items", True)
            lo, hi = _int(schema, "minItems", path) or 0, _int(schema, "maxItems", path)
            if hi is not None and hi < lo:
                raise SchemaError(f"'maxItems' is below 'minItems' at {path}")
            return Arr(self.node(items, f"{path}.items"), lo, hi)
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
        compiled = {literal(k): self.node(v, f"{path}.properties.{k}") for k, v in props.items()}
        if compiled:
            # declared keys only (module docstring): additionalProperties changes nothing then
            return Obj(compiled, frozenset(literal(r) for r in required), None)
        return Obj({}, frozenset(), None if extra is False else self.node(extra, f"{path}.additionalProperties"))

    def finish(self, root: Node) -> None:
        """Refuse left recursion (a `$ref` cycle that reads no byte), settle the unions' first bytes, and keep
        the `enum` values the rest of their schema accepts."""
        nodes = {id(n): n for top in [root] + [rest for _, rest, _ in self.enums] for n in _reachable(top)}
        unions = [n for n in nodes.values() if isinstance(n, Union)]
        state: Dict[int, int] = {}  # 1: on the path, 2: done

        def visit(u: Union) -> None:
            state[id(u)] = 1
            for o in u.options:
                if isinstance(o, Union):
                    if state.get(id(o)) == 1:
                        raise SchemaError("a '$ref' cycle that reads nothing (left recursion) is not supported")
                    if id(o) not in state:
                        visit(o)
            state[id(u)] = 2

        for u in unions:
            if id(u) not in state:
                visit(u)
        _prune(list(nodes.values()), root)
        _settle(unions)
        from .automaton import Grammar  # (automaton.py imports this module)

        for lit, rest, path in self.enums:
            g = Grammar(rest)
            lit.values = tuple(v for v in lit.values if g.accepts(v))
            if not lit.values:
                raise SchemaError(f"no 'enum' value is of the schema's type (and bounds, pattern, ...) at {path}")
            lit.first = frozenset(v[0] for v in lit.values)
        if self.enums:
            _settle(unions)


def _prune(nodes: List[Node], root: Node) -> None:
    """Drop what no finite value can come out of (only a recursive `$ref` makes such: an object that requires
    itself), so that the automaton never starts what it cannot finish: union options, optional properties
    and array items of that kind go (the array keeps only `[]`); SchemaError if the root is such."""
    finite: set = set()
    changed = True
    while changed:
        changed = False
        for n in nodes:
            if id(n) in finite:
                continue
            if isinstance(n, Union):
                ok = any(id(o) in finite for o in n.options)
            elif isinstance(n, Obj):
                ok = all(id(n.props[k]) in finite for k in n.required)
            elif isinstance(n, Arr):
                ok = n.lo == 0 or id(n.item) in finite
            else:
                ok = True
            if ok:
                finite.add(id(n))
                changed = True
    if id(root) not in finite:
        raise SchemaError("no finite value matches the schema (a '$ref' that requires itself)")
    for n in nodes:
        if id(n) not in finite:
            continue
        if isinstance(n, Union):
            n.options = tuple(o for o in n.options if id(o) in finite)
        elif isinstance(n, Obj):
            if any(id(v) not in finite for v in n.props.values()):
                n.props = {k: v for k, v in n.props.items() if id(v) in finite}
                n.keys = tuple(n.props)
            if n.extra is not None and id(n.extra) not in finite:
                n.extra = None
        elif isinstance(n, Arr) and id(n.item) not in finite:
            n.hi = 0


def _reachable(root: Node) -> List[Node]:
    seen: Dict[int, Node] = {}
    todo = [root]
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen[id(n)] = n
        if isinstance(n, Union):
            todo.extend(n.options)
        elif isinstance(n, Obj):
            todo.extend(n.props.values())
            if n.extra is not None:
                todo.append(n.extra)
        elif isinstance(n, Arr):
            todo.append(n.item)
    return list(seen.values())


def _settle(unions: List["Union"]) -> None:
    """Each union's first bytes: its options' (to a fixed point; unions do not cycle among themselves)."""
    changed = True
    while changed:
        changed = False
        for u in unions:
            first = frozenset().union(*(o.first for o in u.options))
            if first != u.first:
                u.first, changed = first, True


def _union(nodes: List[Node]) -> Node:
    return nodes[0] if len(nodes) == 1 else Union(tuple(nodes))


def _string_dfa(schema: dict, lo: int, hi: Optional[int], path: str) -> Optional[Dfa]:
    """The DFA of a string's `format` and `pattern` (both: their intersection), None if it has neither."""
    dfa = None
    if "format" in schema:
        name = schema["format"]
        if name not in FORMATS:
            raise SchemaError(f"unsupported 'format' {name!r} at {path} (supported: {', '.join(FORMATS)})")
        dfa = format_dfa(name)
    if "pattern" in schema:
        try:
            pattern = cached(schema["pattern"])
            dfa = pattern if dfa is None else intersect(dfa, pattern)
        except PatternError as e:
            raise SchemaError(f"'pattern' at {path}: {e}") from None
    if dfa is not None and not dfa.feasible(dfa.start, lo, -1 if hi is None else hi):
        raise SchemaError(f"no string of the length bounds matches the 'pattern' / 'format' at {path}")
    return dfa


def _number(schema: dict, key: str, path: str):
    value = schema[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or abs(value) == float("inf"):
        raise SchemaError(f"'{key}' must be a finite number at {path}")
    return exact(value)


def _bounds(kind: str, schema: dict, path: str) -> Optional[Bounds]:
    """The range of an integer or number schema, None if it has none."""
    lo = hi = None
    lo_excl = hi_excl = False
    if "minimum" in schema:
        lo = _number(schema, "minimum", path)
    if "maximum" in schema:
        hi = _number(schema, "maximum", path)
    for key, low in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        if key not in schema:
            continue
        if isinstance(schema[key], bool):  # draft 4: a flag on minimum / maximum
            if schema[key]:
                if (lo if low else hi) is None:
                    raise SchemaError(f"'{key}': true without '{'minimum' if low else 'maximum'}' at {path}")
                if low:
                    lo_excl = True
                else:
                    hi_excl = True
            continue
        x = _number(schema, key, path)
        if low and (lo is None or x >= lo):
            lo, lo_excl = x, True
        elif not low and (hi is None or x <= hi):
            hi, hi_excl = x, True
    q = None
    if "multipleOf" in schema:
        if kind != "integer":
            raise SchemaError(f"'multipleOf' is supported on integers only, not on a '{kind}' at {path}")
        step = _number(schema, "multipleOf", path)
        if step <= 0:
            raise SchemaError(f"'multipleOf' must be greater than 0 at {path}")
        q = step.numerator  # an integer n is a multiple of p/q (lowest terms) exactly when p divides it
        q = None if q == 1 else q
    if lo is None and hi is None and q is None:
        return None
    bounds = Bounds(kind == "integer", lo, lo_excl, hi, hi_excl, q)
    if bounds.empty():
        raise SchemaError(f"no {kind} (of at most 15 integer digits) is within the bounds at {path}")
    return bounds
