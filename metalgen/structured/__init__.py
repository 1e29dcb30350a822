"""Structured output: JSON (any object, or a JSON-schema subset) by constrained decoding (docs/serve.md).

`compile_schema` / `json_object` (schema.py) give grammar nodes, `Grammar` (automaton.py) their byte-level
pushdown automaton (with regex.py's DFAs for `pattern` / `format` and numbers.py's digit-by-digit bounds),
`TokenIndex` (vocab.py) the token mask of an automaton state, and `JsonConstraint` (processor.py) the logits
processor that applies it during generation."""

import collections
import json
from typing import Any, Optional

from .automaton import Grammar
from .processor import JsonConstraint
from .schema import SchemaError, compile_schema, json_object
from .vocab import TokenIndex, token_index

__all__ = ["Grammar", "JsonConstraint", "SchemaError", "TokenIndex", "compile_schema", "grammar", "json_object",
           "token_index"]

_GRAMMARS: "collections.OrderedDict[str, Grammar]" = collections.OrderedDict()


def grammar(schema: Optional[Any]) -> Grammar:
    """The automaton of a JSON schema (None: any JSON object, OpenAI's json_object), compiled once per
    distinct schema (the last 64 kept): requests with the same schema share its memoized masks.
    SchemaError for a schema outside the supported subset."""
    key = "json_object" if schema is None else json.dumps(schema, sort_keys=True)
    g = _GRAMMARS.get(key)
    if g is None:
        g = _GRAMMARS[key] = Grammar(json_object() if schema is None else compile_schema(schema))
        if len(_GRAMMARS) > 64:
            _GRAMMARS.popitem(last=False)
    _GRAMMARS.move_to_end(key)
    return g
