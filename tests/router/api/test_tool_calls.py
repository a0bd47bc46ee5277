"""Forced tool calls: the schema they are generated under (compiled by the router's real grammar
compiler), how their output reads back into ``tool_calls``, and what the chat template is given."""

from __future__ import annotations

import json

import pytest

from radixcluster.protocol import SamplingParams
from radixcluster.router.api.errors import describe_validation_error
from radixcluster.router.api.openai_schemas import ChatCompletionIn
from radixcluster.router.api.tool_calls import ChatToolCalls, read_tool_calls, template_tool_calls
from radixcluster.router.grammar import GrammarCache
from radixcluster.router.text.tokenizer import Tokenizer, load_tokenizer

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "now"}},  # no parameters
]
CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def chat(**fields) -> ChatCompletionIn:
    return ChatCompletionIn.model_validate({"messages": CHAT, "tools": TOOLS, **fields})


def refusal(**fields) -> str:
    with pytest.raises(ValueError) as info:
        chat(**fields)
    return describe_validation_error(info.value)


@pytest.fixture(scope="module")
def tokenizer(model_path) -> Tokenizer:
    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def accepts(tokenizer):
    grammars = GrammarCache(tokenizer, 49152)

    def takes(schema: str, text: str) -> bool:
        """Whether the compiled schema takes ``text`` token by token, then may end."""
        grammar = grammars.for_request(SamplingParams(json_schema=schema))
        ids = tokenizer.encode(text, add_special_tokens=False)
        eos = tokenizer.eos_token_ids[0]
        return all(grammar.accept(t) is None for t in ids) and grammar.accept(eos) == {"type": "stop", "matched": eos}

    return takes


def test_a_named_function_is_generated_under_its_parameters(accepts) -> None:
    body = chat(tool_choice=NAMED)
    assert json.loads(body.sampling().json_schema) == WEATHER
    assert accepts(body.tool_schema(), '{"city": "Paris", "unit": "celsius"}')
    assert not accepts(body.tool_schema(), '{"city": "Paris", "unit": "kelvin"}')
    # a function without parameters takes an empty object
    bare = chat(tool_choice={"type": "function", "function": {"name": "now"}}).tool_schema()
    assert accepts(bare, "{}")


def test_required_generates_a_list_of_calls_of_the_tools(accepts) -> None:
    schema = chat(tool_choice="required").tool_schema()
    two = '[{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}, {"name": "now", "parameters": {}}]'
    assert accepts(schema, two)
    assert not accepts(schema, "[]")  # at least one call
    assert not accepts(schema, '[{"name": "get_time", "parameters": {}}]')  # not a tool
    assert not accepts(schema, '[{"name": "now", "parameters": {"city": "Paris", "unit": "x"}}]')
    single = chat(tool_choice="required", parallel_tool_calls=False).tool_schema()
    assert accepts(single, '[{"name": "now", "parameters": {}}]')
    assert not accepts(single, two)


def test_required_keeps_each_tools_references_pointing_into_its_own_parameters(accepts) -> None:
    """Pydantic writes $defs for an enum or a nested model, and "#" for a model inside itself; in
    the list of calls each pointer is moved to where the tool's parameters now are."""
    cities = {
        "type": "object",
        "properties": {"cities": {"type": "array", "items": {"$ref": "#/$defs/City"}}},
        "required": ["cities"],
        "$defs": {"City": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    }
    tree = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "child": {"anyOf": [{"type": "null"}, {"$ref": "#"}]}},
        "required": ["name", "child"],
        "default": {"$ref": "#"},  # data, not a reference: left as written
    }
    tools = [
        {"type": "function", "function": {"name": "visit", "parameters": cities}},
        {"type": "function", "function": {"name": "grow", "parameters": tree}},
    ]
    schema = chat(tools=tools, tool_choice="required").tool_schema()
    assert json.loads(schema)["items"]["anyOf"][1]["properties"]["parameters"]["default"] == {"$ref": "#"}
    assert accepts(schema, '[{"name": "visit", "parameters": {"cities": [{"name": "Rome"}]}}]')
    assert not accepts(schema, '[{"name": "visit", "parameters": {"cities": [{"town": "Rome"}]}}]')
    assert accepts(schema, '[{"name": "grow", "parameters": {"name": "a", "child": {"name": "b", "child": null}}}]')
    assert not accepts(schema, '[{"name": "grow", "parameters": {"name": "a", "child": [{"name": "grow"}]}}]')
    assert cities["properties"]["cities"]["items"] == {"$ref": "#/$defs/City"}  # the tool's own is unchanged


def test_auto_needs_a_parser_of_the_models_calls() -> None:
    body = chat()  # "auto": OpenAI's default with tools
    with pytest.raises(ValueError, match="needs the server started with --tool-call-parser"):
        ChatToolCalls.of(body.tools, body.tool_choice, None)
    tools = ChatToolCalls.of(body.tools, body.tool_choice, "qwen25")
    assert tools.choice == "auto" and tools.names == {"get_weather", "now"} and not tools.forced
    plain = ChatToolCalls.of(None, None, "qwen25")
    assert plain.format is None and plain.answer("Hi <tool_call>") == ("Hi <tool_call>", None)


