"""The JSON Schema keywords xgrammar compiles without enforcing: a schema that uses one is refused
with its place named, rather than answered with a document that breaks it (a 200 that a
client trusted to match). vLLM's fallback engine refuses the same ones."""

from __future__ import annotations

import json
from typing import Any

# keywords whose value is a schema, a list of schemas, or a map of names to schemas
_SCHEMA = ("items", "additionalProperties", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_IGNORED = ("contains", "minContains", "maxContains", "propertyNames", "dependentRequired", "dependentSchemas", "not")


def schema_text_problem(spec: str) -> str | None:
    """``unenforced_keyword`` of a schema's JSON text (None for text that is not JSON: the
    compiler says what is wrong with it)."""
    try:
        return unenforced_keyword(json.loads(spec))
    except (ValueError, RecursionError):
        return None


def structural_tag_problem(spec: str) -> str | None:
    """``unenforced_keyword`` of the first JSON schema inside a structural tag's JSON text, its
    place in the tag named (None for text that is not JSON, as above)."""
    try:
        return _tag_schema_problem(json.loads(spec), "")
    except (ValueError, RecursionError):
        return None


def _tag_schema_problem(node: Any, path: str) -> str | None:
    """A structural tag's formats nest in lists and objects; a JSON schema is the value of
    ``json_schema`` in a format of type ``json_schema``."""
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and "json_schema" in node:
            found = unenforced_keyword(node["json_schema"])
            return None if found is None else f"{found} (in the structural tag at {path}/json_schema)"
        return _first(_tag_schema_problem(value, f"{path}/{key}") for key, value in node.items())
    if isinstance(node, list):
        return _first(_tag_schema_problem(value, f"{path}/{i}") for i, value in enumerate(node))
    return None


def unenforced_keyword(schema: Any, path: str = "") -> str | None:
    """Why ``schema`` (a parsed JSON schema) cannot be enforced, naming the keyword and its JSON
    pointer, or None when every keyword it uses is enforced."""
    if not isinstance(schema, dict):
        return None
    for keyword in _IGNORED:
        if keyword in schema:
            return _refusal(keyword, path)
    if schema.get("uniqueItems") is True:
        return _refusal("uniqueItems", path)
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return f"'allOf' of {len(all_of)} schemas (at {path or '/'}) is not enforced: merge them into one schema"
    for keyword, value in schema.items():
        if keyword in _SCHEMA and isinstance(value, dict):
            found = unenforced_keyword(value, f"{path}/{keyword}")
        elif keyword in _SCHEMA_LISTS and isinstance(value, list):
            found = _first(unenforced_keyword(item, f"{path}/{keyword}/{i}") for i, item in enumerate(value))
        elif keyword in _SCHEMA_MAPS and isinstance(value, dict):
            found = _first(unenforced_keyword(item, f"{path}/{keyword}/{name}") for name, item in value.items())
        else:
            found = None
        if found is not None:
            return found
    return None


def _first(reasons: Any) -> str | None:
    return next((reason for reason in reasons if reason is not None), None)


def _refusal(keyword: str, path: str) -> str:
    return f"the keyword '{keyword}' (at {path or '/'}) is not enforced by the grammar engine: remove it"
