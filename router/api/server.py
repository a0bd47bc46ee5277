"""The api process: the FastAPI app (native and OpenAI routes, auth, JSON errors) and its
uvicorn entry point, which serves until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from radixcluster import __version__
from radixcluster.router.api.auth import BearerAuth
from radixcluster.router.api.cluster_routes import cluster_routes
from radixcluster.router.api.context import API_DRAIN_S, ApiConfig, ApiContext
from radixcluster.router.api.control_routes import control_routes
from radixcluster.router.api.errors import install_error_handlers
from radixcluster.router.api.native_routes import native_routes
from radixcluster.router.api.openai_routes import openai_routes
from radixcluster.router.api.router_client import RouterClient

__all__ = ["ApiConfig", "create_app", "run_api_server"]

logger = logging.getLogger(__name__)


def create_app(config: ApiConfig) -> FastAPI:
    """The api app; its router client connects when the app starts (lifespan)."""
    ctx = ApiContext(config=config, client=RouterClient(config.request_address, config.output_address))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await ctx.client.start()
        try:
            yield
        finally:
            await ctx.client.close()

    app = FastAPI(title="radixcluster", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.include_router(native_routes(ctx))
    app.include_router(control_routes(ctx))
    app.include_router(openai_routes(ctx))
    app.include_router(cluster_routes(ctx))
    if config.api_key:
        app.add_middleware(BearerAuth, api_key=config.api_key)
    return app


def run_api_server(config: ApiConfig) -> None:
    """Serve the api on ``config.host:config.port``; return after the graceful shutdown that
    SIGTERM or SIGINT starts (in-flight requests get ``API_DRAIN_S``). Main thread only."""
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host=config.host,
            port=config.port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=API_DRAIN_S,
        )
    )
    # uvicorn re-raises the signal once it has shut down; a no-op handler beneath its own
    # turns that into a plain return.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    logger.info("api serving on http://%s:%d", config.host, config.port)
    server.run()
