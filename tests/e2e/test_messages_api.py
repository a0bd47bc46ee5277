"""Anthropic's Messages API through the official `anthropic` SDK against a real `radixcluster up`:
a message answers as the chat does, a stream adds up to it, count_tokens counts what it reads,
tool use goes round, a prefill is continued, the cache's reads are reported, and errors come in
Anthropic's shape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import anthropic
import openai
import pytest
import requests

from support.api_helpers import TIMEOUT_S, post
from support.servers import ServerHandle, launch_server

pytestmark = pytest.mark.slow

# the SDK no longer has a temperature argument (Anthropic's newer models take none); older
# clients send it, and the server reads it as the chat does
GREEDY = {"extra_body": {"temperature": 0.0}}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SYSTEM = "You are a meticulous assistant for a travel agency. Answer briefly and precisely. " * 10
WEATHER = {
    "name": "get_weather",
    "description": "The current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=server.api_key or "none", timeout=TIMEOUT_S, max_retries=0)


@pytest.fixture(scope="module")
def chat(server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.url + "/v1", api_key=server.api_key or "none", timeout=TIMEOUT_S, max_retries=0
    )


def prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def test_a_message_answers_as_the_chat_does(client, chat):
    message = client.messages.create(model="any", max_tokens=24, system=SYSTEM, messages=QUESTION, **GREEDY)
    completion = chat.chat.completions.create(
        model="any",
        messages=[{"role": "system", "content": SYSTEM}, *QUESTION],
        max_tokens=24,
        temperature=0,
    )
    (block,) = message.content
    assert block.type == "text" and block.text == completion.choices[0].message.content
    reasons = {"stop": "end_turn", "length": "max_tokens"}
    assert message.stop_reason == reasons[completion.choices[0].finish_reason] and message.stop_sequence is None
    assert (message.type, message.role) == ("message", "assistant") and message.id.startswith("msg_")
    assert prompt_tokens(message.usage) == completion.usage.prompt_tokens
    assert message.usage.output_tokens == completion.usage.completion_tokens
    # the second time, the system prompt and question come from the radix cache
    again = client.messages.create(model="any", max_tokens=1, system=SYSTEM, messages=QUESTION, **GREEDY)
    assert again.usage.cache_read_input_tokens == prompt_tokens(again.usage) - 1 and again.usage.input_tokens == 1


def test_a_stream_adds_up_to_the_whole_message(client):
    ask = {"model": "any", "max_tokens": 32, "system": SYSTEM, "messages": QUESTION, **GREEDY}
    whole = client.messages.create(**ask)
    with client.messages.stream(**ask) as stream:
        pieces = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == whole.content[0].text == streamed.content[0].text
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    assert prompt_tokens(streamed.usage) == prompt_tokens(whole.usage)
    with client.messages.stream(**ask) as stream:
        kinds = [event.type for event in stream]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_the_raw_stream_is_anthropics_named_events(server):
    body = {"model": "any", "max_tokens": 4, "messages": QUESTION, "stream": True, "temperature": 0}
    with post(server, "/v1/messages", body, stream=True) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
    assert "data: [DONE]" not in lines and len(names) == len([line for line in lines if line.startswith("data: ")])


def test_count_tokens_counts_what_the_message_reads(client):
    ask = {
        "model": "any",
        "system": SYSTEM,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [*QUESTION, {"role": "assistant", "content": "The capital"}],
    }
    counted = client.messages.count_tokens(**ask).input_tokens
    message = client.messages.create(**ask, max_tokens=1)
    assert counted == prompt_tokens(message.usage) > 100


def test_a_forced_tool_use_goes_round_with_its_result(client):
    ask = {"model": "any", "max_tokens": 64, "tools": [WEATHER], **GREEDY}
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = client.messages.create(**ask, messages=asked, tool_choice={"type": "tool", "name": "get_weather"})
    (use,) = called.content
    assert (use.type, use.name, called.stop_reason) == ("tool_use", "get_weather", "tool_use")
    assert set(use.input) == {"city"} and use.id.startswith("toolu_")
    with client.messages.stream(
        **ask, messages=asked, tool_choice={"type": "any", "disable_parallel_tool_use": True}
    ) as stream:
        streamed = stream.get_final_message()
    (streamed_use,) = streamed.content
    assert streamed_use.type == "tool_use" and streamed_use.input == use.input
    answered = [
        *asked,
        {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees, sunny"}]},
    ]
    reply = client.messages.create(**ask, messages=answered, tool_choice={"type": "none"})
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text
    with pytest.raises(anthropic.BadRequestError, match="needs the server started with --tool-call-parser"):
        client.messages.create(**ask, messages=asked)  # "auto" by default: no parser here


def test_a_prefill_is_continued_and_a_stop_sequence_named(client, chat):
    prefilled = [*QUESTION, {"role": "assistant", "content": "The capital of France is"}]
    message = client.messages.create(model="any", max_tokens=8, messages=prefilled, **GREEDY)
    continued = chat.chat.completions.create(
        model="any",
        messages=prefilled,
        max_tokens=8,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    text = message.content[0].text
    assert text == continued.choices[0].message.content and text.strip()
    word = text.split()[0]
    stopped = client.messages.create(model="any", max_tokens=8, messages=prefilled, stop_sequences=[word], **GREEDY)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert word not in stopped.content[0].text


def test_errors_come_in_anthropics_shape(server, client):
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model="any",
            max_tokens=4,
            messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}
            ],
        )
    assert raised.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "messages.0.content: content blocks of type 'image' are not supported: the served model "
            "reads text; blocks of type text, tool_use, tool_result, thinking, redacted_thinking are",
        },
    }
    missing = post(server, "/v1/messages", {"model": "any", "messages": QUESTION})
    assert missing.status_code == 400 and missing.json()["error"]["message"] == "max_tokens: Field required"
    # a prompt over the context is refused in Anthropic's words, which Claude Code reads to compact
    too_long = post(
        server,
        "/v1/messages",
        {"model": "any", "max_tokens": 1, "messages": [{"role": "user", "content": "word " * 9000}]},
    )
    assert too_long.status_code == 400 and too_long.json()["error"]["type"] == "invalid_request_error"
    counts = re.match(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", too_long.json()["error"]["message"])
    assert counts is not None and int(counts[1]) > int(counts[2]) == 8191
    unknown = post(server, "/v1/messages/batches", {})
    assert unknown.status_code == 404 and unknown.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "POST /v1/messages/batches: no such endpoint on this server"},
    }
    wrong_method = requests.get(server.url + "/v1/messages", headers=server.headers(), timeout=TIMEOUT_S)
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
    # the chat's errors keep OpenAI's shape
    assert "type" not in post(server, "/v1/chat/completions", {"messages": []}).json()


def test_max_tokens_past_the_context_gives_way_to_the_room_the_prompt_leaves(client):
    """Anthropic's clients ask their models' whole output (Claude Code: 32,000 tokens, 4x this
    model's context): the limit is lowered to what the context leaves, not refused."""
    message = client.messages.create(model="any", max_tokens=10**6, messages=QUESTION, **GREEDY)
    assert message.stop_reason == "end_turn" and message.content[0].text


def test_max_tokens_0_warms_the_cache_and_answers_nothing(client):
    system = "You plan walking tours of Norwegian fjords; be concrete about distances. " * 6
    warmed = client.messages.create(model="any", max_tokens=0, system=system, messages=QUESTION)
    assert (warmed.content, warmed.stop_reason, warmed.usage.output_tokens) == ([], "max_tokens", 0)
    assert warmed.usage.cache_read_input_tokens < 8  # at most the template's opening, which every chat has
    asked = client.messages.create(model="any", max_tokens=1, system=system, messages=QUESTION)
    assert asked.usage.cache_read_input_tokens == prompt_tokens(warmed.usage) - 1


# the first request of Claude Code 2.1.197 (`claude -p "Say hi"`), its texts and tools shortened:
# billing header, cache_control on system and user blocks, a system message mid-conversation,
# adaptive thinking, context_management, output_config's effort, metadata, 32,000 max_tokens
CLAUDE_CODE_REQUEST = {
    "model": "claude-sonnet-4-6",
    "max_tokens": 32000,
    "stream": True,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.123; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
        {
            "type": "text",
            "text": "You help users with software engineering tasks.",
            "cache_control": {"type": "ephemeral"},
        },
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>\nToday's date is 2026-12-06.\n</system-reminder>\n"},
                {"type": "text", "text": "Say hi", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {"role": "system", "content": "Available agent types for the Agent tool:\n- Explore: read-only search"},
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Executes a given bash command.",
            "input_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"command": {"description": "The command to execute", "type": "string"}},
                "required": ["command"],
                "additionalProperties": False,
            },
        }
    ],
    "metadata": {"user_id": json.dumps({"device_id": "0" * 64, "account_uuid": "", "session_id": "s"})},
    "thinking": {"type": "adaptive"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
}
SMALL_CONTEXT = 320
CLAUDE_CODE_HEADERS = {
    "x-api-key": "none",
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
}


