"""The Responses API's output items of a finished answer: thinking, text, then one item per call."""

from __future__ import annotations

from radixcluster.router.api.chat_answer import ChatAnswerReader
from radixcluster.router.api.generation import Generation
from radixcluster.router.api.reasoning import REASONING_FORMATS
from radixcluster.router.api.responses_output import Answer, ResponseView
from radixcluster.router.api.responses_schemas import ResponsesIn
from radixcluster.router.api.tool_calls import ChatToolCalls

BODY = ResponsesIn.model_validate(
    {"input": "Time?", "tools": [{"type": "function", "name": "get_time"}], "parallel_tool_calls": False}
)
READER = ChatAnswerReader(ChatToolCalls.of(BODY.tools, None, "hermes"), REASONING_FORMATS["qwen3"])
TEXT = '<think>Noon?</think>Let me look.<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


def finished(text: str, kind: str = "stop") -> Generation:
    return Generation(
        rid="r", text=text, finished=True, finish_reason={"type": kind}, prompt_tokens=5, completion_tokens=9
    )


def test_thinking_text_and_calls_are_items_in_that_order() -> None:
    view = ResponseView(BODY, "m", READER)
    answer = Answer.of(READER.message(TEXT), reasoning_tokens=4)
    response = view.response(finished(TEXT), answer)
    reasoning, message, call = response["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Noon?"}] and reasoning["id"].startswith("rs_")
    assert message["content"][0]["text"] == "Let me look." and message["status"] == "completed"
    assert (call["type"], call["name"], call["arguments"], call["status"]) == (
        "function_call",
        "get_time",
        "{}",
        "completed",
    )
    assert call["call_id"].startswith("call_") and call["id"] == "fc_" + call["call_id"][len("call_") :]
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 4}
    assert (response["status"], response["tool_choice"], response["parallel_tool_calls"]) == (
        "completed",
        "auto",
        False,
    )
    assert response["tools"] == [{"type": "function", "name": "get_time"}]


def test_a_message_item_holds_text_or_stands_for_an_empty_answer() -> None:
    calls_only = Answer.of(READER.message('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'), 0)
    assert "message" not in calls_only.texts and len(calls_only.calls) == 1
    assert Answer.of(READER.message(""), 0).texts == {"message": ""}
    view = ResponseView(BODY, "m", READER)
    cut = view.response(finished("<think>Hmm", "length"), Answer.of(READER.message("<think>Hmm"), 3))
    assert cut["status"] == "incomplete" and [item["type"] for item in cut["output"]] == ["reasoning"]
    assert cut["output"][0]["status"] == "incomplete"


def test_the_text_format_is_echoed_as_the_client_gave_it() -> None:
    """OpenAI's response echoes ``text.format`` whole: its name, schema, description and strict."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "A", "schema": schema, "description": "one int", "strict": True}
    body = ResponsesIn.model_validate({"input": "Hi", "text": {"format": fmt}})
    assert ResponseView(body, "m", READER).response(None)["text"] == {"format": fmt}
    plain = ResponsesIn.model_validate({"input": "Hi"})
    assert ResponseView(plain, "m", READER).response(None)["text"] == {"format": {"type": "text"}}
