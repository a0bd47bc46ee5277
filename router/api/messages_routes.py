"""Anthropic's Messages API, ``POST /v1/messages`` and ``/v1/messages/count_tokens``: a chat
under another shape (``messages_schemas``, ``messages_output``), for Anthropic's SDKs and the
tools built on them. A stream is the API's typed events; errors are Anthropic's shape."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response

from radixcluster.router.api.auth import holds_admin
from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.control_routes import count_prompt_tokens
from radixcluster.router.api.generation import Generation, collect, start_stream
from radixcluster.router.api.json_text import JsonResponse
from radixcluster.router.api.messages_output import MessageEvents, MessageView
from radixcluster.router.api.messages_schemas import MessagesChat, MessagesIn
from radixcluster.router.api.openai_routes import answer_reader, start_generations


async def _events(stream: AsyncIterator[Generation], view: MessageView) -> AsyncGenerator[dict[str, Any], None]:
    """The Messages API's stream of one answer. Text that may yet be a marker or a tool call
    is held until it is known (as a chat's stream holds it); calls go out whole."""
    # the first output comes before the first event: a request the router refuses at once is
    # then the HTTP error, and message_start knows the prompt's tokens
    first = await anext(stream)
    events = MessageEvents(view)
    for event in events.started(first):
        yield event
    gen: Generation | None = first
    while gen is not None and not gen.finished:
        thought, answer = view.reader.streamable(gen.text)
        for event in events.text("thinking", thought) + events.text("text", answer):
            yield event
        gen = await anext(stream, None)  # None: it ended unfinished (then no message end is sent)
    if gen is not None:
        for event in events.finished(gen, view.read(gen)):
            yield event


def messages_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    model = ctx.config.served_model_name

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        body = await ctx.body(request, MessagesIn)
        # cache_control is everyday use of this API: where pins are the admin's, the caller's
        # blocks are cached as any prompt is, not refused
        body._may_pin = holds_admin(ctx.config.admin_api_key, request)
        view = MessageView(body, model, answer_reader(ctx, body))
        (stream,) = start_generations(ctx, request, body, [body.chat_input()])
        if body.stream:
            return await start_stream(request, _events(stream, view), typed=True)
        (gen,) = await collect(request, [stream])
        return JsonResponse(view.message(gen, view.read(gen)))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> dict[str, int]:
        """The prompt's tokens as /v1/messages would render them (its generation prompt included)."""
        body = await ctx.body(request, MessagesChat)
        return {"input_tokens": await count_prompt_tokens(ctx, body.chat_input())}

    return router
