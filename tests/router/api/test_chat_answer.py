"""A chat choice's text as its message: thinking, answer and tool calls, whole and while it streams."""

from __future__ import annotations

import pytest

from radixcluster.router.api.chat_answer import ChatAnswerReader
from radixcluster.router.api.reasoning import REASONING_FORMATS
from radixcluster.router.api.tool_calls import ChatToolCalls, ToolIn

TOOLS = [ToolIn.model_validate({"type": "function", "function": {"name": "get_time"}})]
QWEN = ChatAnswerReader(ChatToolCalls.of(TOOLS, None, "qwen25"), REASONING_FORMATS["qwen3"])
TEXT = '<think>\nThe user wants the time.\n</think>\n\nLet me look.<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


def test_thinking_answer_and_calls_each_find_their_field() -> None:
    message = QWEN.message(TEXT)
    assert message["reasoning_content"] == "\nThe user wants the time.\n" and message["content"] == "Let me look."
    assert message["reasoning"] == message["reasoning_content"]
    assert [c["function"] for c in message["tool_calls"]] == [{"name": "get_time", "arguments": "{}"}]
    assert QWEN.finish_reason(message, {"finish_reason": "stop"}) == {"finish_reason": "tool_calls"}
    # the stop token that ended the text is not what ended the choice
    ended = QWEN.finish_reason(message, {"finish_reason": "stop", "matched_stop": 2})
    assert ended == {"finish_reason": "tool_calls", "matched_stop": None}
    plain = ChatAnswerReader(ChatToolCalls(None)).message(TEXT)
    # without parsers the text is all answer; the thinking's fields are still there, as SGLang's
    # (reasoning_content) and vLLM's (reasoning) messages have them
    assert plain == {"content": TEXT, "reasoning_content": None, "reasoning": None}
    assert QWEN.message("It is noon.") == {"content": "It is noon.", "reasoning_content": None, "reasoning": None}


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_what_a_stream_sends_adds_up_to_the_whole_message(stream_reasoning: bool) -> None:
    reader = ChatAnswerReader(QWEN.tools, QWEN.reasoning, stream_reasoning)
    whole = reader.message(TEXT)
    released = []
    for end in range(len(TEXT) + 1):
        thought, answer = reader.streamable(TEXT[:end])
        assert whole["reasoning_content"].startswith(thought) and whole["content"].startswith(answer)
        released.append(thought)
    # without streaming it, the thinking goes out once the answer has begun
    first = next(i for i, t in enumerate(released) if t)
    assert TEXT[:first].endswith("\n\nL") != stream_reasoning
