"""OpenAI's Responses API, ``POST /v1/responses``: a chat under another shape. The answer is one
``message`` output item; a stream is the API's typed events (created, the text's deltas, the
finished item, completed). Nothing is stored (``store`` is accepted and has no effect)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.errors import read_json
from radixcluster.router.api.generation import Generation, collect, start_stream
from radixcluster.router.api.openai_routes import start_generations
from radixcluster.router.api.responses_schemas import ResponsesIn

# a generation's finish -> the response's status (an abort ends it as failed)
_STATUS = {"stop": "completed", "length": "incomplete"}


class ResponseView:
    """The response object of one request, as it stands after ``gen`` (None: nothing yet)."""

    def __init__(self, body: ResponsesIn, model: str) -> None:
        self.body, self.model = body, model
        self.id, self.item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())

    def status(self, gen: Generation | None) -> str:
        if gen is None or not gen.finished:
            return "in_progress"
        return _STATUS.get(gen.finish_type or "", "failed")

    @staticmethod
    def part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def item(self, gen: Generation | None) -> dict[str, Any]:
        status = self.status(gen)
        content = [self.part(gen.text)] if gen is not None and gen.finished else []
        # an item is incomplete or completed; a failed response's item is incomplete
        item_status = status if status in ("in_progress", "completed") else "incomplete"
        return {"type": "message", "id": self.item_id, "status": item_status, "role": "assistant", "content": content}

    def response(self, gen: Generation | None) -> dict[str, Any]:
        body, status = self.body, self.status(gen)
        format_ = body.text.format.model_dump(by_alias=True) if body.text and body.text.format else {"type": "text"}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": [self.item(gen)] if gen is not None and gen.finished else [],
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": format_},
            "metadata": body.metadata or {},
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": self.error(gen) if status == "failed" else None,
            "usage": self.usage(gen) if gen is not None and gen.finished else None,
        }

    @staticmethod
    def error(gen: Generation | None) -> dict[str, Any]:
        reason = (gen.finish_reason if gen is not None else None) or {}
        return {"code": "server_error", "message": reason.get("message", "the generation was aborted")}

    @staticmethod
    def usage(gen: Generation) -> dict[str, Any]:
        return {
            "input_tokens": gen.prompt_tokens,
            "input_tokens_details": {"cached_tokens": gen.cached_tokens},
            "output_tokens": gen.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        }


async def _events(stream: AsyncIterator[Generation], view: ResponseView) -> AsyncGenerator[dict[str, Any], None]:
    """The Responses API's stream of one message, each event numbered."""
    where = {"item_id": view.item_id, "output_index": 0, "content_index": 0}
    number = 0

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal number
        number += 1
        return {"type": f"response.{kind}", "sequence_number": number - 1, **fields}

    # the first output comes before the first event: a request the router refuses at once (a
    # prompt over the context, a bad grammar) is then the HTTP error, as a chat's stream is
    first = await anext(stream)
    yield event("created", response=view.response(None))
    yield event("in_progress", response=view.response(None))
    yield event("output_item.added", output_index=0, item=view.item(None))
    yield event("content_part.added", **where, part=view.part(""))
    async for gen in _chained(first, stream):
        if gen.new_text:
            yield event("output_text.delta", **where, delta=gen.new_text, logprobs=[])
        if gen.finished:
            yield event("output_text.done", **where, text=gen.text, logprobs=[])
            yield event("content_part.done", **where, part=view.part(gen.text))
            yield event("output_item.done", output_index=0, item=view.item(gen))
            yield event(view.status(gen), response=view.response(gen))


async def _chained(first: Generation, rest: AsyncIterator[Generation]) -> AsyncIterator[Generation]:
    yield first
    async for gen in rest:
        yield gen


def responses_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    model = ctx.config.served_model_name

    @router.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = ResponsesIn.model_validate(await read_json(request, ctx.config.max_body_bytes))
        (stream,) = start_generations(ctx, request, body, [{"messages": body.messages()}])
        view = ResponseView(body, model)
        if body.stream:
            return await start_stream(request, _events(stream, view), typed=True)
        (gen,) = await collect(request, [stream])
        return JSONResponse(view.response(gen))

    return router
