"""Tool calls read out of answers in each model family's own format, and what of a growing answer
a stream may send before its calls are known."""

from __future__ import annotations

import pytest

from radixcluster.router.api.tool_parsers import TOOL_CALL_FORMATS

WEATHER = ("get_weather", {"city": "Paris", "unit": "celsius"})
TIME = ("get_time", {})


@pytest.mark.parametrize(
    "parser, text, before, calls",
    [
        # Qwen 2.5 and Hermes: blocks after text, the last one possibly unclosed at the end
        (
            "qwen25",
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            "Let me check.\n",
            [WEATHER, TIME],
        ),
        ("hermes", '<tool_call>{"name": "get_time", "arguments": {}}', "", [TIME]),
        ("qwen", '<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>', "", [TIME]),  # arguments as text
        # Llama 3.1's JSON, with or without <|python_tag|>, ";" between calls
        ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', "", [WEATHER]),
        (
            "llama3_json",
            '<|python_tag|>{"name": "get_time", "parameters": {}}; {"name": "get_weather", "parameters": '
            '{"city": "Paris", "unit": "celsius"}}',
            "",
            [TIME, WEATHER],
        ),
        ("mistral", '[TOOL_CALLS] [{"name": "get_time", "arguments": {}}]', "", [TIME]),
        ("mistral", ' [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]', "", [WEATHER]),
        ("pythonic", '[get_weather(city="Paris", unit="celsius"), get_time()]', "", [WEATHER, TIME]),
    ],
)
def test_each_format_reads_its_calls(parser: str, text: str, before: str, calls: list) -> None:
    fmt = TOOL_CALL_FORMATS[parser]
    head, written = fmt.split(text)
    assert head == before and written is not None
    assert fmt.read(written) == calls


@pytest.mark.parametrize(
    "parser, text",
    [
        ("qwen25", "Paris is sunny today."),
        ("llama3", "The weather in Paris is sunny."),
        ("mistral", "Sunny."),
        ("pythonic", "It is sunny."),
    ],
)
def test_an_answer_without_calls_is_all_text(parser: str, text: str) -> None:
    assert TOOL_CALL_FORMATS[parser].split(text) == (text, None)


@pytest.mark.parametrize(
    "parser, written",
    [
        ("qwen25", '<tool_call>{"name": "get_time", "argum'),  # cut short
        ("qwen25", '<tool_call>{"arguments": {}}</tool_call>'),  # no name
        ("llama3", '{"answer": "sunny"}'),  # a JSON answer, not a call
        ("llama3", '{"name": "get_time", "parameters": [1]}'),  # arguments not an object
        ("mistral", '[TOOL_CALLS] {"name": "get_time"}'),  # not a list
        ("pythonic", "[1, 2, 3]"),  # a list, not of calls
        ("pythonic", "[get_time(**options)]"),
        ("pythonic", "[os.system(cmd='ls')]"),  # only plain names are functions
        ("pythonic", "[get_weather(city=input())]"),  # arguments must be literals: nothing is run
        ("qwen25", "<tool_call>" + "[" * 5000),  # nested past the JSON decoder's depth
        ("llama3", '{"a": ' * 5000),
        ("pythonic", "[f(a=" + "[" * 5000 + "]" * 5000 + ")]"),  # past the Python parser's
    ],
)
def test_what_is_not_a_call_reads_as_none(parser: str, written: str) -> None:
    assert TOOL_CALL_FORMATS[parser].read(written) is None


def test_parse_takes_calls_only_when_every_one_names_a_known_tool() -> None:
    hermes = TOOL_CALL_FORMATS["hermes"]
    text = 'Sure.<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    assert hermes.parse(text, frozenset({"get_time", "get_weather"})) == ("Sure.", [("get_time", {})])
    assert hermes.parse(text, frozenset({"get_weather"})) is None
    assert hermes.parse("Sure.", frozenset({"get_time"})) is None


def test_a_stream_sends_text_up_to_a_possible_marker_and_no_further() -> None:
    hermes = TOOL_CALL_FORMATS["qwen25"]
    assert hermes.releasable("Let me check") == len("Let me check")
    assert hermes.releasable("Let me check.\n<tool") == len("Let me check.\n")  # may become a marker
    assert hermes.releasable("Let me check.\n<tox") == len("Let me check.\n<tox")  # cannot
    assert hermes.releasable('Let me check.\n<tool_call>{"name"') == len("Let me check.\n")
    # formats whose calls are the whole answer: held while the start is undecided, then all or nothing
    llama = TOOL_CALL_FORMATS["llama3"]
    assert llama.releasable("  ") == 0
    assert llama.releasable('{"name"') == 0
    assert llama.releasable("The weather") == len("The weather")
    pythonic = TOOL_CALL_FORMATS["pythonic"]
    assert pythonic.releasable("[get_") == 0 and pythonic.releasable("Sure") == 4
    mistral = TOOL_CALL_FORMATS["mistral"]
    assert mistral.releasable("[TOOL") == 0 and mistral.releasable("[x") == 2
