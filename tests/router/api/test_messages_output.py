"""The Messages API's answer: its blocks (thinking, text, one tool_use per call), its stop reason
and usage, and the events of a stream, which add up to the same message."""

from __future__ import annotations

import json

import pytest

from radixcluster.router.api.chat_answer import ChatAnswerReader
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.generation import Generation, error_frame
from radixcluster.router.api.messages_output import MessageEvents, MessageView
from radixcluster.router.api.messages_schemas import MessagesIn
from radixcluster.router.api.reasoning import REASONING_FORMATS
from radixcluster.router.api.tool_calls import ChatToolCalls

BODY = MessagesIn.model_validate(
    {
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Time?"}],
        "tools": [{"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}],
        "stop_sequences": ["END"],
    }
)
READER = ChatAnswerReader(ChatToolCalls.of(BODY.tools, None, "hermes"), REASONING_FORMATS["qwen3"])
TEXT = '<think>Noon?</think>Let me look.<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'


def generation(text: str, finished: bool = True, completion_tokens: int = 9, **reason: object) -> Generation:
    return Generation(
        rid="r",
        text=text,
        finished=finished,
        finish_reason=(reason or {"type": "stop"}) if finished else None,
        prompt_tokens=20,
        cached_tokens=12,
        completion_tokens=completion_tokens,
    )


def test_thinking_text_and_calls_are_blocks_in_that_order():
    view = MessageView(BODY, "served", READER)
    gen = generation(TEXT)
    message = view.message(gen, view.read(gen))
    thinking, text, call = message["content"]
    assert thinking == {"type": "thinking", "thinking": "Noon?", "signature": ""}
    assert text == {"type": "text", "text": "Let me look."}
    assert (call["type"], call["name"], call["input"]) == ("tool_use", "get_time", {"zone": "UTC"})
    assert call["id"].startswith("toolu_") and message["id"].startswith("msg_")
    assert (message["type"], message["role"], message["model"]) == ("message", "assistant", "served")
    assert (message["stop_reason"], message["stop_sequence"]) == ("tool_use", None)
    # the prompt's tokens read from the cache apart from the rest
    assert message["usage"] == {
        "input_tokens": 8,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 12,
        "output_tokens": 9,
    }


@pytest.mark.parametrize(
    "reason,stop_reason,stop_sequence",
    [
        ({"type": "stop", "matched": 2}, "end_turn", None),  # the EOS token
        ({"type": "stop", "matched": "END"}, "stop_sequence", "END"),
        ({"type": "length", "length": 64}, "max_tokens", None),
        # 9 tokens of the 64 asked: the context had no more room (Claude Code says so, not "resume")
        ({"type": "length", "length": 9}, "model_context_window_exceeded", None),
    ],
)
def test_the_stop_reason_says_what_ended_the_answer(reason, stop_reason, stop_sequence):
    view = MessageView(BODY, "m", READER)
    answer = view.read(generation("Plain words.", completion_tokens=reason.get("length", 9), **reason))
    assert (answer.texts, answer.stop_reason, answer.stop_sequence) == (
        {"text": "Plain words."},
        stop_reason,
        stop_sequence,
    )


def test_an_empty_answer_has_no_blocks_and_an_abort_is_an_error():
    view = MessageView(BODY.model_copy(update={"max_tokens": 0}), "m", READER)
    empty = generation("", completion_tokens=0, type="length", length=0)  # the prompt cached, nothing said
    assert view.message(empty, view.read(empty))["content"] == [] and view.read(empty).stop_reason == "max_tokens"
    with pytest.raises(ApiError, match="aborted: stopped by the admin") as raised:
        view.read(generation("Half", type="abort", message="stopped by the admin"))
    assert raised.value.status == 500


def replay(view: MessageView, texts: list[str]) -> list[dict]:
    """The events of a stream whose text grew through ``texts`` (the last one finished)."""
    events = MessageEvents(view)
    sent = events.started(generation("", finished=False))
    for text in texts[:-1]:
        thought, answer = view.reader.streamable(text)
        sent += events.text("thinking", thought) + events.text("text", answer)
    last = generation(texts[-1])
    return sent + events.finished(last, view.read(last))


def rebuilt(events: list[dict]) -> list[dict]:
    """The content an Anthropic client accumulates from ``events``."""
    blocks: list[dict] = []
    for event in events:
        if event["type"] == "content_block_start":
            assert event["index"] == len(blocks)
            blocks.append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "input_json_delta":
                block["input"] = json.loads(delta["partial_json"])
            else:
                field = "thinking" if delta["type"] == "thinking_delta" else "text"
                block[field] += delta[field]
    return blocks


def test_a_stream_opens_each_block_once_and_adds_up_to_the_message():
    view = MessageView(BODY, "m", READER)
    texts = [TEXT[:n] for n in (5, 9, 12, 22, 30, 40, 60)] + [TEXT]
    events = replay(view, texts)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    # each block stops before the next one starts
    opened = [e["type"] for e in events if e["type"] in ("content_block_start", "content_block_stop")]
    assert opened == ["content_block_start", "content_block_stop"] * 3
    final = view.message(generation(TEXT), view.read(generation(TEXT)))
    assert [{k: v for k, v in b.items() if k != "id"} for b in rebuilt(events)] == [
        {k: v for k, v in b.items() if k != "id"} for b in final["content"]
    ]
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None} and delta["usage"]["output_tokens"] == 9
    # the thinking went out as it came, before the answer began
    thinking_deltas = [e for e in events if e.get("delta", {}).get("type") == "thinking_delta"]
    assert len(thinking_deltas) > 1


def test_a_stream_of_plain_text_is_one_text_block():
    reader = ChatAnswerReader(ChatToolCalls.of(None, None, None))
    view = MessageView(BODY, "m", reader)
    events = replay(view, ["The", "The sky", "The sky is blue."])
    assert rebuilt(events) == [{"type": "text", "text": "The sky is blue."}]
    assert [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"] == ["The", " sky", " is blue."]
    silent = replay(view, [""])
    assert rebuilt(silent) == [] and [e["type"] for e in silent][-2:] == ["message_delta", "message_stop"]


def test_an_error_mid_stream_is_anthropics_error_event():
    frame = error_frame(503, "the server is shutting down", typed=True, path="/v1/messages").decode()
    assert frame.startswith("event: error\ndata: ")
    assert json.loads(frame.split("data: ", 1)[1]) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "the server is shutting down"},
    }
