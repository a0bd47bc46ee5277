"""SGLang's native HTTP routes: /generate, health checks, server and cache information, metrics."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request, Response

from radixcluster import __version__
from radixcluster.protocol import GenerateRequest, SamplingParams
from radixcluster.router.api.auth import current_tenant
from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.errors import ApiError, error_response
from radixcluster.router.api.generation import (
    Generation,
    collect,
    deadline_of,
    merge,
    run_generation,
    start_stream,
)
from radixcluster.router.api.json_text import JsonResponse
from radixcluster.router.api.metrics import CONTENT_TYPE
from radixcluster.router.api.native_schemas import GenerateIn
from radixcluster.router.api.reasoning import END
from radixcluster.router.api.router_client import RouterError, RouterUnavailable

HEALTH_TIMEOUT_S = 2.0
HEALTH_GENERATE_TIMEOUT_S = 20.0
FLUSH_RETRY_S = 0.05
# A native stream's events are cumulative (SGLang's format), logprobs included: once an event
# would repeat more logprob entries than this, the next goes out only when they have grown by
# GROWTH, so rendering a stream stays linear in its answer (1,000 tokens with 20 top logprobs
# each were 362 MB of JSON on the api's one loop, which stalled every other request for seconds).
# Each event holds everything before it: a skipped one loses nothing.
EVERY_EVENT_ENTRIES = 4096
GROWTH = 1 / 8


def logprob_entries(gen: Generation) -> int:
    """The logprob entries a native event of ``gen`` repeats (each top logprob one)."""
    return gen.num_output_logprobs * (1 + gen.top_logprobs_num) if gen.return_logprob else 0


async def _native_chunks(
    streams: list[AsyncIterator[Generation]], indexed: bool
) -> AsyncGenerator[dict[str, Any], None]:
    sent = [0] * len(streams)  # logprob entries each stream's last event held
    async for index, gen in merge(streams):
        entries = logprob_entries(gen)
        if not gen.finished and entries > EVERY_EVENT_ENTRIES and entries - sent[index] < sent[index] * GROWTH:
            continue
        sent[index] = entries
        chunk = gen.native()
        if indexed:
            chunk["index"] = index
        yield chunk


async def _last(stream: AsyncIterator[Generation]) -> Generation | None:
    last = None
    async for gen in stream:
        last = gen
    return last


def native_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()

    @router.api_route("/generate", methods=["POST", "PUT"])  # SGLang's takes both
    async def generate(request: Request) -> Response:
        body = await ctx.body(request, GenerateIn)
        deadline = deadline_of(body.deadline_s)
        # SGLang's require_reasoning: a grammar holds once the thinking the reasoning parser reads has
        # ended (the model thinks from its first token, as SGLang takes it)
        after = END if body.require_reasoning and ctx.config.reasoning_parser else None
        streams = [run_generation(ctx.client, sub, ctx.metrics, deadline) for sub in body.expand(after)]
        as_list = body.returns_list()
        if body.stream:
            return await start_stream(request, _native_chunks(streams, as_list))
        results = [gen.native() for gen in await collect(request, streams)]
        return JsonResponse(results if as_list else results[0])

    # HEAD too: some load balancers' checks send it
    @router.api_route("/health", methods=["GET", "HEAD"])
    @router.api_route("/ping", methods=["GET", "POST", "HEAD"])  # vLLM's name (SageMaker's probe)
    @router.api_route("/ready", methods=["GET", "HEAD"])  # SGLang's readiness probe
    async def health() -> Response:
        # 503 with the reason while the router is unreachable or has no TP group (one is replaced)
        try:
            await ctx.client.control("health", timeout=HEALTH_TIMEOUT_S)
        except (RouterUnavailable, RouterError) as exc:
            return error_response(503, f"unhealthy: {exc}")
        return Response(status_code=200)

    @router.api_route("/health_generate", methods=["GET", "HEAD"])
    async def health_generate() -> Response:
        # a router that finished a step lately is generating: no probe (a full queue would make
        # it wait, or refuse it)
        try:
            stats = await ctx.client.control("stats", timeout=HEALTH_GENERATE_TIMEOUT_S)
        except (RouterUnavailable, RouterError) as exc:
            return error_response(503, f"unhealthy: {exc}")
        if not stats.get("group_up", 1):
            return error_response(503, f"unhealthy: the model workers are restarting ({stats['group_down_reason']})")
        since = stats.get("seconds_since_last_step")
        if stats.get("running_requests") and since is not None and since < HEALTH_GENERATE_TIMEOUT_S:
            return Response(status_code=200)
        probe = GenerateRequest(
            rid=f"health-{uuid.uuid4().hex}",
            sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
            text="ping",
            log_metrics=False,  # a probe every few seconds would drag down the hit rates users watch
        )
        try:
            await asyncio.wait_for(_last(run_generation(ctx.client, probe, ctx.metrics)), HEALTH_GENERATE_TIMEOUT_S)
        except asyncio.TimeoutError:
            return error_response(503, f"unhealthy: no token generated within {HEALTH_GENERATE_TIMEOUT_S:g} s")
        except (ApiError, RouterUnavailable) as exc:
            return error_response(503, f"unhealthy: {exc}")
        return Response(status_code=200)

    @router.get("/server_info")
    @router.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        info = await ctx.client.control("server_info")
        return {**info, "served_model_name": ctx.config.served_model_name, "version": __version__}

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}  # vLLM's endpoint

    @router.api_route("/flush_cache", methods=["GET", "POST"])
    @router.post("/reset_prefix_cache")  # vLLM's name (bench_serving --backend vllm --flush-cache)
    async def flush_cache(timeout: float = Query(0.0, ge=0.0)) -> Response:
        """Empty the tree; with ``timeout`` (seconds, SGLang's), wait that long for running
        and waiting requests to finish first."""
        deadline = time.monotonic() + timeout
        result = await ctx.client.control("flush_cache")
        while not result.get("success", False) and time.monotonic() < deadline:
            await asyncio.sleep(FLUSH_RETRY_S)
            result = await ctx.client.control("flush_cache")
        if not result.get("success", False):
            return error_response(400, result.get("message") or "the router refused to flush the cache")
        return JsonResponse(result)

    @router.get("/cache_info")
    async def cache_info() -> dict[str, Any]:
        """The cache's counters and pins; a tenant's key sees its own tenant's only."""
        return await ctx.client.control("cache_info", {"tenant": current_tenant.get()})

    @router.get("/metrics")
    async def metrics() -> Response:
        stats = await ctx.client.control("stats")
        return Response(ctx.metrics.render(stats, ctx.config.served_model_name), media_type=CONTENT_TYPE)

    return router
