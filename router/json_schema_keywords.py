"""The JSON Schema keywords xgrammar compiles without enforcing: a schema that uses one is refused
with its place named, rather than answered with a document that breaks it (a 200 that a
client trusted to match). vLLM's fallback engine refuses the same ones."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
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
    return _text_problem(spec, unenforced_keyword)


def structural_tag_problem(spec: str) -> str | None:
    """``unenforced_keyword`` of the first JSON schema inside a structural tag's JSON text, its
    place in the tag named (None for text that is not JSON, as above)."""
    return _text_problem(spec, _tag_schema_problem)


def _text_problem(spec: str, check: Callable[[Any], str | None]) -> str | None:
    try:
        parsed = json.loads(spec)
    except (ValueError, RecursionError):
        return None
    return check(parsed)


def _tag_schema_problem(tag: Any) -> str | None:
    """A structural tag's formats nest in lists and objects; a JSON schema is the value of
    ``json_schema`` in a format that carries one (``json_schema``, ``qwen_xml_parameter``)."""
    for node, where in _depth_first(tag, "", _tag_parts):
        if _carries_schema(node):
            found = unenforced_keyword(node["json_schema"])
            if found is not None:
                return f"{found} (in the structural tag at {where}/json_schema)"
    return None


def _carries_schema(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") in _SCHEMA_FORMATS and "json_schema" in node


def _tag_parts(node: Any, path: str) -> Iterator[tuple[Any, str]]:
    """The formats (and lists of them) inside a tag's ``node``; not the schema it carries."""
    if isinstance(node, dict) and not _carries_schema(node):
        yield from ((value, f"{path}/{key}") for key, value in node.items())
    elif isinstance(node, list):
        yield from ((value, f"{path}/{i}") for i, value in enumerate(node))


def unenforced_keyword(schema: Any, path: str = "") -> str | None:
    """Why ``schema`` (a parsed JSON schema) cannot be enforced, naming the keyword and its JSON
    pointer, or None when every keyword it uses is enforced."""
    for node, where in _depth_first(schema, path, _subschemas):
        found = _own_problem(node, where) if isinstance(node, dict) else None
        if found is not None:
            return found
    return None


def _depth_first(
    root: Any, path: str, parts: Callable[[Any, str], Iterator[tuple[Any, str]]]
) -> Iterator[tuple[Any, str]]:
    """``root`` and the nodes inside it (``parts`` gives a node's own, in order), depth first,
    with their JSON pointers; walked with a stack of its own, so a schema or tag nested past
    Python's recursion limit (which xgrammar still compiles) is walked too."""
    stack: list[tuple[Any, str]] = [(root, path)]
    while stack:
        node, where = stack.pop()
        yield node, where
        stack.extend(reversed(list(parts(node, where))))


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


def _subschemas(schema: Any, path: str) -> Iterator[tuple[Any, str]]:
    """The schemas directly inside ``schema``, with their JSON pointers, in its keywords' order."""
    if not isinstance(schema, dict):
        return
    for keyword, value in schema.items():
        if keyword in _SCHEMA and isinstance(value, dict):
            yield value, f"{path}/{keyword}"
        elif keyword in _SCHEMA_LISTS and isinstance(value, list):
            yield from ((item, f"{path}/{keyword}/{i}") for i, item in enumerate(value))
        elif keyword in _SCHEMA_MAPS and isinstance(value, dict):
            yield from ((item, f"{path}/{keyword}/{name}") for name, item in value.items())


def _refusal(keyword: str, path: str) -> str:
    return f"the keyword '{keyword}' (at {path or '/'}) is not enforced by the grammar engine: remove it"
