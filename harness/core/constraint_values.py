"""A constrained-output value checked where the scenario is read, as the verdicts will use it: a regex compiles, a
JSON schema is a valid schema whose references all resolve inside it (a constraint's schema is never fetched). Each
problem is one sentence; None when the value is usable."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

# what compiling a pattern may raise besides re.error: a repetition count beyond the engine's limit
# (OverflowError), nesting deeper than the parser recurses (RecursionError)
COMPILE_ERRORS = (re.error, OverflowError, RecursionError)


def regex_problem(regex: str) -> str | None:
    try:
        re.compile(regex)
    except COMPILE_ERRORS as exc:
        return f"regex {_clip(regex)} does not compile: {exc or type(exc).__name__}"
    return None


def schema_problem(schema: dict[str, Any]) -> str | None:
    import jsonschema

    declared = schema.get("$schema")
    if declared is not None and not isinstance(declared, str):
        return f"json_schema's $schema is {declared!r}: give a JSON Schema dialect URI, or leave it out"
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return f"json_schema is not a valid JSON schema: {exc.message}"
    except RecursionError:
        return "json_schema nests deeper than it can be checked: flatten it (name shared parts under $defs)"
    except COMPILE_ERRORS as exc:  # a `pattern` the schema's own check compiles
        return f"json_schema holds a pattern that does not compile: {exc or type(exc).__name__}"
    return next(filter(None, (_reference_problem(schema, ref) for ref in _references(schema))), None)


def _references(value: Any) -> list[Any]:
    """Every `$ref` value in a schema, depth first (iterative: a deeply nested schema is no recursion limit)."""
    found, stack = [], [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "$ref" in node:
                found.append(node["$ref"])
            stack += node.values()
        elif isinstance(node, list):
            stack += node
    return found


def _reference_problem(schema: dict[str, Any], ref: Any) -> str | None:
    if not isinstance(ref, str) or not ref.startswith("#"):
        return (f"json_schema refers to {ref!r}: only references inside the schema (#/...) are resolved, nothing is "
                "fetched; inline the schema it names")
    node: Any = schema
    for part in ref[1:].lstrip("/").split("/") if ref not in ("#", "#/") else []:
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return f"json_schema refers to {ref!r}, which is not in the schema: fix the reference or add what it names"
    return None


def _clip(text: str, width: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= width else shown[: width - 4] + "...'"
