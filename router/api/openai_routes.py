"""OpenAI-compatible routes: /v1/models, /v1/completions and /v1/chat/completions.

Logprob entries name each token by its own text, which the router sends with the logprobs
(``return_text_in_logprobs``), as vLLM and SGLang name them.
"""

from __future__ import annotations

import codecs
import itertools
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Request, Response

from radixcluster.protocol import GenerateRequest
from radixcluster.router.api.auth import admin_check
from radixcluster.router.api.chat_answer import ChatAnswerReader
from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.control_routes import refusable_call
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.gateway_tokens import prompt_tokens
from radixcluster.router.api.generation import (
    Generation,
    collect,
    deadline_of,
    merge,
    run_generation,
    start_stream,
)
from radixcluster.router.api.json_text import JsonResponse
from radixcluster.router.api.native_schemas import cache_namespace, derive_rids, nth_sample
from radixcluster.router.api.openai_schemas import ChatCompletionIn, CompletionIn, OpenAIRequest, ToolsRequest
from radixcluster.router.api.reasoning import REASONING_FORMATS, grammar_gate
from radixcluster.router.api.tool_calls import ChatToolCalls

_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort"}
_UNFINISHED = {"finish_reason": None, "matched_stop": None, "stop_reason": None}


def finish(gen: Generation) -> dict[str, Any]:
    """A choice's ``finish_reason``; as SGLang gives it, ``matched_stop``: the stop string or
    token id that ended it (the EOS token's too; None otherwise); and as vLLM gives it,
    ``stop_reason``: the stop string or one of the request's ``stop_token_ids`` (None at EOS)."""
    kind = gen.finish_type
    if not gen.finished or kind is None:
        return _UNFINISHED
    matched = gen.finish_reason.get("matched") if kind == "stop" and gen.finish_reason else None
    stop_reason = matched if isinstance(matched, str) or matched in gen.stop_token_ids else None
    return {"finish_reason": _FINISH_REASONS.get(kind, kind), "matched_stop": matched, "stop_reason": stop_reason}


def chat_answer(gen: Generation, reader: ChatAnswerReader) -> tuple[dict[str, Any], dict[str, Any]]:
    """A finished chat choice's message fields and finish fields."""
    message = reader.message(gen.text)
    return message, reader.finish_reason(message, finish(gen))


def usage(gens: list[Generation], body: OpenAIRequest) -> dict[str, Any]:
    """Token counts of a response; a prompt sampled ``n`` times counts once. With
    ``cache_control``, ``pinned_tokens``: the longest prefix its pins hold."""
    firsts = gens[:: body.n]
    prompt = sum(g.prompt_tokens for g in firsts)
    completion = sum(g.completion_tokens for g in gens)
    details = {"cached_tokens": sum(g.cached_tokens for g in firsts)}
    if body.pins():
        details["pinned_tokens"] = max(g.pinned_tokens for g in gens)
    return {**token_counts(prompt, completion), "prompt_tokens_details": details}


