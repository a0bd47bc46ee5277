"""SGLang's info and control endpoints that its clients call besides /generate: model info
(the frontend picks its chat template from ``model_path``), tokenize, detokenize, abort."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.control_schemas import AbortIn, DetokenizeIn, TokenizeIn
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.router_client import RouterError


async def tokenizer_call(ctx: ApiContext, kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """A tokenizer control call; what the router refuses (a bad chat, ids outside the
    vocabulary) is the client's 400."""
    try:
        return await ctx.client.control(kind, args)
    except RouterError as exc:
        raise ApiError(400, str(exc)) from None


def control_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()

    @router.get("/model_info")
    @router.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        info = await ctx.client.control("server_info")
        return {
            "model_path": info["model_path"],
            "tokenizer_path": info["tokenizer_path"],
            "served_model_name": ctx.config.served_model_name,
            "is_generation": True,
            "preferred_sampling_params": None,
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }

    @router.post("/tokenize")
    @router.post("/v1/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await ctx.body(request, TokenizeIn)
        tokenized = await tokenizer_call(ctx, "tokenize", body.router_args())
        info = await ctx.client.control("server_info")
        return body.answer(tokenized, info["context_length"])

    @router.post("/detokenize")
    @router.post("/v1/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await ctx.body(request, DetokenizeIn)
        return body.answer((await tokenizer_call(ctx, "detokenize", body.router_args()))["texts"])

    @router.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await ctx.body(request, AbortIn)
        ctx.client.abort(body.rid, abort_all=body.abort_all)
        return Response(status_code=200)

    return router
