"""The gateway process: its FastAPI app (the routes, auth with the replicas' keys, JSON errors)
and the uvicorn entry point, which serves until SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from radixcluster import __version__
from radixcluster.gateway.cache_routes import gateway_cache_routes
from radixcluster.gateway.config import GatewayConfig
from radixcluster.gateway.context import GatewayContext
from radixcluster.gateway.fast_path import FastPath
from radixcluster.gateway.forwarding import Forwarder
from radixcluster.gateway.metrics import GatewayMetrics
from radixcluster.gateway.profile_routes import gateway_profile_routes
from radixcluster.gateway.prompts import PromptReader
from radixcluster.gateway.replica_set import ReplicaSet
from radixcluster.gateway.routes import gateway_routes
from radixcluster.gateway.routing import ReplicaChooser
from radixcluster.log_format import configure_logging
from radixcluster.model_config import load_model_config
from radixcluster.router.api.auth import BearerAuth, cross_origin
from radixcluster.router.api.draining import FAIL_FLUSH_S, DrainingServer, RequestDrain
from radixcluster.router.api.errors import install_error_handlers
from radixcluster.router.api.http_protocol import GuardedHttpProtocol
from radixcluster.router.api.invocations import Invocations
from radixcluster.router.api.openapi import distinct_operation_ids
from radixcluster.router.api.vertex import VertexPredict, predict_route
from radixcluster.router.text.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


def create_app(config: GatewayConfig, drain: RequestDrain | None = None) -> ASGIApp:
    """The gateway app: the drain's gate (``drain``, which run_gateway's server drives), the auth
    check, then the fast path of the generation routes, then FastAPI for the rest; it starts
    watching the replicas (and opens its connections to them) when the app starts (lifespan)."""
    replicas = ReplicaSet(config)
    metrics = GatewayMetrics()
    ctx = GatewayContext(
        config=config,
        replicas=replicas,
        reader=PromptReader(
            load_tokenizer(config.tokenizer_path or config.model_path, config.chat_template),
            load_model_config(config.model_path).context_limit,
        ),
        forwarder=Forwarder(replicas, ReplicaChooser(config.routing), metrics, config.max_body_bytes),
        metrics=metrics,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await replicas.start()
        try:
            yield
        finally:
            await replicas.close()

    app = FastAPI(title="radixcluster gateway", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    distinct_operation_ids(app)
    app.include_router(gateway_routes(ctx))
    app.include_router(gateway_cache_routes(ctx))
    app.include_router(gateway_profile_routes(ctx))
    # SageMaker's and Vertex AI's calls go the fast path as the calls they are
    served: ASGIApp = VertexPredict(
        Invocations(FastPath(ctx, app), config.max_body_bytes), config.max_body_bytes, predict_route()
    )
    if config.api_key or config.tenant_keys:
        # the fast path and FastAPI's routes see the same tenant (current_tenant)
        served = BearerAuth(
            served, api_key=config.api_key, admin_key=config.admin_api_key, tenant_keys=config.tenant_keys
        )
    return cross_origin((drain or RequestDrain()).gate(served))


def run_gateway(config: GatewayConfig, on_listening: Callable[[], None] | None = None) -> None:
    """Serve the gateway on ``config.host:config.port`` until SIGTERM or SIGINT (requests in
    flight get ``config.shutdown_timeout_s``); ``on_listening`` is called once it listens. Main
    thread only."""
    configure_logging(config.log_level)
    drain = RequestDrain()
    server = DrainingServer(
        uvicorn.Config(
            create_app(config, drain),
            host=config.host,
            port=config.port,
            log_config=None,
            access_log=False,
            http=GuardedHttpProtocol,
            # by the time uvicorn shuts down, every response is complete or ended with an error
            timeout_graceful_shutdown=FAIL_FLUSH_S,
        ),
        drain,
        config.shutdown_timeout_s,
        on_listening,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)  # uvicorn's handlers decide; this one only makes its re-raise a return
    logger.info("gateway serving on http://%s:%d", config.host, config.port)
    server.run()
