"""SGLang's info and control endpoints that its clients call besides /generate: model info
(the frontend picks its chat template from ``model_path``), tokenize, detokenize, abort, and
the profiler's start and stop."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import PlainTextResponse

from radixcluster.router.api.auth import admin_check
from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.control_schemas import AbortIn, DetokenizeIn, ProfileIn, TokenizeIn
from radixcluster.router.api.errors import ApiError, read_json
from radixcluster.router.api.json_text import JsonResponse
from radixcluster.router.api.router_client import RouterError

# where traces go when the request names no output_dir: SGLang's variable, then vLLM's
PROFILER_DIR_ENVS = ("SGLANG_TORCH_PROFILER_DIR", "VLLM_TORCH_PROFILER_DIR")


async def refusable_call(ctx: ApiContext, kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """A control call whose refusals (a bad chat, ids outside the vocabulary, a second profile)
    are the client's 400."""
    try:
        return await ctx.client.control(kind, args)
    except RouterError as exc:
        raise ApiError(400, str(exc)) from None


async def count_prompt_tokens(ctx: ApiContext, chat: dict[str, Any]) -> int:
    """The tokens of a chat's prompt (``messages``, ``tools``, ...) as its generation renders
    it, the assistant's turn opened: what Anthropic's and OpenAI's token-count calls answer."""
    tokenized = await refusable_call(ctx, "tokenize", {**chat, "add_generation_prompt": True})
    return len(tokenized["tokens"][0])


# SGLang's label of the weights a server started with (its --weight-version's default); the
# weights here never change while it runs, so neither does the label
WEIGHT_VERSION = "default"


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
            "weight_version": WEIGHT_VERSION,
            "model_type": info["model_type"],
            "architectures": info["architectures"],
        }

    @router.get("/weight_version")
    @router.get("/get_weight_version")
    async def weight_version() -> dict[str, str]:
        return {"weight_version": WEIGHT_VERSION}

    @router.post("/update_weights_from_disk")
    async def update_weights_from_disk() -> JsonResponse:
        """Refused in SGLang's shape of a failed update, which its trainers' clients read."""
        message = (
            "this server does not update its weights in place: "
            "start one on the new weights (radixcluster up --model-path ...)"
        )
        return JsonResponse({"success": False, "message": message, "num_paused_requests": 0}, status_code=400)

    @router.post("/tokenize")
    @router.post("/v1/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await ctx.body(request, TokenizeIn)
        tokenized = await refusable_call(ctx, "tokenize", body.router_args())
        info = await ctx.client.control("server_info")
        return body.answer(tokenized, info["context_length"])

    @router.post("/detokenize")
    @router.post("/v1/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await ctx.body(request, DetokenizeIn)
        return body.answer((await refusable_call(ctx, "detokenize", body.router_args()))["texts"])

    @router.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        body = await ctx.body(request, AbortIn)
        ctx.client.abort(body.rid, abort_all=body.abort_all)
        return Response(status_code=200)

    admin = [Depends(admin_check(ctx.config.admin_api_key))]

    @router.api_route("/start_profile", methods=["GET", "POST"], dependencies=admin)
    async def start_profile(request: Request) -> Response:
        """torch's profiler on every rank until /stop_profile (or ``num_steps`` steps); each
        rank writes a Chrome trace, ``output_dir/{profile_id}-TP-{rank}.trace.json.gz``."""
        body = ProfileIn.model_validate(await read_json(request, ctx.config.max_body_bytes, empty_ok=True))
        output_dir = writable_dir(body.output_dir or default_profile_dir())
        await refusable_call(ctx, "start_profile", body.router_args(output_dir))
        return PlainTextResponse("Start profiling.\n")

    @router.api_route("/stop_profile", methods=["GET", "POST"], dependencies=admin)
    async def stop_profile() -> Response:
        await refusable_call(ctx, "stop_profile", {})
        return PlainTextResponse("Stop profiling. This will take some time.\n")

    return router


def default_profile_dir() -> str:
    return next((os.environ[name] for name in PROFILER_DIR_ENVS if os.environ.get(name)), tempfile.gettempdir())


def writable_dir(path: str) -> str:
    """``path`` made absolute, created when missing; 400 when the server cannot write there
    (the ranks write their traces beside this process: a replica's processes share its node)."""
    path = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ApiError(400, f"output_dir {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ApiError(400, f"output_dir {path} is not writable by the server")
    return path