def token_counts(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def running_usage(gen: Generation, body: OpenAIRequest, opening: bool = False) -> dict[str, Any]:
    """vLLM's ``stream_options.continuous_usage_stats``: every chunk of a choice carries its
    counts so far (nothing without it); a chat's ``opening`` chunk (the role) counts no tokens."""
    if not body.continuous_usage:
        return {}
    return {"usage": token_counts(gen.prompt_tokens, 0 if opening else gen.completion_tokens)}


class SentIds:
    """vLLM's ``return_token_ids`` in a stream: each choice's output ids not sent yet go with
    its next chunk, and its first chunk carries the prompt's ids too."""

    def __init__(self, body: OpenAIRequest, choices: int) -> None:
        self.on = body.return_token_ids
        self.sent: list[int | None] = [None] * choices  # None: nothing sent yet

    def take(self, gen: Generation, index: int) -> tuple[list[int] | None, list[int]]:
        """The prompt's ids (None after the choice's first chunk) and the output ids not sent yet."""
        sent = self.sent[index]
        self.sent[index] = gen.num_output_ids
        return (gen.prompt_ids if sent is None else None), gen.output_ids[sent or 0 :]


class CompletionLogprobs:
    """OpenAI's completion logprobs of one choice, rendered a run of entries (``[logprob, id,
    tops]``) at a time. As vLLM names them, the chosen tokens' strings join into the text: a
    token that is part of a character is ``""`` and the one that completes it holds it all
    (alone, each would be U+FFFD); ``text_offset`` counts those strings from the first entry."""

    def __init__(self) -> None:
        self._bytes = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._offset = 0

    def render(self, entries: list[list[Any]], gen: Generation) -> dict[str, Any]:
        tokens = [self._string(tid, gen) for _, tid, _ in entries]
        if gen.finished and tokens:
            tokens[-1] += self._held()  # a last character the limit cut: U+FFFD, as in the text
        offsets = list(itertools.accumulate((len(t) for t in tokens), initial=self._offset))
        self._offset = offsets.pop()

        def top(logprob: float, token: str, tops: list[list[Any]] | None) -> dict[str, float] | None:
            if tops is None:
                return None
            # OpenAI's legacy completions always list the chosen token too (up to logprobs + 1
            # entries, as vLLM gives them), under its own string, which no alternative's displaces
            return {**{gen.token_texts[t]: tlp for tlp, t in tops}, token: logprob}

        return {
            "tokens": tokens,
            "token_logprobs": [lp for lp, _, _ in entries],
            "top_logprobs": [top(lp, token, tops) for (lp, _, tops), token in zip(entries, tokens)],
            "text_offset": offsets,
        }

    def _string(self, tid: int, gen: Generation) -> str:
        raw = gen.partial_bytes.get(tid)
        if raw is not None:
            return self._bytes.decode(bytes(raw))
        return self._held() + gen.token_texts[tid]

    def _held(self) -> str:
        """U+FFFD for the bytes of a character that was never completed, else nothing."""
        held = self._bytes.decode(b"", final=True)
        self._bytes.reset()
        return held


def prompt_entries(gen: Generation) -> list[list[Any]]:
    """The prompt's logprobs as entries like the output's, ``[logprob, id, tops]``; the first
    token, which nothing scored, has None for both (as vLLM echoes it)."""
    tops = gen.input_top_logprobs or [None] * len(gen.input_logprobs)  # empty without top_logprobs
    return [[lp, tid, None if lp is None else top or []] for (lp, tid), top in zip(gen.input_logprobs, tops)]


def chat_logprobs(entries: list[list[Any]], gen: Generation) -> dict[str, Any]:
    """OpenAI's chat logprobs of ``entries``; a token that holds part of a character has the text
    U+FFFD (as SGLang and vLLM decode it) and its own bytes, which combine into the character."""

    def token(tid: int, logprob: float) -> dict[str, Any]:
        text = gen.token_texts[tid]
        raw = gen.partial_bytes.get(tid)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode()) if raw is None else raw}

    return {
        "content": [{**token(tid, lp), "top_logprobs": [token(t, tlp) for tlp, t in tops]} for lp, tid, tops in entries]
    }


