"""What a gateway in front of several replicas asks this one: its load, polled for routing and
health (ours, and SGLang's ``/get_load``, which its router polls), and a snapshot of the block
names its radix tree holds, to resync from when it missed some of the tree events the router
publishes."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Response

from radixcluster.router.api.context import ApiContext
from radixcluster.router.api.errors import error_response
from radixcluster.router.api.router_client import RouterError

LOAD_KEYS = (
    "running_requests",
    "waiting_requests",
    "prefilling_tokens",
    "waiting_tokens",
    "tree_events_instance",
    "tree_events_seq",
)


def cluster_routes(ctx: ApiContext) -> APIRouter:
    router = APIRouter()

    @router.get("/load")
    async def load() -> dict[str, Any]:
        """Requests and prompt tokens still to compute, and the last tree event published (its
        number is None when the router publishes none); and vLLM's ``server_load``, the
        generations this api has in flight, which load balancers that know vLLM poll."""
        stats = await ctx.client.control("stats")
        return {**{key: stats.get(key) for key in LOAD_KEYS}, "server_load": ctx.client.in_flight}

    @router.get("/get_load")
    async def get_load() -> list[dict[str, int]]:
        """SGLang's: one entry per DP rank (a replica is one), the tokens counted as its
        scheduler counts them: KV in use, less what the tree could evict, plus the waiting
        prompts."""
        stats = await ctx.client.control("stats")
        used = (stats["num_pages"] - stats["free_pages"]) * stats["page_size"] - stats["evictable_tokens"]
        waiting = stats["waiting_requests"]
        return [
            {
                "dp_rank": 0,
                "num_reqs": stats["running_requests"] + waiting,
                "num_waiting_reqs": waiting,
                "num_tokens": max(used, 0) + stats["waiting_tokens"],
            }
        ]

    @router.get("/cache_blocks", response_model=None)
    async def cache_blocks() -> dict[str, Any] | Response:
        """``blocks``: the uint64 block names, little-endian, base64 (8 bytes each)."""
        try:
            snapshot = await ctx.client.control("cache_blocks")
        except RouterError as exc:
            return error_response(404, str(exc))
        names = snapshot["blocks"].astype("<u8").tobytes()
        return {**snapshot, "blocks": base64.b64encode(names).decode()}

    return router
