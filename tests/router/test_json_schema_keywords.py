"""Schemas whose keywords xgrammar would compile without enforcing are refused, with the keyword
and its place named; the keywords it enforces, and property names that spell a keyword, pass."""

from __future__ import annotations

import json

import pytest

from radixcluster.router.json_schema_keywords import schema_text_problem, structural_tag_problem, unenforced_keyword

ITEMS = {"type": "array", "items": {"enum": ["a", "b"]}}


@pytest.mark.parametrize(
    "schema, where",
    [
        ({**ITEMS, "uniqueItems": True}, "'uniqueItems' (at /)"),
        ({"type": "object", "properties": {"tags": {**ITEMS, "uniqueItems": True}}}, "(at /properties/tags)"),
        ({"anyOf": [{"type": "integer"}, {"not": {"type": "string"}}]}, "'not' (at /anyOf/1)"),
        ({"$defs": {"T": {**ITEMS, "contains": {"const": "a"}}}, "$ref": "#/$defs/T"}, "'contains' (at /$defs/T)"),
        ({"type": "object", "propertyNames": {"pattern": "^a"}}, "'propertyNames'"),
        ({"type": "object", "dependentRequired": {"a": ["b"]}}, "'dependentRequired'"),
        (
            {"type": "array", "items": {"allOf": [{"type": "string"}, {"type": "integer"}]}},
            "'allOf' of 2 schemas (at /items)",
        ),
    ],
)
def test_an_unenforced_keyword_is_named_with_its_place(schema, where) -> None:
    reason = unenforced_keyword(schema)
    assert reason is not None and where in reason
    assert schema_text_problem(json.dumps(schema)) == reason


def test_what_xgrammar_enforces_passes() -> None:
    enforced = {
        "type": "object",
        # properties named like keywords are names, not keywords
        "properties": {"not": {"type": "string"}, "contains": {**ITEMS, "uniqueItems": False, "minItems": 1}},
        "required": ["not"],
        "additionalProperties": False,
        "$defs": {"One": {"allOf": [{"type": "integer", "minimum": 0}]}},
        "enum": [{"not": 1}],
    }
    assert unenforced_keyword(enforced) is None
    assert schema_text_problem('{"type": "object"') is None  # not JSON: the compiler says why


def test_a_structural_tags_schemas_are_checked_where_they_are() -> None:
    def tag(schema: dict) -> str:
        inner = {
            "type": "tag",
            "begin": "<a>",
            "content": {"type": "json_schema", "json_schema": schema},
            "end": "</a>",
        }
        return json.dumps(
            {"type": "structural_tag", "format": {"type": "sequence", "elements": [{"type": "any_text"}, inner]}}
        )

    reason = structural_tag_problem(tag({**ITEMS, "uniqueItems": True}))
    assert reason is not None and "'uniqueItems' (at /)" in reason
    assert "(in the structural tag at /format/elements/1/content/json_schema)" in reason
    assert structural_tag_problem(tag(ITEMS)) is None
    assert structural_tag_problem("{not json") is None


def test_a_schema_nested_past_pythons_recursion_limit_is_checked_too() -> None:
    # xgrammar compiles a schema 300 levels deep within its time; the check must reach its bottom
    schema: dict = {**ITEMS, "uniqueItems": True}
    for _ in range(250):
        schema = {"type": "object", "properties": {"a": schema}}
    reason = schema_text_problem(json.dumps(schema))
    assert reason is not None and "'uniqueItems' (at /properties/a/properties/a/" in reason
    tag = {"type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema": schema}, "end": "</a>"}
    for _ in range(100):
        tag = {"type": "sequence", "elements": [tag]}
    found = structural_tag_problem(json.dumps({"type": "structural_tag", "format": tag}))
    assert found is not None and "'uniqueItems'" in found


def test_a_qwen_xml_parameter_format_carries_a_schema_checked_as_any() -> None:
    form = {"type": "qwen_xml_parameter", "json_schema": {"type": "object", "properties": {"a": {"not": {}}}}}
    reason = structural_tag_problem(json.dumps({"type": "structural_tag", "format": form}))
    assert reason is not None and "'not' (at /properties/a)" in reason and "at /format/json_schema" in reason