@pytest.fixture(scope="module")
def parsing_server() -> Iterator[ServerHandle]:
    """A server that reads the model's own tool calls, as a tool-using agent needs; its context
    small, so that an answer meets it soon."""
    with launch_server("--tool-call-parser", "hermes", "--context-length", str(SMALL_CONTEXT)) as handle:
        yield handle


def test_a_claude_code_request_streams_its_answer(parsing_server, server):
    # 48 tokens, not 32,000 (lowered to the context's room: minutes of a 135M model's rambling;
    # the lowering is tested above)
    body = {**CLAUDE_CODE_REQUEST, "max_tokens": 48}
    url = parsing_server.url + "/v1/messages?beta=true"
    with requests.post(url, json=body, headers=CLAUDE_CODE_HEADERS, stream=True, timeout=TIMEOUT_S) as resp:
        assert resp.status_code == 200, resp.text
        frames = [json.loads(line[6:]) for line in resp.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert frames[0]["type"] == "message_start" and frames[-1]["type"] == "message_stop"
    text = "".join(f["delta"].get("text", "") for f in frames if f["type"] == "content_block_delta")
    ended = frames[-2]
    assert text and ended["delta"]["stop_reason"] in ("end_turn", "max_tokens")
    assert 0 < ended["usage"]["output_tokens"] <= 48
    # without --tool-call-parser, the model's calls cannot be read: refused in this API's names
    refused = requests.post(server.url + "/v1/messages", json=body, headers=CLAUDE_CODE_HEADERS, timeout=TIMEOUT_S)
    assert refused.status_code == 400 and '{"type": "any"}' in refused.json()["error"]["message"]


def test_the_model_list_reads_as_anthropics_too(client, chat):
    """/v1/models carries Anthropic's card fields beside OpenAI's, for its SDK's models calls."""
    (card,) = client.models.list().data
    assert card.id == chat.models.list().data[0].id and card.type == "model"
    assert card.display_name == card.id and card.created_at.year >= 2026 and card.lifecycle == "active"
    assert client.models.retrieve(card.id).max_input_tokens == 8191
    with pytest.raises(anthropic.NotFoundError):
        client.models.retrieve("claude-opus-4-5")


def test_an_answer_the_context_stops_says_so(parsing_server):
    """32,000 tokens asked of a 320-token context: the answer runs to the context's end and its
    stop reason is Anthropic's model_context_window_exceeded, not max_tokens."""
    body = {**CLAUDE_CODE_REQUEST, "stream": False, "ignore_eos": True}
    resp = requests.post(parsing_server.url + "/v1/messages", json=body, headers=CLAUDE_CODE_HEADERS, timeout=TIMEOUT_S)
    assert resp.status_code == 200, resp.text
    message = resp.json()
    usage = message["usage"]
    assert message["stop_reason"] == "model_context_window_exceeded"
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["output_tokens"] == SMALL_CONTEXT
