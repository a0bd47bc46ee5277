"""OpenAI's Responses API, ``POST /v1/responses``: a chat under another shape (its output items:
``responses_output``). A stream is the API's typed events: created, then each item opened,
its text's deltas, the item done, and the response completed. Nothing is stored (``store`` is
accepted and has no effect)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response

from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.control_routes import count_prompt_tokens, refusable_call
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.generation import Generation, collect, start_stream
from radixcluster.router.api.json_text import JsonResponse
from radixcluster.router.api.openai_routes import answer_reader, chat_logprobs, start_generations
from radixcluster.router.api.responses_output import TEXT_PARTS, Answer, ResponseView
from radixcluster.router.api.responses_schemas import ResponsesIn


async def read_answer(ctx: ApiContext, view: ResponseView, gen: Generation) -> Answer:
    """A finished generation's items; its thinking's tokens counted by tokenizing it as written."""
    reasoning = view.reader.reasoning
    written = reasoning.written(gen.text) if reasoning is not None else ""
    counted = 0
    if written:
        tokens = await refusable_call(ctx, "tokenize", {"prompts": [written], "add_special_tokens": False})
        counted = min(len(tokens["tokens"][0]), gen.completion_tokens)
    message = view.reader.message(gen.text)
    logprobs = message_logprobs(gen, message["content"], len(written)) if view.body.wants_logprobs else []
    return Answer.of(message, counted, logprobs)


def message_logprobs(gen: Generation, content: str | None, after: int) -> list[dict[str, Any]]:
    """The logprobs of the tokens that wrote the message's text: all of them when it is the
    whole output, else those whose text starts inside it (the tokens' texts laid end to end;
    ``after``: where the thinking ended)."""
    entries = chat_logprobs(gen.output_logprobs, gen)["content"]
    if not content or content == gen.text:
        return entries if content else []
    start = gen.text.find(content, after)
    if start < 0:
        return []
    chosen, at = [], 0
    for entry in entries:
        if start <= at < start + len(content):
            chosen.append(entry)
        at += len(entry["token"])
    return chosen


def _logprobs(kind: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    """A message's text events carry its logprobs; a reasoning item's have none."""
    return {"logprobs": logprobs} if kind == "message" else {}


class ResponseEvents:
    """The stream's events, numbered, and which text items it has opened (and closed) and how
    much of each text it has sent. Each item's events run from added to done before the next
    item is added, as OpenAI's do: the reasoning ends when the message begins."""

    def __init__(self, view: ResponseView) -> None:
        self.view = view
        self.number = 0
        self.opened: list[str] = []
        self.closed: set[str] = set()
        self.texts = {kind: "" for kind in TEXT_PARTS}

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.number += 1
        return {"type": f"response.{kind}", "sequence_number": self.number - 1, **fields}

    def _where(self, kind: str) -> dict[str, Any]:
        return {"item_id": self.view.ids[kind], "output_index": self.opened.index(kind), "content_index": 0}

    def text(self, kind: str, text: str, logprobs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The item ``kind`` opened (if it was not) and what of ``text`` it has not sent, with
        the ``logprobs`` of its tokens where they are known."""
        events = []
        if kind not in self.opened:
            for earlier in [k for k in self.opened if k not in self.closed]:
                events += self.close(earlier, self.texts[earlier], "completed", [])
            self.opened.append(kind)
            item = self.view.text_item(kind, None, "in_progress")
            events.append(self.event("output_item.added", output_index=len(self.opened) - 1, item=item))
            events.append(self.event("content_part.added", **self._where(kind), part=self.view.part(kind, "")))
        sent = len(self.texts[kind])
        if len(text) > sent or logprobs:  # a stop token's logprob comes without text
            fields = _logprobs(kind, logprobs or [])
            events.append(self.event(f"{TEXT_PARTS[kind]}.delta", **self._where(kind), delta=text[sent:], **fields))
            self.texts[kind] = text
        return events

    def close(self, kind: str, text: str, status: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The done events of the text item ``kind``, whose whole text is ``text``."""
        view, fields = self.view, _logprobs(kind, logprobs)
        self.closed.add(kind)
        item = view.text_item(kind, text, status, logprobs)
        return [
            self.event(f"{TEXT_PARTS[kind]}.done", **self._where(kind), text=text, **fields),
            self.event("content_part.done", **self._where(kind), part=view.part(kind, text, logprobs)),
            self.event("output_item.done", output_index=self.opened.index(kind), item=item),
        ]

    def delta_logprobs(self, gen: Generation) -> list[dict[str, Any]]:
        """The logprobs of ``gen``'s new text, where a delta is known to be the message's new
        text (an answer streamed as it comes); else the message's end gives them all."""
        if not self.view.body.wants_logprobs or not self.view.reader.plain:
            return []
        return chat_logprobs(gen.new_output_logprobs, gen)["content"]

    def finished(self, gen: Generation, answer: Answer) -> list[dict[str, Any]]:
        """Each item ended (a call opened and ended at once), then the response's last event."""
        view, events, status = self.view, [], self.view.item_status(gen)
        for kind, text in answer.texts.items():
            if kind in self.closed:
                continue
            events += self.text(kind, text, self.delta_logprobs(gen) if kind == "message" else [])
            events += self.close(kind, text, status, answer.logprobs)
        for index, call in enumerate(answer.calls, start=len(answer.texts)):
            arguments = call["function"]["arguments"]
            where = {"item_id": view.call_id(call), "output_index": index}
            events.append(
                self.event("output_item.added", output_index=index, item=view.call_item(call, "", "in_progress"))
            )
            events.append(self.event("function_call_arguments.delta", **where, delta=arguments))
            events.append(self.event("function_call_arguments.done", **where, arguments=arguments))
            events.append(
                self.event("output_item.done", output_index=index, item=view.call_item(call, arguments, "completed"))
            )
        return [*events, self.event(view.status(gen), response=view.response(gen, answer))]


async def _events(
    ctx: ApiContext, stream: AsyncIterator[Generation], view: ResponseView
) -> AsyncGenerator[dict[str, Any], None]:
    """The Responses API's stream of one answer. Text that may yet be a marker or a tool call
    is held until it is known (as a chat's stream holds it); calls go out whole."""
    # the first output comes before the first event: a request the router refuses at once (a
    # prompt over the context, a bad grammar) is then the HTTP error, as a chat's stream is
    first = await anext(stream)
    events = ResponseEvents(view)
    yield events.event("created", response=view.response(None))
    yield events.event("in_progress", response=view.response(None))
    async for gen in _chained(first, stream):
        if gen.finished:
            for event in events.finished(gen, await read_answer(ctx, view, gen)):
                yield event
            continue
        thought, answer = view.reader.streamable(gen.text)
        for kind, text, logprobs in (("reasoning", thought, []), ("message", answer, events.delta_logprobs(gen))):
            if text or logprobs:
                for event in events.text(kind, text, logprobs):
                    yield event


async def _chained(first: Generation, rest: AsyncIterator[Generation]) -> AsyncIterator[Generation]:
    yield first
    async for gen in rest:
        yield gen


def responses_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    model = ctx.config.served_model_name

    @router.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await ctx.body(request, ResponsesIn)
        view = ResponseView(body, model, answer_reader(ctx, body))
        (stream,) = start_generations(
            ctx, request, body, [body.chat_input()], body.wants_logprobs, body.top_logprobs or 0
        )
        if body.stream:
            return await start_stream(request, _events(ctx, stream, view), typed=True)
        (gen,) = await collect(request, [stream])
        return JsonResponse(view.response(gen, await read_answer(ctx, view, gen)))

    @router.post("/v1/responses/input_tokens")
    async def input_tokens(request: Request) -> dict[str, Any]:
        """OpenAI's input token count (the SDK's ``responses.input_tokens.count``): the prompt
        /v1/responses would render from the same body."""
        body = await ctx.body(request, ResponsesIn)
        return {"object": "response.input_tokens", "input_tokens": await count_prompt_tokens(ctx, body.chat_input())}

    @router.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"])
    @router.api_route("/v1/responses/{response_id}/{action:path}", methods=["GET", "POST"])
    async def stored(response_id: str) -> Response:
        """What would read, cancel or delete a stored response (the SDK's retrieve, cancel,
        delete, input_items): nothing is stored, so there is nothing to find."""
        raise ApiError(
            404,
            f"no response {response_id!r}: this server stores no responses (store has no effect), "
            "so none can be retrieved, cancelled or deleted; send the whole conversation as input",
        )

    return router
