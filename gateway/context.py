"""What every gateway route needs (the configuration, the replicas, the prompt reader, the
forwarder, the metrics) and the ways a route reaches its replicas: a request forwarded where
the routing places it, a question to the replica it names, or to each available one at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

from fastapi import Response
from starlette.datastructures import Headers
from starlette.types import Receive

from radixcluster.gateway.config import GatewayConfig
from radixcluster.gateway.forwarding import Forwarder
from radixcluster.gateway.metrics import GatewayMetrics
from radixcluster.gateway.prompts import CACHE_KINDS, PromptReader
from radixcluster.gateway.replica import Replica
from radixcluster.gateway.replica_set import ReplicaSet
from radixcluster.gateway.upstream import Answer, fetch
from radixcluster.router.api.auth import act_for_tenant, current_tenant
from radixcluster.router.api.errors import ApiError, parse_json, receive_body


@dataclass(slots=True)
class GatewayContext:
    config: GatewayConfig
    replicas: ReplicaSet
    reader: PromptReader
    forwarder: Forwarder
    metrics: GatewayMetrics


async def forward(ctx: GatewayContext, receive: Receive, headers: Headers, path: str, kind: str) -> Response:
    """Read the request (``headers`` and ``receive``, raw ASGI: FastAPI's routes and the fast
    path both call this) as ``kind``, for the tenant of the client's key, and forward it to
    ``path`` on the replica the routing picks."""
    arrived = time.perf_counter()
    raw = await receive_body(receive, headers, ctx.config.max_body_bytes)
    body = parse_json(raw)
    if kind in CACHE_KINDS:  # a cache-control call may act for a tenant it names
        act_for_tenant(CACHE_KINDS[kind].model_validate(body).tenant, ctx.config.tenant_keys.values())
    routed = ctx.reader.read(kind, body, current_tenant.get())
    return await ctx.forwarder.forward(receive, headers, path, routed, raw, arrived)


def available(ctx: GatewayContext) -> list[Replica]:
    """The available replicas, least loaded first; 503 when there is none."""
    found = sorted((r for r in ctx.replicas.list() if r.available), key=lambda r: r.load.tokens)
    if not found:
        raise ApiError(503, "no replica is available")
    return found


def replica_indices(ctx: GatewayContext) -> dict[str, int]:
    """Each replica's index in GET /replicas, by URL (SGLang's DP rank, where one is named)."""
    return {r.url: i for i, r in enumerate(ctx.replicas.list())}


def named(replicas: list[Replica], name: str | None) -> Replica:
    """The replica ``name`` gives (its URL, or its index in the gateway's list, from 0), or the
    first available one when None; 404 for a name that is neither, 503 when it is down."""
    if name is None:
        found = next((r for r in replicas if r.available), None)
        if found is None:
            raise ApiError(503, "no replica is available")
        return found
    by_index = {str(i): r for i, r in enumerate(replicas)}
    by_url = {r.url: r for r in replicas}
    found = by_index.get(name) or by_url.get(name.rstrip("/"))
    if found is None:
        raise ApiError(404, f"no replica {name!r}: name one by its URL or its index in GET /replicas")
    if not found.available:
        why = f": {found.last_error}" if found.last_error else ""
        raise ApiError(503, f"replica {found.url} is not available{why}")
    return found


async def each(
    ctx: GatewayContext,
    method: str,
    path: str,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> dict[str, Answer | BaseException]:
    """Ask every available replica, concurrently (with the gateway's key unless ``headers``)."""
    replicas = available(ctx)
    sent = ctx.replicas.headers if headers is None else headers
    answers = await asyncio.gather(
        *(fetch(ctx.replicas.http, method, r.url + path, sent, content) for r in replicas),
        return_exceptions=True,
    )
    return dict(zip((r.url for r in replicas), answers))


def failures(answers: Mapping[str, Answer | BaseException]) -> str | None:
    """The replicas that did not answer 200, and why; None when all did."""
    failed = {
        url: (a.text if isinstance(a, Answer) else f"{type(a).__name__}: {a}")
        for url, a in answers.items()
        if not isinstance(a, Answer) or a.status != 200
    }
    if not failed:
        return None
    return f"{len(failed)} of {len(answers)} replicas failed: " + "; ".join(f"{u}: {why}" for u, why in failed.items())


def passed_on(answer: Answer) -> Response:
    """A replica's answer as it is: its status, body and media type."""
    return Response(answer.content, answer.status, media_type=answer.content_type)
