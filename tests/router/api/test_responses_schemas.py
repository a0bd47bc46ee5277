"""The Responses API's request read as a chat: instructions first, input messages as given,
text.format as a response_format, and what it would need stored refused by name."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from radixcluster.router.api.errors import describe_validation_error
from radixcluster.router.api.responses_schemas import ResponsesIn


def refusal(body: dict) -> str:
    with pytest.raises(ValidationError) as info:
        ResponsesIn.model_validate(body)
    return describe_validation_error(info.value)


def test_instructions_come_first_then_the_input_as_messages() -> None:
    plain = ResponsesIn.model_validate({"input": "Hi"})
    assert plain.messages() == [{"role": "user", "content": "Hi"}]
    turns = [
        {"role": "user", "content": "I'm Ann."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ann!"}]},
        {
            "role": "developer",
            "content": [{"type": "input_text", "text": "Be"}, {"type": "input_text", "text": " kind."}],
        },
    ]
    body = ResponsesIn.model_validate({"input": turns, "instructions": "Be brief."})
    assert body.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "I'm Ann."},
        {"role": "assistant", "content": "Hello Ann!"},
        {"role": "developer", "content": "Be kind."},
    ]


def test_max_output_tokens_and_text_format_become_the_sampling_parameters() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {
        "input": "Hi",
        "max_output_tokens": 7,
        "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
    }
    sampling = ResponsesIn.model_validate(body).sampling()
    assert sampling.max_new_tokens == 7 and json.loads(sampling.json_schema) == schema
    assert (
        ResponsesIn.model_validate({"input": "Hi", "text": {"format": {"type": "json_object"}}}).sampling().json_schema
    )
    assert (
        ResponsesIn.model_validate({"input": "Hi", "text": {"format": {"type": "text"}}}).sampling().json_schema is None
    )
    limit = ResponsesIn.model_validate({"input": "Hi"}).sampling().to_protocol(ResponsesIn.default_max_tokens)
    assert limit.max_new_tokens_is_default  # lowered to the room the prompt leaves, as a chat's


@pytest.mark.parametrize(
    "body, words",
    [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "Hi", "tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"input": "Hi", "n": 2}, "one output"),
        ({"input": ""}, "input"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "needs a schema"),
    ],
)
def test_what_it_cannot_do_is_refused_by_name(body: dict, words: str) -> None:
    assert words in refusal(body)
    ResponsesIn.model_validate({"input": "Hi", "tools": [], "previous_response_id": None, "store": True})
