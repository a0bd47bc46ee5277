"""Bearer-token authentication for the HTTP servers (a replica's api, the gateway), the tenant
a key names (--api-key-file), and browsers' cross-origin calls. Anthropic's clients send the key
as ``x-api-key``, which counts as the same bearer token."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Collection
from contextvars import ContextVar

from fastapi import Request
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from radixcluster.router.api.errors import ApiError, error_response

# Load balancers probe /health without credentials; the cache page's files hold no data (the
# page asks for the key, and sends it with the calls that fetch the data).
PUBLIC_PATHS = frozenset({"/health", "/ping", "/ready", "/cache", "/cache/page.js", "/cache/page.css"})


def cross_origin(app: ASGIApp) -> ASGIApp:
    """``app`` callable from a web page of any origin, as SGLang and vLLM serve by default: a
    browser's preflight is answered before the key is checked, and every answer, errors included,
    tells the browser it may read it. The key, where there is one, is what guards the server."""
    return CORSMiddleware(app, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])


# The tenant of the request being served, set by BearerAuth for the task that serves it (and the
# tasks it starts): the one place every generation passes (run_generation) reads it, so no route
# can forget to send it.
current_tenant: ContextVar[str | None] = ContextVar("current_tenant", default=None)


def _bearer(key: str) -> bytes:
    return f"Bearer {key}".encode()


def presented_key(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The credentials of a request (its raw ASGI headers) as an Authorization header: its own,
    else its ``x-api-key`` as a bearer token; empty when it has neither."""
    found = dict(headers)
    if b"authorization" in found:
        return found[b"authorization"]
    key = found.get(b"x-api-key")
    return b"Bearer " + key if key is not None else b""


def _digest(header: bytes) -> bytes:
    # keys are looked up by a hash of the header: the lookup's time says nothing about any key
    return hashlib.sha256(header).digest()


class BearerAuth:
    """Refuse every request without ``Authorization: Bearer <key>`` (or ``x-api-key: <key>``),
    except public paths; the
    keys are the API key, the admin key and the tenants' keys (``tenant_keys``: key -> tenant),
    whichever are set. A tenant's key makes its tenant ``current_tenant``. ``on_reject`` is
    told each refusal's status (a metric)."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        on_reject: Callable[[int], None] | None = None,
        admin_key: str | None = None,
        tenant_keys: dict[str, str] | None = None,
    ) -> None:
        self._app = app
        self._tenants: dict[bytes, str | None] = {_digest(_bearer(k)): None for k in (api_key, admin_key) if k}
        self._tenants.update({_digest(_bearer(k)): t for k, t in (tenant_keys or {}).items()})
        self._on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            given = presented_key(scope["headers"])
            found = _digest(given)
            if found in self._tenants:
                current_tenant.set(self._tenants[found])
            else:
                message = "missing API key" if not given else "invalid API key"
                if self._on_reject is not None:
                    self._on_reject(401)
                hint = f"{message}: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                await error_response(401, hint, path=scope["path"])(scope, receive, send)
                return
        await self._app(scope, receive, send)


def act_for_tenant(named: str | None, tenants: Collection[str]) -> None:
    """Make ``named`` the tenant a cache-control call acts for. Only a key without a tenant (the
    API key, the admin key) may name one, and only one the key file has: with tenants and an admin
    key, the admin pins and evicts inside a tenant's namespace this way."""
    if named is None:
        return
    caller = current_tenant.get()
    if caller is not None and caller != named:
        raise ApiError(403, "a tenant's key acts for its own tenant only; leave 'tenant' out")
    if named not in tenants:
        raise ApiError(400, f"tenant {named!r} is not in the --api-key-file")
    current_tenant.set(named)


def holds_admin(admin_key: str | None, request: Request) -> bool:
    """Whether ``request`` may make the admin's calls: there is no admin key, or it carries it."""
    return admin_key is None or hmac.compare_digest(presented_key(request.scope["headers"]), _bearer(admin_key))


def admin_check(admin_key: str | None) -> Callable[[Request], None]:
    """A route dependency: with an admin key, refuse (401) a call that does not carry it."""

    def check(request: Request) -> None:
        if not holds_admin(admin_key, request):
            raise ApiError(
                401,
                "this call (cache control or profiling) needs the admin key: send 'Authorization: Bearer <admin key>'",
            )

    return check
