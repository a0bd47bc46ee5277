"""The Responses API's stream: each item opened before its deltas and closed once, before the next
is added, at the index it has in the finished response, the deltas adding up to its text."""

from __future__ import annotations

from collections import defaultdict

import pytest

from radixcluster.router.api.chat_answer import ChatAnswerReader
from radixcluster.router.api.generation import Generation
from radixcluster.router.api.reasoning import REASONING_FORMATS
from radixcluster.router.api.responses_output import Answer, ResponseView
from radixcluster.router.api.responses_routes import ResponseEvents, message_logprobs
from radixcluster.router.api.responses_schemas import ResponsesIn
from radixcluster.router.api.tool_calls import ChatToolCalls

BODY = ResponsesIn.model_validate({"input": "Time?", "tools": [{"type": "function", "name": "get_time"}]})
CALL = '<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>'


def stream_events(reader: ChatAnswerReader, text: str) -> tuple[list[dict], dict]:
    """The events of ``text`` streamed a character at a time, and the finished response."""
    view = ResponseView(BODY, "m", reader)
    events = ResponseEvents(view)
    sent = []
    for end in range(1, len(text)):
        thought, answer = reader.streamable(text[:end])
        for kind, part in (("reasoning", thought), ("message", answer)):
            if part:
                sent += events.text(kind, part)
    gen = Generation(rid="r", text=text, finished=True, finish_reason={"type": "stop"}, completion_tokens=30)
    sent += events.finished(gen, Answer.of(reader.message(text), 0))
    return sent, sent[-1]["response"]


@pytest.mark.parametrize(
    "thinking, tools, text",
    [
        (None, None, "It is noon."),
        ("qwen3", "hermes", "<think>Noon?</think>Let me look." + CALL),
        ("qwen3", "hermes", CALL),
        ("deepseek-r1", None, "Noon?</think>"),
        ("qwen3", None, ""),
    ],
)
def test_each_item_opens_streams_and_closes_where_the_response_lists_it(thinking, tools, text) -> None:
    reader = ChatAnswerReader(
        ChatToolCalls.of(BODY.tools, "auto" if tools else "none", tools),
        REASONING_FORMATS[thinking] if thinking else None,
    )
    events, response = stream_events(reader, text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert (
        [e["output_index"] for e in added] == [e["output_index"] for e in done] == list(range(len(response["output"])))
    )
    assert [e["item"]["id"] for e in added] == [e["item"]["id"] for e in done] == [i["id"] for i in response["output"]]
    assert [e["item"] for e in done] == response["output"]
    # each item ends before the next one is added (the reasoning before the message begins)
    lifecycle = [(e["type"], e["output_index"]) for e in added + done]
    in_order = [(e["type"], e["output_index"]) for e in events if e["type"].startswith("response.output_item.")]
    assert in_order == sorted(lifecycle, key=lambda pair: (pair[1], pair[0] == "response.output_item.done"))
    deltas: dict[int, str] = defaultdict(str)
    for event in events:
        if event["type"].endswith(".delta"):
            deltas[event["output_index"]] += event["delta"]
    for index, item in enumerate(response["output"]):
        whole = item["arguments"] if item["type"] == "function_call" else item["content"][0]["text"]
        assert deltas[index] == whole


def generation_of(tokens: list[str]) -> Generation:
    """A finished generation of ``tokens`` (ids 0, 1, ...), each with its logprob."""
    texts = dict(enumerate(tokens))
    entries = [[-0.1 * i, i, []] for i in range(len(tokens))]
    return Generation(
        rid="r",
        text="".join(tokens),
        finished=True,
        finish_reason={"type": "stop"},
        token_texts=texts,
        all_output_logprobs=entries,
        num_output_logprobs=len(entries),
    )


def test_the_messages_logprobs_are_those_of_the_tokens_that_wrote_it() -> None:
    plain = generation_of(["It", " is", " noon", "."])
    assert [e["token"] for e in message_logprobs(plain, "It is noon.", 0)] == ["It", " is", " noon", "."]
    split = generation_of(
        [
            "<think>",
            "Hm",
            "</think>",
            "\n\n",
            "Let",
            " me",
            " look",
            ".",
            "<tool_call>",
            '{"name": "get_time", "arguments": {}}',
            "</tool_call>",
        ]
    )
    reader = ChatAnswerReader(ChatToolCalls.of(BODY.tools, "auto", "hermes"), REASONING_FORMATS["qwen3"])
    content = reader.message(split.text)["content"]
    assert content == "Let me look."
    chosen = message_logprobs(split, content, len(REASONING_FORMATS["qwen3"].written(split.text)))
    assert [e["token"] for e in chosen] == ["Let", " me", " look", "."]
    assert chosen[0]["logprob"] == pytest.approx(-0.4) and chosen[0]["bytes"] == list(b"Let")
    assert message_logprobs(split, None, 0) == []
