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
# SGLang's /generate takes PUT too (forwarded as a POST)
_ALSO_PUT = {"/generate"}


def generation_methods(path: str) -> list[str]:
    """The methods a generation route is served on."""
    return ["POST", "PUT"] if path in _ALSO_PUT else ["POST"]


class FastPath:
    """Serves the generation routes (on ``generation_methods``) with the same ``forward`` as FastAPI's routes
    and the same error responses; passes everything else (the lifespan too) to ``app``."""

    def __init__(self, ctx: GatewayContext, app: ASGIApp) -> None:
        self._ctx = ctx
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")  # a lifespan scope has none
        served = scope["type"] == "http" and scope["method"] in generation_methods(path)
        kind = GENERATION_ROUTES.get(path) if served else None
        if kind is None:
            await self._app(scope, receive, send)
            return
        try:
            response = await forward(self._ctx, receive, Headers(scope=scope), path, kind)
        except ClientDisconnect:
            return  # it left while sending its body: nobody to answer
        except Exception as exc:
            response = failure_response(exc, scope["method"], path)
        await response(scope, receive, send)
