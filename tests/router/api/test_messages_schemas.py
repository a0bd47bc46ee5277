"""Anthropic's Messages API request read as a chat: the system message, tool results and calls,
thinking, a prefill, the pins of cache_control, and the refusals of what this server cannot do."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from radixcluster.protocol import PromptPin
from radixcluster.router.api.errors import describe_validation_error, validation_param
from radixcluster.router.api.messages_schemas import MessagesChat, MessagesIn

WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CACHED = {"type": "ephemeral", "ttl": "1h"}


def request(**fields: Any) -> MessagesIn:
    return MessagesIn.model_validate({"model": "m", "max_tokens": 16, **fields})


def test_system_and_text_blocks_become_the_chats_messages():
    body = request(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Answer in French."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "Bonjour"},
            {"role": "user", "content": "Capital of Spain?"},
        ],
    )
    chat = body.chat_input()
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\nAnswer in French."},
        {"role": "user", "content": "Hi\nthere"},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "user", "content": "Capital of Spain?"},
    ]
    assert chat["continue_final_message"] is False and chat["tools"] is None and chat["chat_template_kwargs"] is None
    assert body.sampling().max_new_tokens == 16 and body.pins() == []


def test_tool_use_and_tool_results_become_calls_and_tool_messages():
    body = request(
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Two cities.", "signature": "sig"},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "Rain"}]},
                    {"type": "text", "text": "Which is warmer?"},
                ],
            },
        ],
    )
    chat = body.chat_input()
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert chat["messages"][1] == {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": "toolu_1", **call},
            {"id": "toolu_2", **call, "function": {**call["function"], "arguments": {"city": "Rome"}}},
        ],
        "reasoning_content": "Two cities.",
    }
    assert chat["messages"][2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Rain"},
        {"role": "user", "content": "Which is warmer?"},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather of a city",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    # a user message of tool results alone adds no empty user turn
    only_results = request(
        messages=[
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ]
    )
    assert only_results.chat_input()["messages"][-1] == {"role": "tool", "tool_call_id": "t", "content": ""}


@pytest.mark.parametrize(
    "choice,chat_choice,parallel",
    [
        ({"type": "auto"}, "auto", True),
        ({"type": "any"}, "required", True),
        ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
        ({"type": "none"}, "none", True),
    ],
)
def test_tool_choice_reads_as_the_chats(choice, chat_choice, parallel):
    body = request(tools=[WEATHER], tool_choice=choice, messages=[{"role": "user", "content": "Paris?"}])
    assert (body.tool_choice, body.parallel_tool_calls) == (chat_choice, parallel)


def test_a_named_tool_is_forced_under_its_input_schema():
    body = request(
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Paris?"}],
    )
    assert body.tool_choice.function.name == "get_weather"
    assert '"required": ["city"]' in body.sampling().json_schema
    no_input = request(
        tools=[{"name": "now"}], tool_choice={"type": "any"}, messages=[{"role": "user", "content": "?"}]
    )
    assert no_input.tools[0].function.parameters == {"type": "object", "properties": {}}


def test_a_last_assistant_message_is_a_prefill():
    body = request(messages=[{"role": "user", "content": "Count"}, {"role": "assistant", "content": "One, two,"}])
    chat = body.chat_input()
    assert chat["continue_final_message"] is True and chat["messages"][-1] == {
        "role": "assistant",
        "content": "One, two,",
    }


def test_stop_sequences_thinking_and_the_output_format():
    body = request(
        messages=[{"role": "user", "content": "Hi"}],
        stop_sequences=["\n\n", "END"],
        thinking={"type": "enabled", "budget_tokens": 8},
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}, "effort": "low"},
        top_k=5,
        temperature=0.3,
    )
    sampling = body.sampling()
    assert (sampling.stop, sampling.top_k, sampling.temperature) == (["\n\n", "END"], 5, 0.3)
    assert sampling.json_schema == '{"type": "object"}'
    # thinking decides enable_thinking; the effort reaches the template as the chat's reasoning_effort
    assert body.chat_input()["chat_template_kwargs"] == {"enable_thinking": True, "reasoning_effort": "low"}
    beta = request(
        messages=[{"role": "user", "content": "Hi"}], output_format={"type": "json_schema", "schema": {"type": "array"}}
    )
    assert beta.sampling().json_schema == '{"type": "array"}'
    off = request(
        messages=[{"role": "user", "content": "Hi"}], thinking={"type": "disabled"}, chat_template_kwargs={"x": 1}
    )
    assert off.chat_input()["chat_template_kwargs"] == {"x": 1, "enable_thinking": False}


def test_cache_control_pins_the_chat_to_the_end_of_its_message():
    body = request(
        tools=[{**WEATHER, "cache_control": {"type": "ephemeral"}}],
        tool_choice={"type": "none"},
        system=[{"type": "text", "text": "Be brief.", "cache_control": CACHED}],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {"city": "Oslo"}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": "Snow"},
                    {"type": "text", "text": "Thanks", "cache_control": {"type": "ephemeral", "ttl": "5m"}},
                ],
            },
        ],
    )
    # system, user, assistant, tool, user: the last block's pin takes all five messages
    assert body.pins() == [PromptPin(300.0, 1), PromptPin(3600.0, 1), PromptPin(300.0, 5)]
    body._may_pin = False
    assert body.pins() == []


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"messages": []}, "messages"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}
                ]
            },
            "content blocks of type 'image' are not supported",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}],
                    }
                ]
            },
            "blocks of type 'image' are not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "a user message cannot hold a tool_use block",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
        (
            {"messages": [{"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
            "a system message cannot hold a tool_result block",
        ),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "edits of type 'clear_tool_uses_20250919' are not supported",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "Anthropic's own tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "not among the tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "sometimes"}}, "tool_choice of type 'sometimes'"),
        # values of the wrong type where a before-validator reads them (a TypeError was a 500)
        ({"tools": [WEATHER], "tool_choice": {"type": ["any"]}}, "tool_choice of type \\['any'\\]"),
        ({"output_config": 5, "output_format": {"type": "json_schema", "schema": {}}}, "output_config"),
        ({"tools": [WEATHER, WEATHER]}, "a name of its own"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 16}},
            "budget_tokens (16) must be less than max_tokens (16)",
        ),
        ({"mcp_servers": [{"url": "http://x"}]}, "MCP servers"),
        ({"system": [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "1y"}}]}, "ttl"),
    ],
)
def test_what_cannot_be_served_is_refused_by_name(fields, message):
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}], **fields}
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MessagesIn.model_validate({k: v for k, v in body.items() if v is not None})


def test_count_tokens_reads_the_conversation_without_max_tokens():
    body = MessagesChat.model_validate(
        {"model": "m", "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
    )
    assert [m["role"] for m in body.chat_input()["messages"]] == ["system", "user"]


def test_a_system_message_mid_conversation_and_cleared_thinking():
    """What Claude Code sends: a system message after the user's, and context_management's
    clear_thinking, which leaves out the thinking of all but the last turns it keeps."""

    def thought(n: int) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": f"T{n}"}, {"type": "text", "text": f"A{n}"}],
        }

    turns = [
        {"role": "user", "content": "Q1"},
        {"role": "system", "content": [{"type": "text", "text": "Agents: Explore"}]},
        thought(1),
        {"role": "user", "content": "Q2"},
        thought(2),
        {"role": "user", "content": "Q3"},
    ]

    def thinking(keep: Any) -> list[str | None]:
        edits = [{"type": "clear_thinking_20251015", **({} if keep is None else {"keep": keep})}]
        chat = request(messages=turns, context_management={"edits": edits}).chat_input()["messages"]
        return [m.get("reasoning_content") for m in chat if m["role"] == "assistant"]

    chat = request(messages=turns).chat_input()["messages"]
    assert chat[1] == {"role": "system", "content": "Agents: Explore"}
    assert thinking("all") == ["T1", "T2"]
    assert thinking(None) == [None, "T2"]  # Anthropic's default: the last turn's
    assert thinking({"type": "thinking_turns", "value": 0}) == [None, None]


def test_max_tokens_gives_way_to_the_room_the_prompt_leaves():
    """Claude Code asks 32,000 tokens: the router lowers the limit to what the context leaves,
    as it lowers a default."""
    sampling = request(max_tokens=32000, messages=[{"role": "user", "content": "Hi"}]).protocol_sampling()
    assert (sampling.max_new_tokens, sampling.max_new_tokens_is_default) == (32000, True)


@pytest.mark.parametrize(
    "fields, named, param",
    [
        ({"stop_sequences": [1]}, "stop_sequences.0", "stop_sequences"),
        (
            {"tools": [{"name": "f", "description": 5, "input_schema": {"type": "object"}}]},
            "tools.0.description",
            "tools.0.description",
        ),
        (
            {"tools": [{"name": "f", "input_schema": {"type": "string"}}]},
            "tools.0.input_schema",
            "tools.0.input_schema",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages.0.content.0.text",
            "messages.0.content",  # the union's first member (a string) is named first
        ),
    ],
)
def test_a_400_names_the_field_as_an_anthropic_client_sent_it(fields: dict[str, Any], named: str, param: str) -> None:
    # the body is read into the chat's shape (stop, tools[].function); its errors speak Anthropic's
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}
    for model in (MessagesIn, MessagesChat):
        with pytest.raises(ValidationError) as info:
            model.model_validate(body)
        message = describe_validation_error(info.value)
        assert f"{named}: " in message and "function" not in message and "stop:" not in message
        assert validation_param(info.value) == param