def _requests(
    body: OpenAIRequest,
    inputs: list[dict[str, Any]],
    return_logprob: bool,
    top_logprobs: int,
    prompt_logprobs: bool,
    reasoning_parser: str | None,
) -> list[GenerateRequest]:
    """``n`` requests per input, input-major, with distinct ids; ``prompt_logprobs``: the
    prompts' tokens scored too. A chat's grammar holds after its thinking, if it thinks."""
    sampling = body.protocol_sampling()
    per_input = []
    for i in inputs:
        after, start = (
            grammar_gate(reasoning_parser, i.get("chat_template_kwargs")) if "messages" in i else (None, None)
        )
        per_input.append(replace(sampling, grammar_after=after, thinking_start=start))
    rids = derive_rids(body.rid, len(inputs) * body.n)
    return [
        GenerateRequest(
            rid=rid,
            sampling=nth_sample(per_input[k // body.n], k % body.n),
            stream=body.stream,
            return_logprob=return_logprob,
            return_text_in_logprobs=return_logprob,
            return_prompt_ids=body.return_token_ids,
            top_logprobs_num=top_logprobs,
            logprob_start_len=0 if prompt_logprobs else -1,
            cache_salt=cache_namespace(body.cache_salt, body.extra_key),
            pins=body.pins(),
            tokens=prompt_tokens(body.gateway_tokens, k // body.n),
            truncate_prompt_tokens=body.truncate_prompt_tokens,
            **inputs[k // body.n],
        )
        for k, rid in enumerate(rids)
    ]


def _head(kind: str, prefix: str, model: str) -> dict[str, Any]:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}


def _echoed(gen: Generation, body: CompletionIn, echoes: list[str] | None, index: int) -> tuple[str, list[list[Any]]]:
    """What ``echo`` puts before choice ``index``'s output: its prompt's text and, with
    logprobs, the prompt's entries (nothing without ``echo``)."""
    if echoes is None:
        return "", []
    return echoes[index // body.n], prompt_entries(gen) if body.prompt_logprobs else []


async def _echo_texts(ctx: ApiContext, body: CompletionIn) -> list[str] | None:
    """Each prompt's text for ``echo`` (None without it): a text as given, token ids read back
    by the tokenizer."""
    if not body.echo:
        return None
    prompts = body.prompts()
    if all(isinstance(p, str) for p in prompts):
        return [str(p) for p in prompts]
    # as vLLM echoes them, special tokens included: the prompt's logprobs name them too
    return (await refusable_call(ctx, "detokenize", {"tokens": prompts, "skip_special_tokens": False}))["texts"]


async def _completion_chunks(
    streams: list[AsyncIterator[Generation]], body: CompletionIn, head: dict[str, Any], echoes: list[str] | None
) -> AsyncGenerator[dict[str, Any], None]:
    latest: list[Generation] = [None] * len(streams)  # type: ignore[list-item]
    # the echoed prompt goes out once, with its logprobs where asked (they come after the prefill)
    pending = [echoes is not None] * len(streams)
    rendered = [CompletionLogprobs() for _ in streams]
    ids = SentIds(body, len(streams))
    async for index, gen in merge(streams):
        latest[index] = gen
        text, entries = "", list[list[Any]]()
        if pending[index] and (gen.input_logprobs or not body.prompt_logprobs):
            text, entries = _echoed(gen, body, echoes, index)
            pending[index] = False
        if text or entries or gen.new_text or gen.new_output_logprobs or gen.finished:
            entries = entries + gen.new_output_logprobs
            text += gen.new_text
            logprobs = rendered[index].render(entries, gen) if body.logprobs is not None else None
            choice = {"index": index, "text": text, "logprobs": logprobs, **finish(gen)}
            if ids.on:
                prompt_ids, new_ids = ids.take(gen, index)
                choice.update({"prompt_token_ids": prompt_ids} if prompt_ids is not None else {}, token_ids=new_ids)
            yield {**head, "choices": [choice], **running_usage(gen, body)}
    if body.include_usage:
        yield {**head, "choices": [], "usage": usage(latest, body)}


async def _chat_chunks(
    streams: list[AsyncIterator[Generation]], body: ChatCompletionIn, reader: ChatAnswerReader, head: dict[str, Any]
) -> AsyncGenerator[dict[str, Any], None]:
    latest: list[Generation] = [None] * len(streams)  # type: ignore[list-item]
    # characters of each choice's thinking and answer sent so far
    sent = {field: [0] * len(streams) for field in ("reasoning_content", "content")}
    ids = SentIds(body, len(streams))

    def chunk(
        index: int,
        delta: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
        reason: dict[str, Any] = _UNFINISHED,
        opening: bool = False,
    ) -> dict[str, Any]:
        gen = latest[index]
        # every delta names reasoning_content, null when it holds none, as SGLang's do; thinking
        # goes under vLLM's newer name, reasoning, too
        thought = delta.get("reasoning_content")
        delta = {**delta, "reasoning_content": thought} | ({"reasoning": thought} if thought else {})
        choice = {"index": index, "delta": delta, "logprobs": logprobs, **reason}
        prompt = {}
        if ids.on:  # a chat's prompt ids go beside the choices, as vLLM's
            prompt_ids, choice["token_ids"] = ids.take(gen, index)
            prompt = {"prompt_token_ids": prompt_ids} if prompt_ids is not None else {}
        return {**head, **prompt, "choices": [choice], **running_usage(gen, body, opening)}

    def news(index: int, parts: dict[str, str | None]) -> dict[str, str]:
        """What of each part was not sent yet (and counts it sent)."""
        delta = {}
        for field, text in parts.items():
            if text and len(text) > sent[field][index]:
                delta[field] = text[sent[field][index] :]
                sent[field][index] = len(text)
        return delta

    async for index, gen in merge(streams):
        started, latest[index] = latest[index] is not None, gen
        if not started:
            yield chunk(index, {"role": "assistant", "content": ""}, opening=True)
        logprobs = chat_logprobs(gen.new_output_logprobs, gen) if body.logprobs else None
        # text that may be a marker or a tool call is held until it is known; calls go out whole
        if not gen.finished:
            thought, answer = reader.streamable(gen.text)
            delta = news(index, {"reasoning_content": thought, "content": answer})
            if delta or logprobs:
                yield chunk(index, delta or {"content": ""}, logprobs)
            continue
        message, ended = chat_answer(gen, reader)
        delta = news(index, {field: message.get(field) for field in sent})
        if delta or logprobs:
            yield chunk(index, delta or {"content": ""}, logprobs)
        if "tool_calls" in message:
            yield chunk(index, {"tool_calls": [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]})
        yield chunk(index, {}, reason=ended)
    if body.include_usage:
        yield {**head, "choices": [], "usage": usage(latest, body)}


def answer_reader(
    ctx: ApiContext, body: ToolsRequest, separate_reasoning: bool = True, stream_reasoning: bool = True
) -> ChatAnswerReader:
    """How the request's answer is read with the server's parsers; "auto" tool calls without a
    parser are a 400."""
    try:
        tools = ChatToolCalls.of(
            body.tools, body.tool_choice, ctx.config.tool_call_parser, body.parallel_tool_calls, body.forcing
        )
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    thinking = REASONING_FORMATS[ctx.config.reasoning_parser] if ctx.config.reasoning_parser else None
    return ChatAnswerReader(tools, thinking if separate_reasoning else None, stream_reasoning)


def start_generations(
    ctx: ApiContext,
    request: Request,
    body: OpenAIRequest,
    inputs: list[dict[str, Any]],
    return_logprob: bool = False,
    top_logprobs: int = 0,
    prompt_logprobs: bool = False,
) -> list[AsyncIterator[Generation]]:
    """The generations of an OpenAI request: ``body.n`` of each of ``inputs``."""
    if body.pins():  # a pin is a cache-control call: with an admin key, only its holder's
        admin_check(ctx.config.admin_api_key)(request)
    deadline = deadline_of(body.deadline_s)
    requests = _requests(body, inputs, return_logprob, top_logprobs, prompt_logprobs, ctx.config.reasoning_parser)
    return [run_generation(ctx.client, r, ctx.metrics, deadline) for r in requests]


def openai_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    model = ctx.config.served_model_name

    card = {"id": model, "object": "model", "created": ctx.created, "owned_by": "radixcluster", "root": model}
    # Anthropic's fields of the same card, for its SDK's models.list and models.retrieve
    created_at = datetime.fromtimestamp(ctx.created, timezone.utc).isoformat().replace("+00:00", "Z")
    card |= {"type": "model", "display_name": model, "created_at": created_at, "lifecycle": "active"}
    if ctx.config.context_length is not None:
        card["max_model_len"] = ctx.config.context_length  # vLLM's field: what a prompt and its output may take
        card["max_input_tokens"] = ctx.config.context_length - 1  # Anthropic's: the longest prompt

    @router.get("/v1/models")
    async def models() -> dict[str, Any]:
        # Anthropic's page fields beside OpenAI's list: one page
        return {"object": "list", "data": [card], "has_more": False, "first_id": model, "last_id": model}

    @router.get("/v1/models/{name:path}")
    async def model_card(name: str) -> dict[str, Any]:
        if name != model:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {model!r}")
        return card

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await ctx.body(request, CompletionIn)
        inputs = [{"text": p} if isinstance(p, str) else {"input_ids": p} for p in body.prompts()]
        wants_logprobs = body.logprobs is not None
        echoes = await _echo_texts(ctx, body)
        streams = start_generations(
            ctx, request, body, inputs, wants_logprobs, body.logprobs or 0, body.prompt_logprobs
        )
        if body.stream:
            head = _head("text_completion", "cmpl", model)
            return await start_stream(request, _completion_chunks(streams, body, head, echoes))
        gens = await collect(request, streams)
        choices = []
        for i, g in enumerate(gens):
            text, entries = _echoed(g, body, echoes, i)
            choices.append(
                {
                    "index": i,
                    "text": text + g.text,
                    "logprobs": CompletionLogprobs().render(entries + g.output_logprobs, g) if wants_logprobs else None,
                    **finish(g),
                    **({"prompt_token_ids": g.prompt_ids, "token_ids": g.output_ids} if body.return_token_ids else {}),
                }
            )
        return JsonResponse({**_head("text_completion", "cmpl", model), "choices": choices, "usage": usage(gens, body)})

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await ctx.body(request, ChatCompletionIn)
        reader = answer_reader(ctx, body, body.separate_reasoning, body.stream_reasoning)
        streams = start_generations(ctx, request, body, [body.chat_input()], body.logprobs, body.top_logprobs or 0)
        if body.stream:
            head = _head("chat.completion.chunk", "chatcmpl", model)
            return await start_stream(request, _chat_chunks(streams, body, reader, head))
        gens = await collect(request, streams)
        choices = []
        for i, g in enumerate(gens):
            message, ended = chat_answer(g, reader)
            logprobs = chat_logprobs(g.output_logprobs, g) if body.logprobs else None
            choice = {"index": i, "message": {"role": "assistant", **message}, "logprobs": logprobs, **ended}
            choices.append({**choice, "token_ids": g.output_ids} if body.return_token_ids else choice)
        prompt_ids = {"prompt_token_ids": gens[0].prompt_ids} if body.return_token_ids else {}
        return JsonResponse(
            {
                **_head("chat.completion", "chatcmpl", model),
                **prompt_ids,
                "choices": choices,
                "usage": usage(gens, body),
            }
        )

    return router
