"""The gateway's HTTP routes: a replica's API (generation forwarded to the replica the routing
picks; model information and tokenizing answered by any one; health, aborts, cache and
metrics over all of them) and the replica list (``/replicas``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from radixcluster.gateway.config import GatewayConfig
from radixcluster.gateway.forwarding import Forwarder
from radixcluster.gateway.metrics import GatewayMetrics
from radixcluster.gateway.prompts import CHAT, COMPLETIONS, NATIVE, PromptReader
from radixcluster.gateway.replica import Replica
from radixcluster.gateway.replica_set import ReplicaSet
from radixcluster.gateway.upstream import UPSTREAM_ERRORS, Answer, fetch
from radixcluster.router.api.control_schemas import AbortIn
from radixcluster.router.api.errors import ApiError, error_response, parse_json, read_body
from radixcluster.router.api.metrics import CONTENT_TYPE

# /cache_info keys that add up over replicas; the rates are recomputed from the sums
_SUMMED = (
    "total_requests",
    "cache_hits",
    "prompt_tokens_total",
    "cached_tokens_total",
    "evicted_tokens_total",
    "tree_nodes",
    "cached_tokens",
    "evictable_tokens",
    "protected_tokens",
)
HEALTH_GENERATE_TIMEOUT_S = 30.0


@dataclass(slots=True)
class GatewayContext:
    config: GatewayConfig
    replicas: ReplicaSet
    reader: PromptReader
    forwarder: Forwarder
    metrics: GatewayMetrics


class ReplicaIn(BaseModel):
    url: str


def _available(ctx: GatewayContext) -> list[Replica]:
    found = sorted((r for r in ctx.replicas.list() if r.available), key=lambda r: r.load.tokens)
    if not found:
        raise ApiError(503, "no replica is available")
    return found


async def _each(
    ctx: GatewayContext, method: str, path: str, content: bytes | None = None
) -> dict[str, Answer | BaseException]:
    """Ask every available replica, concurrently."""
    http, headers = ctx.replicas.http, ctx.replicas.headers
    replicas = _available(ctx)
    answers = await asyncio.gather(
        *(fetch(http, method, r.url + path, headers, content) for r in replicas),
        return_exceptions=True,
    )
    return dict(zip((r.url for r in replicas), answers))


def _failures(answers: dict[str, Answer | BaseException]) -> str | None:
    """The replicas that did not answer 200, and why; None when all did."""
    failed = {
        url: (a.text if isinstance(a, Answer) else f"{type(a).__name__}: {a}")
        for url, a in answers.items()
        if not isinstance(a, Answer) or a.status != 200
    }
    if not failed:
        return None
    return f"{len(failed)} of {len(answers)} replicas failed: " + "; ".join(f"{u}: {why}" for u, why in failed.items())


async def _ask_one(ctx: GatewayContext, method: str, path: str, content: bytes | None = None) -> Response:
    """The answer of the least loaded replica that answers (a question any replica answers
    alike: model information, tokenizing), passed through as it is."""
    errors = []
    for replica in _available(ctx):
        try:
            answer = await fetch(ctx.replicas.http, method, replica.url + path, ctx.replicas.headers, content)
        except UPSTREAM_ERRORS as exc:
            errors.append(f"{replica.url}: {type(exc).__name__}: {exc}")
            continue
        return _passed_on(answer)
    return error_response(503, "no replica answered: " + "; ".join(errors))


def _passed_on(answer: Answer) -> Response:
    return Response(answer.content, answer.status, media_type=answer.content_type)


def _summed(infos: dict[str, dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {key: sum(info.get(key, 0) for info in infos.values()) for key in _SUMMED}
    requests, hits = total["total_requests"], total["cache_hits"]
    total["hit_rate"] = hits / requests if requests else 0.0
    total["token_hit_rate"] = (
        total["cached_tokens_total"] / total["prompt_tokens_total"] if total["prompt_tokens_total"] else 0.0
    )
    total["shared_prefix_length_avg"] = total["cached_tokens_total"] / hits if hits else 0.0
    return total


def gateway_routes(ctx: GatewayContext) -> APIRouter:
    router = APIRouter()

    async def forward(request: Request, path: str, kind: str) -> Response:
        arrived = time.perf_counter()
        raw = await read_body(request, ctx.config.max_body_bytes)
        routed = ctx.reader.read(kind, parse_json(raw))
        return await ctx.forwarder.forward(request, path, routed, raw, arrived)

    @router.post("/generate")
    async def generate(request: Request) -> Response:
        return await forward(request, "/generate", NATIVE)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward(request, "/v1/completions", COMPLETIONS)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await forward(request, "/v1/chat/completions", CHAT)

    @router.get("/health")
    async def health() -> Response:
        if not any(r.available for r in ctx.replicas.list()):
            return error_response(503, "unhealthy: no replica is available")
        return Response(status_code=200)

    @router.get("/health_generate")
    async def health_generate() -> Response:
        replica = _available(ctx)[0]
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
        return _passed_on(answer)

    @router.get("/server_info")
    @router.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        replica = _available(ctx)[0]
        info = await ctx.replicas.get_json(replica, "/server_info")
        routing = ctx.config.routing
        gateway = {"replicas": [r.url for r in ctx.replicas.list()], "policy": routing.policy}
        return {**info, "gateway": gateway}

    @router.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(timeout: float = Query(0.0, ge=0.0)) -> Response:
        answers = await _each(ctx, "POST", f"/flush_cache?timeout={timeout}")
        failed = _failures(answers)
        if failed:
            return error_response(400, f"the cache was not flushed everywhere: {failed}")
        return JSONResponse({"success": True, "message": f"Cache flushed on {len(answers)} replicas."})

    @router.post("/abort_request")
    async def abort_request(request: Request) -> Response:
        """Every replica is told (the one running ``rid`` aborts it; the others know no such
        request); the body is checked here first, so a bad one is the same 400 as a replica's."""
        raw = await read_body(request, ctx.config.max_body_bytes)
        AbortIn.model_validate(parse_json(raw))
        failed = _failures(await _each(ctx, "POST", "/abort_request", raw))
        if failed:
            return error_response(502, f"the abort did not reach every replica: {failed}")
        return Response(status_code=200)

    @router.post("/tokenize")
    @router.post("/v1/tokenize")
    @router.post("/detokenize")
    @router.post("/v1/detokenize")
    async def tokenizer(request: Request) -> Response:
        raw = await read_body(request, ctx.config.max_body_bytes)
        return await _ask_one(ctx, "POST", request.url.path, raw)

    @router.get("/model_info")
    @router.get("/get_model_info")
    @router.get("/v1/models")
    @router.get("/v1/models/{name:path}")
    async def model(request: Request) -> Response:
        return await _ask_one(ctx, "GET", request.url.path)

    @router.get("/cache_info")
    async def cache_info() -> dict[str, Any]:
        """The replicas' counters summed, each replica's own, and the gateway's predictions."""
        answers = await _each(ctx, "GET", "/cache_info")
        infos = {url: a.json() for url, a in answers.items() if isinstance(a, Answer) and a.status == 200}
        return {**_summed(infos), "replicas": infos, "gateway": ctx.forwarder.ledger.summary()}

    @router.get("/metrics")
    async def metrics() -> Response:
        answers = await _each(ctx, "GET", "/metrics") if any(r.available for r in ctx.replicas.list()) else {}
        texts = {url: a.text for url, a in answers.items() if isinstance(a, Answer) and a.status == 200}
        return Response(ctx.metrics.render(ctx.replicas.list(), texts), media_type=CONTENT_TYPE)

    @router.get("/replicas")
    async def list_replicas() -> dict[str, Any]:
        return {"replicas": [r.describe() for r in ctx.replicas.list()]}

    @router.post("/replicas")
    async def add_replica(body: ReplicaIn) -> dict[str, Any]:
        if not body.url.startswith(("http://", "https://")):
            raise ApiError(400, f"a replica is an http:// or https:// URL, got {body.url!r}")
        return ctx.replicas.add(body.url).describe()

    @router.delete("/replicas")
    async def remove_replica(body: ReplicaIn) -> dict[str, Any]:
        if not await ctx.replicas.remove(body.url):
            raise ApiError(404, f"no replica {body.url!r}")
        return {"removed": body.url.rstrip("/")}

    return router
