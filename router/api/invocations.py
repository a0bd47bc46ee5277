"""SageMaker's ``POST /invocations`` (vLLM serves it, beside ``/ping``): the body says which call it
is, a chat (``messages``) or a completion (``prompt``), and the request goes on as that call, its
body read once and handed on unchanged. Raw ASGI in front of a server's app (a replica's api, the
gateway), so that the call is everything it would be on its own path: auth, drain, the gateway's
routing."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from radixcluster.router.api.errors import ApiError, failure_response, parse_json_for, receive_body, replayed

INVOCATIONS = "/invocations"
# the body's field that names the call, in the order vLLM tries them
_CALLS = (("messages", "/v1/chat/completions"), ("prompt", "/v1/completions"))


def invoked_path(body: bytes) -> str:
    """The path of the call a body of ``/invocations`` is; ApiError (400) when it is neither."""
    value = parse_json_for(f"POST {INVOCATIONS}", body)
    found = next((path for field, path in _CALLS if field in value), None)
    if found is None:
        raise ApiError(
            400,
            f"POST {INVOCATIONS}: the body is a chat (a JSON object with messages) or a completion (with prompt)",
        )
    return found


class Invocations:
    """Serves ``POST /invocations`` as the call its body is; passes everything else to ``app``."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self._app = app
        self._max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != INVOCATIONS or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        try:
            body = await receive_body(receive, Headers(scope=scope), self._max_body_bytes)
            path = invoked_path(body)
        except ClientDisconnect:
            return  # it left while sending its body: nobody to answer
        except ApiError as exc:
            await failure_response(exc, "POST", INVOCATIONS)(scope, receive, send)
            return
        await self._app({**scope, "path": path, "raw_path": path.encode()}, replayed(body, receive), send)
