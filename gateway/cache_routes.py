"""The cache through the gateway: the cache page (the replicas' own files), one replica's tree
snapshot and ``/cache_info`` (``?replica=URL`` or its index in ``GET /replicas``; the tree's
default is the first available one, /cache_info's the merge of all), and the cache-control
calls: a warm or a pin goes where a generation of its prefix would be routed (so the requests
that share it find it there); an unpin or an evict goes to every available replica. They carry
the client's key on, so each replica applies the tenant and the admin check itself; a replica's
refusal comes back as it is."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request, Response

from radixcluster.gateway.cache_info import merged_cache_info
from radixcluster.gateway.context import GatewayContext, each, failures, forward, named, passed_on
from radixcluster.gateway.prompts import PIN, WARM
from radixcluster.gateway.upstream import UPSTREAM_ERRORS, Answer, fetch
from radixcluster.router.api.auth import act_for_tenant, admin_check
from radixcluster.router.api.cache_routes import page_routes
from radixcluster.router.api.cache_schemas import CachePrefixIn, UnpinIn
from radixcluster.router.api.errors import ApiError, parse_json, read_body

REPLICA_HELP = "a replica's URL or its index in GET /replicas (default: the first available one)"


async def _ask_named(ctx: GatewayContext, name: str | None, path: str, headers: dict[str, str]) -> Response:
    replica = named(ctx.replicas.list(), name)
    try:
        return passed_on(await fetch(ctx.replicas.http, "GET", replica.url + path, headers))
    except UPSTREAM_ERRORS as exc:
        raise ApiError(502, f"replica {replica.url} did not answer: {type(exc).__name__}: {exc}") from None


async def _everywhere(
    ctx: GatewayContext, request: Request, method: str, path: str, schema: type[CachePrefixIn]
) -> dict[str, Answer]:
    """The call, its body checked here first (a bad one is the same 400 as a replica's), sent to
    every available replica with the client's key; their answers by URL (502 when one is
    unreachable: the call did not reach it)."""
    raw = await read_body(request, ctx.config.max_body_bytes)
    act_for_tenant(schema.model_validate(parse_json(raw)).tenant, ctx.config.tenant_keys.values())
    headers = ctx.replicas.client_headers(request.headers)
    answers = await each(ctx, method, path, raw, headers)
    unreachable = {url: a for url, a in answers.items() if not isinstance(a, Answer)}
    if unreachable:
        raise ApiError(502, f"the call did not reach every replica: {failures(unreachable)}")
    return {url: a for url, a in answers.items() if isinstance(a, Answer)}


def _refusal(answers: dict[str, Answer], accepted: tuple[int, ...]) -> Answer | None:
    """The first answer whose status is not ``accepted`` (a 401, a 400: the client's to read)."""
    return next((a for a in answers.values() if a.status not in accepted), None)


def gateway_cache_routes(ctx: GatewayContext) -> APIRouter:
    router = APIRouter()
    admin = [Depends(admin_check(ctx.config.admin_api_key))]
    router.include_router(page_routes())

    @router.get("/cache/tree")
    async def cache_tree(request: Request, replica: str | None = Query(None, description=REPLICA_HELP)) -> Response:
        """One replica's snapshot (``depth`` and ``min_tokens`` go on to it; a tenant sees its own runs)."""
        query = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "replica"])
        headers = ctx.replicas.client_headers(request.headers)
        return await _ask_named(ctx, replica, f"/cache/tree?{query}", headers)

    @router.get("/cache_info", response_model=None)
    async def cache_info(
        request: Request, replica: str | None = Query(None, description=REPLICA_HELP)
    ) -> Response | dict[str, Any]:
        """One replica's, or the replicas' merged, each replica's own and the gateway's
        predictions; asked with the client's key, so that a tenant sees its own tenant's only."""
        headers = ctx.replicas.client_headers(request.headers)
        if replica is not None:
            return await _ask_named(ctx, replica, "/cache_info", headers)
        answers = await each(ctx, "GET", "/cache_info", headers=headers)
        infos = {url: a.json() for url, a in answers.items() if isinstance(a, Answer) and a.status == 200}
        return {**merged_cache_info(infos), "replicas": infos, "gateway": ctx.forwarder.ledger.summary()}

    @router.post("/cache/warm", dependencies=admin)
    async def warm(request: Request) -> Response:
        return await forward(ctx, request.receive, request.headers, "/cache/warm", WARM)

    @router.post("/cache/pin", dependencies=admin)
    async def pin(request: Request) -> Response:
        return await forward(ctx, request.receive, request.headers, "/cache/pin", PIN)

    @router.delete("/cache/pin", dependencies=admin, response_model=None)
    async def unpin(request: Request) -> Response | dict[str, Any]:
        """Unpinned wherever a pin holds the prefix; 404 when no replica had one."""
        answers = await _everywhere(ctx, request, "DELETE", "/cache/pin", UnpinIn)
        refused = _refusal(answers, (200, 404))
        if refused is not None:
            return passed_on(refused)
        found = {url: a.json() for url, a in answers.items() if a.status == 200}
        if not found:
            return passed_on(next(iter(answers.values())))
        return {"unpinned": True, "tokens": sum(a["tokens"] for a in found.values()), "replicas": sorted(found)}

    @router.post("/cache/evict", dependencies=admin, response_model=None)
    async def evict(request: Request) -> Response | dict[str, Any]:
        """Evicted on every replica: the tokens freed in all, and on each."""
        answers = await _everywhere(ctx, request, "POST", "/cache/evict", CachePrefixIn)
        refused = _refusal(answers, (200,))
        if refused is not None:
            return passed_on(refused)
        evicted = {url: a.json()["evicted_tokens"] for url, a in answers.items()}
        prompt_tokens = next(iter(answers.values())).json()["prompt_tokens"]
        return {"prompt_tokens": prompt_tokens, "evicted_tokens": sum(evicted.values()), "replicas": evicted}

    return router
