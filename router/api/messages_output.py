"""The answer of Anthropic's Messages API: a ``message`` whose content blocks are the model's
thinking (with a reasoning parser), its text and its calls (a ``tool_use`` block each), and the
events of a stream that builds it: message_start, each block's start, deltas and stop, then
message_delta (the stop reason, the usage) and message_stop."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from radixcluster.router.api.chat_answer import ChatAnswerReader
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.generation import Generation
from radixcluster.router.api.messages_schemas import MessagesIn

# a text block's kind -> its delta's type and the field that holds its text
_DELTAS = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text")}


@dataclass(frozen=True)
class MessageAnswer:
    """A finished generation read into its blocks: ``texts`` by block kind, in order (a kind
    left out has no block: an answer of no text has none, as Anthropic's), the chat's calls, and
    why it stopped."""

    texts: dict[str, str]
    calls: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = "end_turn"
    stop_sequence: str | None = None


class MessageView:
    """The message of one request, its blocks and usage."""

    def __init__(self, body: MessagesIn, model: str, reader: ChatAnswerReader) -> None:
        self.body, self.model, self.reader = body, model, reader
        self.id = f"msg_{uuid.uuid4().hex[:24]}"

    def read(self, gen: Generation) -> MessageAnswer:
        """The blocks of a finished generation; an aborted one is an error (500), there being no
        stop reason for it."""
        if gen.finish_type == "abort":
            reason = (gen.finish_reason or {}).get("message", "")
            raise ApiError(500, f"the generation was aborted: {reason}".rstrip(": "))
        message = self.reader.message(gen.text)
        texts = {"thinking": message["reasoning_content"]} if message.get("reasoning_content") else {}
        calls = message.get("tool_calls") or []
        if message["content"]:
            texts["text"] = message["content"]
        matched = (gen.finish_reason or {}).get("matched")
        if calls:
            return MessageAnswer(texts, calls, "tool_use")
        if gen.finish_type == "length":
            # short of max_tokens: the limit was lowered to the room the context left
            asked = gen.completion_tokens >= self.body.max_tokens
            return MessageAnswer(texts, calls, "max_tokens" if asked else "model_context_window_exceeded")
        if isinstance(matched, str):
            return MessageAnswer(texts, calls, "stop_sequence", matched)
        return MessageAnswer(texts, calls)

    @staticmethod
    def text_block(kind: str, text: str) -> dict[str, Any]:
        return (
            {"type": "thinking", "thinking": text, "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": text}
        )

    @staticmethod
    def tool_use(call: dict[str, Any], with_input: bool = True) -> dict[str, Any]:
        """A chat call as a ``tool_use`` block (its input left empty: one a stream opens)."""
        function = call["function"]
        arguments = json.loads(function["arguments"]) if with_input else {}
        return {
            "type": "tool_use",
            "id": "toolu_" + call["id"].removeprefix("call_"),
            "name": function["name"],
            "input": arguments,
        }

    def usage(self, gen: Generation) -> dict[str, int]:
        """Anthropic's counts: the prompt's tokens read from the cache apart from the rest (what
        the radix tree held is a cache read; nothing is billed for writing it, so no creation)."""
        return {
            "input_tokens": gen.prompt_tokens - gen.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": gen.cached_tokens,
            "output_tokens": gen.completion_tokens,
        }

    def message(self, gen: Generation, answer: MessageAnswer | None) -> dict[str, Any]:
        """The message after ``gen``; ``answer`` None: one just started, with no content yet."""
        content = [] if answer is None else [self.text_block(k, t) for k, t in answer.texts.items()]
        content += [self.tool_use(call) for call in answer.calls] if answer is not None else []
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": None if answer is None else answer.stop_reason,
            "stop_sequence": None if answer is None else answer.stop_sequence,
            "usage": self.usage(gen) if answer is not None else {**self.usage(gen), "output_tokens": 0},
        }


class MessageEvents:
    """A stream's events: which blocks it has opened (the last one still open) and how much
    of each text it has sent."""

    def __init__(self, view: MessageView) -> None:
        self.view = view
        self.opened: list[str] = []
        self.open = False
        self.sent = dict.fromkeys(_DELTAS, 0)

    def started(self, gen: Generation) -> list[dict[str, Any]]:
        return [{"type": "message_start", "message": self.view.message(gen, None)}, {"type": "ping"}]

    def _stop(self) -> list[dict[str, Any]]:
        if not self.open:
            return []
        self.open = False
        return [{"type": "content_block_stop", "index": len(self.opened) - 1}]

    def _start(self, block: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        events = self._stop()
        self.opened.append(kind)
        self.open = True
        return [*events, {"type": "content_block_start", "index": len(self.opened) - 1, "content_block": block}]

    def text(self, kind: str, text: str) -> list[dict[str, Any]]:
        """The block ``kind`` opened (closing the one before) if it was not, and what of
        ``text`` it has not sent."""
        if len(text) <= self.sent[kind]:
            return []
        events = [] if kind in self.opened else self._start(self.view.text_block(kind, ""), kind)
        delta_type, name = _DELTAS[kind]
        delta = {"type": delta_type, name: text[self.sent[kind] :]}
        self.sent[kind] = len(text)
        return [*events, {"type": "content_block_delta", "index": self.opened.index(kind), "delta": delta}]

    def finished(self, gen: Generation, answer: MessageAnswer) -> list[dict[str, Any]]:
        """The texts' rest, each call as a block of its own, then the message's end."""
        events = []
        for kind, text in answer.texts.items():
            events += self.text(kind, text)
        for call in answer.calls:
            events += self._start(self.view.tool_use(call, with_input=False), "tool_use")
            delta = {"type": "input_json_delta", "partial_json": call["function"]["arguments"]}
            events.append({"type": "content_block_delta", "index": len(self.opened) - 1, "delta": delta})
        events += self._stop()
        stop = {"stop_reason": answer.stop_reason, "stop_sequence": answer.stop_sequence}
        return [
            *events,
            {"type": "message_delta", "delta": stop, "usage": self.view.usage(gen)},
            {"type": "message_stop"},
        ]
