"""The api process: the FastAPI app (native and OpenAI routes, auth, JSON errors) and its
uvicorn entry point, which serves until SIGTERM or SIGINT and then drains: readiness and new
requests answer 503 while the requests in flight finish, for up to the shutdown timeout; those
still running then end with an error, and the process exits."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from radixcluster import __version__
from radixcluster.log_format import configure_logging
from radixcluster.router.api.auth import BearerAuth, cross_origin
from radixcluster.router.api.cache_routes import cache_routes
from radixcluster.router.api.cluster_routes import cluster_routes
from radixcluster.router.api.context import ApiConfig, ApiContext
from radixcluster.router.api.control_routes import control_routes
from radixcluster.router.api.draining import FAIL_FLUSH_S, DrainingServer, refused_while_draining
from radixcluster.router.api.errors import install_error_handlers
from radixcluster.router.api.http_protocol import GuardedHttpProtocol
from radixcluster.router.api.invocations import Invocations
from radixcluster.router.api.messages_routes import messages_routes
from radixcluster.router.api.native_routes import native_routes
from radixcluster.router.api.openai_routes import openai_routes
from radixcluster.router.api.openapi import distinct_operation_ids
from radixcluster.router.api.parser_routes import parser_routes
from radixcluster.router.api.responses_routes import responses_routes
from radixcluster.router.api.router_client import RouterClient
from radixcluster.router.api.vertex import VertexPredict, predict_route

__all__ = ["ApiConfig", "create_app", "run_api_server"]

logger = logging.getLogger(__name__)


class DrainGate:
    """While the api drains, refuse new requests (and readiness) with 503, so load balancers
    send them elsewhere while the requests in flight finish."""

    def __init__(self, app: ASGIApp, ctx: ApiContext) -> None:
        self._app = app
        self._ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await refused_while_draining(self._ctx.draining, scope, receive, send):
            self._ctx.metrics.count_rejection(503)
            return
        await self._app(scope, receive, send)


def create_app(config: ApiConfig) -> FastAPI:
    """The api app (its context on ``app.state.ctx``); its router client connects when the app
    starts (lifespan)."""
    ctx = ApiContext(config=config, client=RouterClient(config.request_address, config.output_address))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await ctx.client.start()
        try:
            yield
        finally:
            await ctx.client.close()

    app = FastAPI(title="radixcluster", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.ctx = ctx
    install_error_handlers(app, ctx.metrics.count_rejection)
    distinct_operation_ids(app)
    app.include_router(native_routes(ctx))
    app.include_router(control_routes(ctx))
    app.include_router(parser_routes(ctx))
    app.include_router(openai_routes(ctx))
    app.include_router(responses_routes(ctx))
    app.include_router(messages_routes(ctx))
    app.include_router(cluster_routes(ctx))
    app.include_router(cache_routes(ctx))
    # inside the auth: a body is read only for a caller with a key
    app.add_middleware(Invocations, max_body_bytes=config.max_body_bytes)
    route = predict_route()
    own = {"type": "http", "path": route, "method": "POST", "root_path": ""}
    if any(r.matches(own)[0] is not Match.NONE for r in app.routes):
        # as in SGLang, whose own route, registered first, wins
        logger.warning("$AIP_PREDICT_ROUTE is %s, a route of this server's own: it serves that, not predictions", route)
    else:
        app.add_middleware(VertexPredict, max_body_bytes=config.max_body_bytes, route=route)
    if config.api_key or config.tenant_keys:
        app.add_middleware(
            BearerAuth,
            api_key=config.api_key,
            on_reject=ctx.metrics.count_rejection,
            admin_key=config.admin_api_key,
            tenant_keys=config.tenant_keys,
        )
    app.add_middleware(DrainGate, ctx=ctx)
    app.add_middleware(cross_origin)  # added last: runs first
    return app


def run_api_server(config: ApiConfig) -> None:
    """Serve the api on ``config.host:config.port``; return once SIGTERM or SIGINT has drained it
    (see DrainingServer). Main thread only."""
    configure_logging(config.log_level)  # a spawned process: nothing of the launcher's is inherited
    app = create_app(config)
    server = DrainingServer(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_config=None,
            access_log=False,
            http=GuardedHttpProtocol,
            # by the time uvicorn shuts down, every response is complete or ended with an error
            timeout_graceful_shutdown=FAIL_FLUSH_S,
        ),
        app.state.ctx,
        config.shutdown_timeout_s,
    )
    logger.info("api serving on http://%s:%d", config.host, config.port)
    server.run()