def test_auto_reads_the_calls_the_model_wrote_after_its_text() -> None:
    tools = ChatToolCalls.of(chat().tools, None, "qwen25")
    text = 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'
    content, (call,) = tools.answer(text)
    assert content == "Checking." and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}
    assert tools.answer(text.replace("Checking.", ""))[0] is None  # nothing but the call
    # a call of a function the request did not offer, or one cut short, is text
    unknown = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert tools.answer(unknown) == (unknown, None)
    assert tools.answer('<tool_call>{"name": "now", "argu') == ('<tool_call>{"name": "now", "argu', None)
    assert tools.releasable("Checking.<tool_") == len("Checking.")
    forced = ChatToolCalls.of(chat().tools, "required", None)
    assert forced.forced and forced.releasable('[{"name": "now"') == 0


def test_parallel_tool_calls_false_keeps_the_first_call_the_model_wrote() -> None:
    """As vLLM reads it with "auto": the calls after the first are left out."""
    two = "".join(
        f'<tool_call>{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}</tool_call>'
        for city in ("Oslo", "Rome")
    )
    assert len(ChatToolCalls.of(chat().tools, None, "qwen25").answer(two)[1]) == 2
    content, (call,) = ChatToolCalls.of(chat().tools, None, "qwen25", parallel=False).answer(two)
    assert content is None and call["function"]["arguments"] == '{"city": "Oslo"}'


def test_auto_and_none_force_nothing() -> None:
    assert chat(tool_choice="none").tool_schema() is None
    assert chat(tool_choice="none").sampling().json_schema is None
    assert ChatCompletionIn.model_validate({"messages": CHAT}).tool_schema() is None


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"tools": None, "tool_choice": "required"}, "tool_choice needs tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope', which is not among the tools"),
        ({"tools": TOOLS + TOOLS[:1], "tool_choice": "required"}, "a name of its own"),
        ({"tool_choice": "required", "regex": "a+"}, "cannot take regex"),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}], "tool_choice": "required"},
            "tools.0.function.name",
        ),
        ({"tools": [{"type": "retrieval"}], "tool_choice": "required"}, "tools.0.type"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
            "tools.0.function.parameters: parameters must be a JSON schema of type \"object\", got type 'string'",
        ),
        ({"tools": TOOLS * 65, "tool_choice": "none"}, "at most 128"),
    ],
)
def test_tool_requests_it_cannot_honour_are_refused_saying_why(fields: dict, says: str) -> None:
    assert says in refusal(**fields)


def test_a_response_format_stands_aside_for_a_forced_call() -> None:
    # it shapes text content, which a forced call has none of (OpenAI and vLLM take both)
    for answer_format in ({"type": "text"}, {"type": "json_object"}):
        forced = chat(tool_choice=NAMED, response_format=answer_format).sampling().json_schema
        assert forced == chat(tool_choice=NAMED).sampling().json_schema


def test_the_output_of_a_forced_call_reads_back_into_tool_calls() -> None:
    (named,) = read_tool_calls('{\n  "city": "Paris", "unit": "celsius"\n}', chat(tool_choice=NAMED).tool_choice)
    assert named["type"] == "function" and named["id"].startswith("call_")
    assert named["function"] == {"name": "get_weather", "arguments": '{\n  "city": "Paris", "unit": "celsius"\n}'}
    listed = '[{"name": "get_weather", "parameters": {"city": "Zürich", "unit": "celsius"}}, {"name": "now", "parameters": {}}]'
    calls = read_tool_calls(listed, "required")
    assert [c["function"] for c in calls] == [
        {"name": "get_weather", "arguments": '{"city": "Zürich", "unit": "celsius"}'},
        {"name": "now", "arguments": "{}"},
    ]
    assert len({c["id"] for c in calls}) == 2
    # cut short (max_tokens, a stop string): no calls, the text stays the answer
    assert read_tool_calls('[{"name": "now", "param', "required") is None
    assert read_tool_calls('{"city": "Par', chat(tool_choice=NAMED).tool_choice) is None
    # nested past the JSON decoder's depth (its recursion limit): no calls, never a 500
    assert read_tool_calls("[" * 5000 + "]" * 5000, "required") is None


def test_the_template_is_given_the_tools_and_earlier_calls_as_mappings() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        *CHAT,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "18 degrees"},
    ]
    body = ChatCompletionIn.model_validate({"messages": messages, "tools": TOOLS, "tool_choice": "none"})
    assert body.template_tools() == [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
        {"type": "function", "function": {"name": "now"}},
    ]
    assistant, tool = (m.as_dict() for m in body.messages[1:])
    assert assistant["content"] == "" and assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert tool == {"role": "tool", "content": "18 degrees", "tool_call_id": "c1"}
    # arguments that are not JSON reach the template as written
    odd = {**call, "function": {"name": "f", "arguments": "not json"}}
    assert template_tool_calls([odd])[0]["function"]["arguments"] == "not json"
    deep = {**call, "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}
    assert template_tool_calls([deep])[0]["function"]["arguments"] == "[" * 5000 + "]" * 5000
    # escapes of a lone surrogate (valid JSON, no UTF-8 text) stay escaped, as the client wrote them
    for written in ('{"a": "\\ud800"}', '{"\\udfff": 1}'):
        lone = {**call, "function": {"name": "f", "arguments": written}}
        assert template_tool_calls([lone])[0]["function"]["arguments"] == written
