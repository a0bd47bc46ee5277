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
            "content": [{"type": "input_text", "text": "Be"}, {"type": "input_text", "text": "kind."}],
        },
    ]
    body = ResponsesIn.model_validate({"input": turns, "instructions": "Be brief."})
    assert body.messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "I'm Ann."},
        {"role": "assistant", "content": "Hello Ann!"},
        {"role": "developer", "content": "Be\nkind."},  # text parts one per line, as the chat's
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
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools of type 'web_search' are not supported"),
        ({"input": "Hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "mcp"}}, "'mcp'"),
        ({"input": "Hi", "tool_choice": "required"}, "tool_choice needs tools"),
        ({"input": "Hi", "n": 2}, "a response is one answer"),
        ({"input": ""}, "input"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input items of type 'web_search_call'"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "a b", "arguments": "{}"}]}, "input"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input"),
        ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "needs a schema"),
    ],
)
def test_what_it_cannot_do_is_refused_by_name(body: dict, words: str) -> None:
    assert words in refusal(body)
    ResponsesIn.model_validate({"input": "Hi", "tools": [], "previous_response_id": None, "store": True})


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_the_templates_variables_reach_it_as_the_chats_do() -> None:
    """SGLang's and vLLM's chat_template_kwargs (Qwen's enable_thinking), and the effort beside them."""
    body = ResponsesIn.model_validate(
        {"input": "Hi", "chat_template_kwargs": {"enable_thinking": False}, "reasoning": {"effort": "high"}}
    )
    assert body.chat_input()["chat_template_kwargs"] == {"enable_thinking": False, "reasoning_effort": "high"}


def test_flat_function_tools_read_as_the_chats_and_are_listed_flat_again() -> None:
    body = ResponsesIn.model_validate(
        {"input": "Weather?", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}}
    )
    assert body.template_tools() == [
        {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    ]
    assert body.response_tools() == [WEATHER]
    # a named call is generated under its parameters' schema, as on the chat endpoint
    assert json.loads(body.sampling().json_schema) == WEATHER["parameters"]
    assert body.chat_input()["tools"] == body.template_tools()
    unforced = ResponsesIn.model_validate({"input": "Weather?", "tools": [WEATHER], "tool_choice": "none"})
    assert unforced.sampling().json_schema is None
    forced_with_format = {
        "input": "Weather?",
        "tools": [WEATHER],
        "tool_choice": "required",
        "text": {"format": {"type": "json_object"}},
    }
    # the format stands aside: it shapes text, which a forced call has none of
    required = {k: v for k, v in forced_with_format.items() if k != "text"}
    assert (
        ResponsesIn.model_validate(forced_with_format).sampling().json_schema
        == ResponsesIn.model_validate(required).sampling().json_schema
    )


def test_calls_their_outputs_and_thinking_become_the_chats_messages() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather"}
    items = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Two."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {**call, "arguments": '{"city": "Paris"}', "status": "completed"},
        {**call, "call_id": "call_2", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "21 C"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "Stale."}]},
        {"role": "user", "content": "And Oslo?"},
        {**call, "call_id": "call_3", "arguments": '{"city": "Oslo"}'},
    ]
    messages = ResponsesIn.model_validate({"input": items}).messages()
    assert messages == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "21 C"},
        {"role": "user", "content": "And Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
            ],
        },
    ]
