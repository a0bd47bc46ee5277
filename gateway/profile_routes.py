"""SGLang's profiler through the gateway: every available replica profiles at once under one
profile id, each one's traces named with ``DP-{i}`` (its index in GET /replicas), as SGLang
names its data-parallel ranks' traces, so replicas sharing a host and a directory keep them apart."""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import PlainTextResponse

from radixcluster.gateway.context import GatewayContext, available, each, failures, replica_indices
from radixcluster.gateway.upstream import fetch
from radixcluster.router.api.auth import admin_check
from radixcluster.router.api.control_schemas import ProfileIn
from radixcluster.router.api.errors import error_response, read_json


def gateway_profile_routes(ctx: GatewayContext) -> APIRouter:
    router = APIRouter()
    admin = [Depends(admin_check(ctx.config.admin_api_key))]

    @router.api_route("/start_profile", methods=["GET", "POST"], dependencies=admin)
    async def start_profile(request: Request) -> Response:
        """The body is checked here first, so a bad one is the same 400 as a replica's."""
        body = ProfileIn.model_validate(await read_json(request, ctx.config.max_body_bytes, empty_ok=True))
        body.profile_id = body.profile_id or str(time.time())
        prefix = f"{body.profile_prefix}-" if body.profile_prefix else ""
        replicas, index = available(ctx), replica_indices(ctx)
        headers = ctx.replicas.client_headers(request.headers)
        calls = []
        for replica in replicas:
            own = body.model_copy(update={"profile_prefix": f"{prefix}DP-{index[replica.url]}"})
            content = json.dumps(own.model_dump(exclude_none=True)).encode()
            calls.append(fetch(ctx.replicas.http, "POST", replica.url + "/start_profile", headers, content))
        answers = await asyncio.gather(*calls, return_exceptions=True)
        failed = failures(dict(zip((r.url for r in replicas), answers)))
        if failed:
            return error_response(400, f"the profile did not start everywhere: {failed}")
        return PlainTextResponse("Start profiling.\n")

    @router.api_route("/stop_profile", methods=["GET", "POST"], dependencies=admin)
    async def stop_profile(request: Request) -> Response:
        headers = ctx.replicas.client_headers(request.headers)
        failed = failures(await each(ctx, "POST", "/stop_profile", None, headers))
        if failed:
            return error_response(400, f"the profile did not stop everywhere: {failed}")
        return PlainTextResponse("Stop profiling. This will take some time.\n")

    return router
