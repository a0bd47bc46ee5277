"""The JSON Schema keywords xgrammar compiles without enforcing: a schema that uses one is refused
with its place named, rather than answered with a document that breaks it (a 200 that a
client trusted to match). vLLM's fallback engine refuses the same ones."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# keywords whose value is a schema, a list of schemas, or a map of names to schemas
_SCHEMA = ("items", "additionalProperties", "if", "then", "else")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
# structural-tag formats that carry a JSON schema (xgrammar's)
_SCHEMA_FORMATS = ("json_schema", "qwen_xml_parameter")
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


def _tag_schema_problem(tag: Any, path: str) -> str | None:
    """A structural tag's formats nest in lists and objects; a JSON schema is the value of
    ``json_schema`` in a format that carries one (``json_schema``, ``qwen_xml_parameter``).
    Walked with a stack of its own, as the schemas are: a deep tag cannot pass unchecked."""
    stack: list[tuple[Any, str]] = [(tag, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict) and node.get("type") in _SCHEMA_FORMATS and "json_schema" in node:
            found = unenforced_keyword(node["json_schema"])
            if found is not None:
                return f"{found} (in the structural tag at {where}/json_schema)"
        elif isinstance(node, dict):
            stack.extend(reversed([(value, f"{where}/{key}") for key, value in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([(value, f"{where}/{i}") for i, value in enumerate(node)]))
    return None


def unenforced_keyword(schema: Any, path: str = "") -> str | None:
    """Why ``schema`` (a parsed JSON schema) cannot be enforced, naming the keyword and its JSON
    pointer, or None when every keyword it uses is enforced. Walked depth first with a stack of
    its own: a schema nested past Python's recursion limit (which xgrammar still compiles) is
    checked too."""
    stack: list[tuple[Any, str]] = [(schema, path)]
    while stack:
        node, where = stack.pop()
        if not isinstance(node, dict):
            continue
        found = _own_problem(node, where)
        if found is not None:
            return found
        stack.extend(reversed(list(_subschemas(node, where))))
    return None


def _own_problem(schema: dict[str, Any], path: str) -> str | None:
    """The unenforced keyword of ``schema`` itself (not of the schemas inside it)."""
    for keyword in _IGNORED:
        if keyword in schema:
            return _refusal(keyword, path)
    if schema.get("uniqueItems") is True:
        return _refusal("uniqueItems", path)
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        return f"'allOf' of {len(all_of)} schemas (at {path or '/'}) is not enforced: merge them into one schema"
    return None


def _subschemas(schema: dict[str, Any], path: str) -> Iterator[tuple[Any, str]]:
    """The schemas directly inside ``schema``, with their JSON pointers, in its keywords' order."""
    for keyword, value in schema.items():
        if keyword in _SCHEMA and isinstance(value, dict):
            yield value, f"{path}/{keyword}"
        elif keyword in _SCHEMA_LISTS and isinstance(value, list):
            yield from ((item, f"{path}/{keyword}/{i}") for i, item in enumerate(value))
        elif keyword in _SCHEMA_MAPS and isinstance(value, dict):
            yield from ((item, f"{path}/{keyword}/{name}") for name, item in value.items())


def _refusal(keyword: str, path: str) -> str:
    return f"the keyword '{keyword}' (at {path or '/'}) is not enforced by the grammar engine: remove it"
