"""Bearer-token authentication for the HTTP servers (a replica's api, the gateway)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from radixcluster.router.api.errors import error_response

# Load balancers probe this without credentials.
PUBLIC_PATHS = frozenset({"/health"})


class BearerAuth:
    """Refuse every request without ``Authorization: Bearer <key>``, except public paths;
    ``on_reject`` is told each refusal's status (a metric)."""

    def __init__(self, app: ASGIApp, api_key: str, on_reject: Callable[[int], None] | None = None) -> None:
        self._app = app
        self._expected = f"Bearer {api_key}".encode()
        self._on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                message = "missing API key" if not given else "invalid API key"
                if self._on_reject is not None:
                    self._on_reject(401)
                await error_response(401, f"{message}: send 'Authorization: Bearer <key>'")(scope, receive, send)
                return
        await self._app(scope, receive, send)
