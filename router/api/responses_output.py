"""The response object of OpenAI's Responses API and its output items: the model's thinking (a
``reasoning`` item, with a reasoning parser), its text (a ``message``) and its calls (one
``function_call`` each), in that order."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from radixcluster.router.api.chat_answer import ChatAnswerReader
from radixcluster.router.api.generation import Generation
from radixcluster.router.api.responses_schemas import ResponsesIn

# a generation's finish -> the response's status (an abort ends it as failed)
_STATUS = {"stop": "completed", "length": "incomplete"}
# the items that carry text, in output order, and the type of their one content part (which
# names their stream's events too: response.output_text.delta, ...)
TEXT_PARTS = {"reasoning": "reasoning_text", "message": "output_text"}


@dataclass(frozen=True)
class Answer:
    """A finished generation read into its items' parts: ``texts`` by item kind (a kind left
    out has no item), the calls, and how many output tokens the thinking took."""

    texts: dict[str, str]
    calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning_tokens: int = 0
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # the message's, when asked

    @classmethod
    def of(cls, message: dict[str, Any], reasoning_tokens: int, logprobs: list[dict[str, Any]] | None = None) -> Answer:
        """From a chat message's fields: thinking and text when there was some; an empty text
        when there was nothing at all."""
        texts = {"reasoning": message["reasoning_content"]} if message.get("reasoning_content") else {}
        calls = message.get("tool_calls") or []
        if message["content"] or not (texts or calls):
            texts["message"] = message["content"] or ""
        return cls(texts, calls, reasoning_tokens, logprobs or [])


class ResponseView:
    """The response object of one request, and its items, as they stand."""

    def __init__(self, body: ResponsesIn, model: str, reader: ChatAnswerReader) -> None:
        self.body, self.model, self.reader = body, model, reader
        self.id = f"resp_{uuid.uuid4().hex}"
        self.ids = {kind: f"{prefix}_{uuid.uuid4().hex}" for kind, prefix in (("reasoning", "rs"), ("message", "msg"))}
        self.created = int(time.time())

    def status(self, gen: Generation | None) -> str:
        if gen is None or not gen.finished:
            return "in_progress"
        return _STATUS.get(gen.finish_type or "", "failed")

    def item_status(self, gen: Generation | None) -> str:
        # an item is in progress, completed or incomplete; a failed response's item is incomplete
        status = self.status(gen)
        return status if status in ("in_progress", "completed") else "incomplete"

    @staticmethod
    def part(kind: str, text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if kind == "message":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
        return {"type": TEXT_PARTS[kind], "text": text}

    def text_item(
        self, kind: str, text: str | None, status: str, logprobs: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """A reasoning or message item; ``text`` None: one just opened, without its part."""
        content = [] if text is None else [self.part(kind, text, logprobs)]
        if kind == "message":
            return {"type": "message", "id": self.ids[kind], "status": status, "role": "assistant", "content": content}
        return {"type": "reasoning", "id": self.ids[kind], "summary": [], "content": content, "status": status}

    @staticmethod
    def call_id(call: dict[str, Any]) -> str:
        """The id of a call's item (its ``call_id`` is the chat's id of the call)."""
        return "fc_" + call["id"].removeprefix("call_")

    def call_item(self, call: dict[str, Any], arguments: str, status: str) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": self.call_id(call),
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": arguments,
            "status": status,
        }

    def items(self, gen: Generation, answer: Answer) -> list[dict[str, Any]]:
        status = self.item_status(gen)
        texts = [
            self.text_item(kind, answer.texts[kind], status, answer.logprobs)
            for kind in TEXT_PARTS
            if kind in answer.texts
        ]
        calls = [self.call_item(call, call["function"]["arguments"], "completed") for call in answer.calls]
        return texts + calls

    def response(self, gen: Generation | None, answer: Answer | None = None) -> dict[str, Any]:
        """The response after ``gen`` (None: nothing yet); ``answer``: a finished one's."""
        body, status = self.body, self.status(gen)
        asked = body.text.format if body.text and body.text.format else None
        format_ = asked.model_dump(by_alias=True, exclude_none=True) if asked is not None else {"type": "text"}
        output, usage = (
            ([], None) if gen is None or answer is None else (self.items(gen, answer), self.usage(gen, answer))
        )
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "parallel_tool_calls": body.parallel_tool_calls,
            "tool_choice": self.tool_choice(),
            "tools": body.response_tools(),
            "text": {"format": format_},
            "metadata": body.metadata or {},
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": self.error(gen) if status == "failed" else None,
            "usage": usage,
        }

    def tool_choice(self) -> str | dict[str, Any]:
        choice = self.body.tool_choice
        if choice is None:
            return "auto"
        return choice if isinstance(choice, str) else {"type": "function", "name": choice.function.name}

    @staticmethod
    def error(gen: Generation | None) -> dict[str, Any]:
        reason = (gen.finish_reason if gen is not None else None) or {}
        return {"code": "server_error", "message": reason.get("message", "the generation was aborted")}

    @staticmethod
    def usage(gen: Generation, answer: Answer) -> dict[str, Any]:
        return {
            "input_tokens": gen.prompt_tokens,
            "input_tokens_details": {"cached_tokens": gen.cached_tokens},
            "output_tokens": gen.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": answer.reasoning_tokens},
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        }
