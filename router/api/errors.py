"""HTTP errors of the api: one OpenAI-shaped JSON body for every failure, and the handlers
that turn exceptions (ours, pydantic's, Starlette's) into it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixcluster.router.api.router_client import DuplicateRequestId, RouterError, RouterUnavailable

logger = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "method_not_allowed",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    500: "internal_server_error",
    503: "service_unavailable",
    504: "deadline_exceeded",
}
# a 429 (queue full) or 503 (draining, workers restarting) asks the client to come back after this long
RETRY_AFTER_S = 1


class ApiError(Exception):
    """A failure with the HTTP status and message the client should see."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error")


def error_body(status: int, message: str) -> dict:
    """The JSON body of every error response (OpenAI's shape)."""
    return {"error": {"message": message, "type": error_type(status), "code": status}}


def error_response(status: int, message: str) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
    return JSONResponse(error_body(status, message), status_code=status, headers=headers)


def describe_validation_error(exc: ValidationError | RequestValidationError) -> str:
    """One line naming each offending field and what is wrong with it (pydantic's names of
    union members, such as ``list[constrained-int]``, left out of the field's path)."""
    parts: list[str] = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body" and "[" not in str(p))
        msg = err.get("msg", "invalid value")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        part = f"{loc}: {msg}" if loc else msg
        if part not in parts:
            parts.append(part)
    return "; ".join(parts) or "invalid request"


def parse_json(body: bytes) -> object:
    """Decode a request body, as a 400 ApiError when it is not JSON or not valid unicode."""
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"invalid JSON in the request body: {exc}") from None
    except RecursionError:
        raise ApiError(400, "invalid JSON in the request body: nested too deeply") from None
    where = lone_surrogate(value)
    if where is not None:
        # a path through an object key may hold the surrogate itself: escaped, the message is UTF-8
        where = where.encode("utf-8", "backslashreplace").decode("utf-8")
        raise ApiError(400, f"{where or 'the body'}: invalid unicode (a lone surrogate such as \\ud800)")
    return value


def lone_surrogate(value: object) -> str | None:
    """The dotted path of the first string (value or key) in ``value`` that holds an unpaired
    UTF-16 surrogate, which JSON's escapes can spell but no UTF-8 text holds; None if none."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                stack.append((child_path, key))
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}" if path else str(i), child) for i, child in enumerate(item))
    return None


async def read_json(request: Request, max_bytes: int) -> object:
    """The request body as JSON, refused with 413 once it passes ``max_bytes``."""
    return parse_json(await read_body(request, max_bytes))


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body (not empty), refused with 413 once it passes ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    if size == 0:
        raise ApiError(400, "the request body is empty; send a JSON object")
    return b"".join(chunks)


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None] | None = None) -> None:
    """Route every exception to a JSON error body; the server keeps serving. ``on_error`` is
    told the status of each (the rejection metrics)."""

    def reply(status: int, message: str) -> JSONResponse:
        if on_error is not None:
            on_error(status)
        return error_response(status, message)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return reply(exc.status, exc.message)

    @app.exception_handler(ValidationError)
    async def _validation(_: Request, exc: ValidationError) -> JSONResponse:
        return reply(400, describe_validation_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return reply(400, describe_validation_error(exc))

    @app.exception_handler(RouterUnavailable)
    async def _unavailable(_: Request, exc: RouterUnavailable) -> JSONResponse:
        return reply(503, f"the router is unavailable: {exc}")

    @app.exception_handler(RouterError)
    async def _router_error(_: Request, exc: RouterError) -> JSONResponse:
        return reply(500, f"the router failed: {exc}")

    @app.exception_handler(DuplicateRequestId)
    async def _duplicate(_: Request, exc: DuplicateRequestId) -> JSONResponse:
        return reply(400, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return reply(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        # the details are for the operator's log, not for whoever sent the request
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return reply(500, "internal error (logged on the server)")
