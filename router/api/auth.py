"""Bearer-token authentication for the HTTP servers (a replica's api, the gateway)."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from radixcluster.router.api.errors import ApiError, error_response

# Load balancers probe /health without credentials; the cache page's files hold no data (the
# page asks for the key, and sends it with the calls that fetch the data).
PUBLIC_PATHS = frozenset({"/health", "/cache", "/cache/page.js", "/cache/page.css"})


def _bearer(key: str) -> bytes:
    return f"Bearer {key}".encode()


class BearerAuth:
    """Refuse every request without ``Authorization: Bearer <key>``, except public paths;
    the admin key, when there is one, is accepted too. ``on_reject`` is told each refusal's
    status (a metric)."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str,
        on_reject: Callable[[int], None] | None = None,
        admin_key: str | None = None,
    ) -> None:
        self._app = app
        self._accepted = [_bearer(k) for k in (api_key, admin_key) if k]
        self._on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            # every key is compared, so the time taken says nothing about which one was close
            if not sum(hmac.compare_digest(given, key) for key in self._accepted):
                message = "missing API key" if not given else "invalid API key"
                if self._on_reject is not None:
                    self._on_reject(401)
                await error_response(401, f"{message}: send 'Authorization: Bearer <key>'")(scope, receive, send)
                return
        await self._app(scope, receive, send)


def admin_check(admin_key: str | None) -> Callable[[Request], None]:
    """A route dependency: with an admin key, refuse (401) a call that does not carry it."""

    def check(request: Request) -> None:
        if admin_key is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, _bearer(admin_key)):
            raise ApiError(401, "this cache-control call needs the admin key: send 'Authorization: Bearer <admin key>'")

    return check
