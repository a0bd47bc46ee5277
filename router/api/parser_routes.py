"""SGLang's text utilities: /parse_function_call and /separate_reasoning apply the chat
endpoint's own readers (``tool_parsers``, ``reasoning``) to a text the client already has."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request

from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.control_schemas import ParseFunctionCallIn, SeparateReasoningIn
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.reasoning import REASONING_FORMATS
from radixcluster.router.api.tool_parsers import TOOL_CALL_FORMATS


def parser_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()

    @router.post("/parse_function_call")
    async def parse_function_call(request: Request) -> dict[str, Any]:
        """``normal_text`` (before the calls, or all of it when it makes none) and ``calls``,
        each with the index of its tool in ``tools`` and its arguments as a JSON string."""
        body = await ctx.body(request, ParseFunctionCallIn)
        name = _chosen(body.tool_call_parser, ctx.config.tool_call_parser, "tool_call_parser", TOOL_CALL_FORMATS)
        index = {tool.function.name: i for i, tool in enumerate(body.tools)}
        parsed = TOOL_CALL_FORMATS[name].parse(body.text, frozenset(index))
        if parsed is None:
            return {"normal_text": body.text, "calls": []}
        before, calls = parsed
        return {
            "normal_text": before,
            "calls": [
                {"tool_index": index[tool], "name": tool, "parameters": json.dumps(arguments, ensure_ascii=False)}
                for tool, arguments in calls
            ],
        }

    @router.post("/separate_reasoning")
    async def separate_reasoning(request: Request) -> dict[str, Any]:
        """``reasoning_text`` and ``text``; with ``return_blocks``, the same as blocks too."""
        body = await ctx.body(request, SeparateReasoningIn)
        name = _chosen(body.reasoning_parser, ctx.config.reasoning_parser, "reasoning_parser", REASONING_FORMATS)
        reasoning, text = REASONING_FORMATS[name].split(body.text)
        answer: dict[str, Any] = {"reasoning_text": reasoning, "text": text}
        if body.return_blocks:
            blocks = [{"type": "reasoning", "text": reasoning}] if reasoning else []
            blocks.append({"type": "text", "text": text})
            answer |= {"reasoning_blocks": [reasoning] if reasoning else [], "text_blocks": [text], "blocks": blocks}
        return answer

    return router


def _chosen(asked: str | None, served: str | None, field: str, known: dict[str, Any]) -> str:
    """The request's parser, else the server's; a 400 saying so when neither names one."""
    name = asked or served
    if name is None:
        flag = "--" + field.replace("_", "-")
        raise ApiError(400, f"{field}: name the model's format ({', '.join(sorted(known))}); the server has no {flag}")
    return name
