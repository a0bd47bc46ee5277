"""What a chat choice's text becomes in its message: the model's thinking (``reasoning_content``,
with a reasoning parser), its answer (``content``) and the tool calls it made (``tool_calls``),
whole when it ends and, while it streams, the parts already known."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixcluster.router.api.reasoning import ReasoningFormat
from radixcluster.router.api.tool_calls import ChatToolCalls


@dataclass(frozen=True)
class ChatAnswerReader:
    tools: ChatToolCalls
    reasoning: ReasoningFormat | None = None  # None: the text is all answer
    stream_reasoning: bool = True  # SGLang's: False sends the thinking whole once it has ended

    @property
    def plain(self) -> bool:
        """The answer is the text as it comes: nothing held, nothing split off."""
        return self.reasoning is None and self.tools.format is None and not self.tools.forced

    def message(self, text: str) -> dict[str, Any]:
        """A finished choice's message fields."""
        thought, answer = self.reasoning.split(text) if self.reasoning is not None else (None, text)
        content, calls = self.tools.answer(answer)
        # the thinking under both its names, null when there is none: SGLang's reasoning_content
        # and vLLM's newer reasoning; clients read them off every message (the OpenAI SDK raises
        # on an absent extra field)
        message: dict[str, Any] = {
            "content": content,
            "reasoning_content": thought or None,
            "reasoning": thought or None,
        }
        if calls is not None:
            message["tool_calls"] = calls
        return message

    def streamable(self, text: str) -> tuple[str, str]:
        """The thinking and the answer of a growing text that a stream may send now: neither
        an end that may yet be a marker nor what may be a tool call."""
        if self.reasoning is None:
            thought, answer = "", text
        else:
            thought, answer = self.reasoning.split(text, final=False)
            if not self.stream_reasoning and not answer:
                thought = ""  # it has not ended yet
        return thought, answer[: self.tools.releasable(answer)]

    def finish_reason(self, message: dict[str, Any], ended: dict[str, Any]) -> dict[str, Any]:
        """Tool calls end a choice with "tool_calls" (and no ``matched_stop``, as SGLang's), but
        a named function's with "stop", as OpenAI answers them."""
        if "tool_calls" in message and self.tools.choice in ("required", "auto"):
            return {**ended, "finish_reason": "tool_calls"} | (
                {"matched_stop": None} if "matched_stop" in ended else {}
            )
        return ended
