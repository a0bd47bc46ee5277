"""The cache made visible and controllable: the live page (``GET /cache``, static files shipped
in the package), the tree snapshot it polls, and the cache-control calls (warm, pin, unpin,
evict by prefix), which need the admin key when the server has one."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Query, Request, Response

from radixcluster.cache_info_fields import CACHE_DISABLED
from radixcluster.protocol import GenerateRequest, SamplingParams
from radixcluster.router.api.auth import act_for_tenant, admin_check, current_tenant
from radixcluster.router.api.cache_schemas import MAX_TREE_DEPTH, CachePrefixIn, PinIn, UnpinIn
from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.generation import collect, run_generation
from radixcluster.router.api.router_client import RouterError

Prefix = TypeVar("Prefix", bound=CachePrefixIn)

# the page's files (package data), by the path they are served under, with their media type
PAGE_FILES = {
    "/cache": ("cache.html", "text/html; charset=utf-8"),
    "/cache/page.js": ("cache.js", "text/javascript; charset=utf-8"),
    "/cache/page.css": ("cache.css", "text/css; charset=utf-8"),
}


def page_file(name: str) -> bytes:
    return (resources.files("radixcluster.router.api") / "static" / name).read_bytes()


async def _cache_call(ctx: ApiContext, kind: str, args: dict[str, Any]) -> dict[str, Any]:
    """A cache control call; what the router refuses (a pin over the bound, bad bounds) is the
    client's 400."""
    try:
        return await ctx.client.control(kind, {**args, "tenant": current_tenant.get()})
    except RouterError as exc:
        raise ApiError(400, str(exc)) from None


async def _warm(ctx: ApiContext, request: Request, body: CachePrefixIn) -> dict[str, Any]:
    """Prefill the prefix without generating (a generation of 0 new tokens): its token count,
    what was cached already, and what was computed now. Refused (400) without a radix cache: the
    router refuses the other cache calls itself, but a warm-up reaches it as a generation."""
    if not ctx.config.radix_cache:
        raise ApiError(400, CACHE_DISABLED)
    msg = GenerateRequest(
        rid=f"warm-{uuid.uuid4().hex}",
        sampling=SamplingParams(max_new_tokens=0),
        text=body.text,
        input_ids=body.input_ids,
        cache_salt=body.cache_salt,
    )
    (gen,) = await collect(request, [run_generation(ctx.client, msg, ctx.metrics)])
    return {
        "prompt_tokens": gen.prompt_tokens,
        "cached_tokens": gen.cached_tokens,
        "prefilled_tokens": gen.prompt_tokens - gen.cached_tokens,
    }


def _file_response(content: bytes, media: str) -> Callable[[], Response]:
    # a closure, not default arguments: FastAPI would take those from the query string, and
    # `/cache?content=<script>...` would serve the client's text as the page
    def serve() -> Response:
        return Response(content, media_type=media)

    return serve


def page_routes() -> APIRouter:
    """The cache page's files, read once (they hold no data: public); a gateway serves them too."""
    router = APIRouter()
    for path, (name, media) in PAGE_FILES.items():
        router.add_api_route(path, _file_response(page_file(name), media), methods=["GET"])
    return router


def cache_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    admin = [Depends(admin_check(ctx.config.admin_api_key))]
    router.include_router(page_routes())
    tenants = set(ctx.config.tenant_keys.values())

    async def read_prefix(request: Request, schema: type[Prefix]) -> Prefix:
        """The call's body; from here on the call acts for the tenant it names, if any."""
        body = await ctx.body(request, schema)
        act_for_tenant(body.tenant, tenants)
        return body

    @router.get("/cache/tree")
    async def cache_tree(
        depth: int = Query(8, ge=1, le=MAX_TREE_DEPTH), min_tokens: int = Query(0, ge=0, le=2**31 - 1)
    ) -> dict[str, Any]:
        """The tree down to ``depth`` levels, subtrees under ``min_tokens`` folded, at most 512 nodes."""
        return await _cache_call(ctx, "cache_tree", {"depth": depth, "min_tokens": min_tokens})

    @router.post("/cache/warm", dependencies=admin)
    async def warm(request: Request) -> dict[str, Any]:
        body = await read_prefix(request, CachePrefixIn)
        return await _warm(ctx, request, body)

    @router.post("/cache/pin", dependencies=admin)
    async def pin(request: Request) -> dict[str, Any]:
        """Warm the prefix, then keep its pages from eviction for ``ttl_s`` seconds."""
        body = await read_prefix(request, PinIn)
        warmed = await _warm(ctx, request, body)
        return {**warmed, **await _cache_call(ctx, "cache_pin", body.router_args())}

    @router.delete("/cache/pin", dependencies=admin)
    async def unpin(request: Request) -> dict[str, Any]:
        body = await read_prefix(request, UnpinIn)
        answer = await _cache_call(ctx, "cache_unpin", body.router_args())
        if not answer["unpinned"]:
            raise ApiError(404, "no pin holds this prefix (pin and unpin must name the same prefix and cache_salt)")
        return answer

    @router.post("/cache/evict", dependencies=admin)
    async def evict(request: Request) -> dict[str, Any]:
        """Free the unlocked pages of every cached run that starts with the prefix."""
        body = await read_prefix(request, CachePrefixIn)
        return await _cache_call(ctx, "cache_evict", body.router_args())

    return router
