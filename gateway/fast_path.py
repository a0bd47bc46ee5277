"""The generation routes as raw ASGI in front of the FastAPI app: the gateway's hot path skips
FastAPI's middleware, routing and dependency injection; every other request goes on to it."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from radixcluster.gateway.context import GatewayContext, forward
from radixcluster.gateway.prompts import CHAT, COMPLETIONS, MESSAGES, NATIVE, RESPONSES
from radixcluster.router.api.errors import failure_response

# The FastAPI app declares these routes too, for what it answers about them (405 to another
# method, the redirect of a path with a trailing slash, the OpenAPI schema); a POST to one of
# these exact paths is served here and never reaches it.
GENERATION_ROUTES = {
    "/generate": NATIVE,
    "/v1/completions": COMPLETIONS,
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
}


class FastPath:
    """Serves ``POST`` to the generation routes with the same ``forward`` as FastAPI's routes
    and the same error responses; passes everything else (the lifespan too) to ``app``."""

    def __init__(self, ctx: GatewayContext, app: ASGIApp) -> None:
        self._ctx = ctx
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")  # a lifespan scope has none
        kind = GENERATION_ROUTES.get(path) if scope["type"] == "http" and scope["method"] == "POST" else None
        if kind is None:
            await self._app(scope, receive, send)
            return
        try:
            response = await forward(self._ctx, receive, Headers(scope=scope), path, kind)
        except ClientDisconnect:
            return  # it left while sending its body: nobody to answer
        except Exception as exc:
            response = failure_response(exc, "POST", path)
        await response(scope, receive, send)
