"""The gateway's HTTP routes: a replica's API (generation forwarded to the replica the routing
picks; model information, tokenizing and SGLang's text parsers answered by any one; health,
aborts, flushes and metrics over all of them) and the replica list (``/replicas``). The cache's
routes are in cache_routes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from radixcluster import __version__
from radixcluster.gateway.config import replica_url_problem
from radixcluster.gateway.context import (
    GatewayContext,
    available,
    each,
    failures,
    forward,
    passed_on,
    replica_indices,
)
from radixcluster.gateway.fast_path import GENERATION_ROUTES, generation_methods
from radixcluster.gateway.upstream import UPSTREAM_ERRORS, Answer, fetch
from radixcluster.router.api.control_schemas import AbortIn
from radixcluster.router.api.errors import ApiError, error_response, parse_json, read_body, read_json
from radixcluster.router.api.metrics import CONTENT_TYPE

HEALTH_GENERATE_TIMEOUT_S = 30.0


class ReplicaIn(BaseModel):
    url: str


async def _ask_one(ctx: GatewayContext, method: str, path: str, content: bytes | None = None) -> Response:
    """The answer of the least loaded replica that answers (a question any replica answers
    alike: model information, tokenizing), passed through as it is."""
    errors = []
    for replica in available(ctx):
        try:
            answer = await fetch(ctx.replicas.http, method, replica.url + path, ctx.replicas.headers, content)
        except UPSTREAM_ERRORS as exc:
            errors.append(f"{replica.url}: {type(exc).__name__}: {exc}")
            continue
        return passed_on(answer)
    return error_response(503, "no replica answered: " + "; ".join(errors), path=path)


def _generation(ctx: GatewayContext, path: str, kind: str) -> Callable[[Request], Awaitable[Response]]:
    """FastAPI's route for a generation path (the fast path serves its POSTs ahead of it)."""

    async def generation(request: Request) -> Response:
        return await forward(ctx, request.receive, request.headers, path, kind)

    return generation


def gateway_routes(ctx: GatewayContext) -> APIRouter:
    router = APIRouter()

    for path, kind in GENERATION_ROUTES.items():
        router.add_api_route(path, _generation(ctx, path, kind), methods=generation_methods(path))

    # HEAD too: some load balancers' checks send it
    @router.api_route("/health", methods=["GET", "HEAD"])
    @router.api_route("/ping", methods=["GET", "POST", "HEAD"])  # vLLM's name (SageMaker's probe)
    @router.api_route("/ready", methods=["GET", "HEAD"])  # SGLang's readiness probe
    async def health() -> Response:
        if not any(r.available for r in ctx.replicas.list()):
            return error_response(503, "unhealthy: no replica is available")
        return Response(status_code=200)

    @router.api_route("/health_generate", methods=["GET", "HEAD"])
    async def health_generate() -> Response:
        replica = available(ctx)[0]
        try:
            answer = await fetch(
                ctx.replicas.http,
                "GET",
                replica.url + "/health_generate",
                ctx.replicas.headers,
                timeout=HEALTH_GENERATE_TIMEOUT_S,
            )
        except UPSTREAM_ERRORS as exc:
            return error_response(503, f"unhealthy: {replica.url}: {type(exc).__name__}: {exc}")
        return passed_on(answer)

    @router.get("/server_info")
    @router.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        replica = available(ctx)[0]
        info = await ctx.replicas.get_json(replica, "/server_info")
        routing = ctx.config.routing
        gateway = {"replicas": [r.url for r in ctx.replicas.list()], "policy": routing.policy}
        return {**info, "gateway": gateway}

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @router.get("/get_load")
    async def get_load() -> list[dict[str, int]]:
        """SGLang's, for a data-parallel server: each available replica's entry, ``dp_rank``
        its index in ``/replicas``."""
        index = replica_indices(ctx)
        answers = await each(ctx, "GET", "/get_load")
        return [
            {**entry, "dp_rank": index[url]}
            for url, answer in sorted(answers.items(), key=lambda item: index[item[0]])
            if isinstance(answer, Answer) and answer.status == 200
            for entry in answer.json()
        ]

    @router.api_route("/flush_cache", methods=["GET", "POST"])
    @router.post("/reset_prefix_cache")  # vLLM's name (bench_serving --backend vllm --flush-cache)
    async def flush_cache(timeout: float = Query(0.0, ge=0.0)) -> Response:
        answers = await each(ctx, "POST", f"/flush_cache?timeout={timeout}")
        failed = failures(answers)
        if failed:
            return error_response(400, f"the cache was not flushed everywhere: {failed}")
        return JSONResponse({"success": True, "message": f"Cache flushed on {len(answers)} replicas."})

    @router.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        """Every replica is told (the one running ``rid`` aborts it; the others know no such
        request); the body is checked here first, so a bad one is the same 400 as a replica's."""
        raw = await read_body(request, ctx.config.max_body_bytes)
        AbortIn.model_validate(parse_json(raw))
        failed = failures(await each(ctx, "POST", "/abort_request", raw))
        if failed:
            return error_response(502, f"the abort did not reach every replica: {failed}")
        return Response(status_code=200)

    @router.post("/tokenize")
    @router.post("/v1/tokenize")
    @router.post("/detokenize")
    @router.post("/v1/detokenize")
    @router.post("/parse_function_call")
    @router.post("/separate_reasoning")
    @router.post("/v1/messages/count_tokens")
    @router.post("/v1/responses/input_tokens")
    @router.post("/update_weights_from_disk")  # a replica's refusal
    async def text_call(request: Request) -> Response:
        raw = await read_body(request, ctx.config.max_body_bytes)
        return await _ask_one(ctx, "POST", request.url.path, raw)

    @router.get("/model_info")
    @router.get("/get_model_info")
    @router.get("/weight_version")
    @router.get("/get_weight_version")
    @router.get("/v1/models")
    @router.get("/v1/models/{name:path}")
    async def model(request: Request) -> Response:
        return await _ask_one(ctx, "GET", request.url.path)

    @router.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"])
    @router.api_route("/v1/responses/{response_id}/{action:path}", methods=["GET", "POST"])
    async def stored_response(request: Request) -> Response:
        """A stored response's calls: a replica answers that it stores none."""
        return await _ask_one(ctx, request.method, request.url.path)

    @router.get("/metrics")
    async def metrics() -> Response:
        answers = await each(ctx, "GET", "/metrics") if any(r.available for r in ctx.replicas.list()) else {}
        texts = {url: a.text for url, a in answers.items() if isinstance(a, Answer) and a.status == 200}
        return Response(ctx.metrics.render(ctx.replicas.list(), texts), media_type=CONTENT_TYPE)

    @router.get("/replicas")
    async def list_replicas() -> dict[str, Any]:
        return {"replicas": [r.describe() for r in ctx.replicas.list()]}

    # bodies read as every other route's, so that one that is not JSON is said to be so
    async def replica_named(request: Request) -> ReplicaIn:
        return ReplicaIn.model_validate(await read_json(request, ctx.config.max_body_bytes))

    @router.post("/replicas")
    async def add_replica(request: Request) -> dict[str, Any]:
        body = await replica_named(request)
        if (problem := replica_url_problem(body.url)) is not None:
            raise ApiError(400, f"url {body.url!r}: {problem}")
        return ctx.replicas.add(body.url).describe()

    @router.delete("/replicas")
    async def remove_replica(request: Request) -> dict[str, Any]:
        body = await replica_named(request)
        if not await ctx.replicas.remove(body.url):
            raise ApiError(404, f"no replica {body.url!r}")
        return {"removed": body.url.rstrip("/")}

    return router
