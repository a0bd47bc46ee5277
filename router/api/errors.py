"""HTTP errors of the api: one OpenAI-shaped JSON body for every failure, and the handlers
that turn exceptions (ours, pydantic's, Starlette's) into it."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixcluster.router.api.router_client import DuplicateRequestId, RouterError, RouterUnavailable

logger = logging.getLogger(__name__)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "method_not_allowed",
    413: "request_too_large",
    500: "internal_server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """A failure with the HTTP status and message the client should see."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> dict:
    """The JSON body of every error response (OpenAI's shape)."""
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error")
    return {"error": {"message": message, "type": kind, "code": status}}


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def describe_validation_error(exc: ValidationError | RequestValidationError) -> str:
    """One line naming each offending field and what is wrong with it."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
        msg = err.get("msg", "invalid value")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"


def parse_json(body: bytes) -> object:
    """Decode a request body, as a 400 ApiError when it is not JSON."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"invalid JSON in the request body: {exc}") from None


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


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception to a JSON error body; the server keeps serving."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message)

    @app.exception_handler(ValidationError)
    async def _validation(_: Request, exc: ValidationError) -> JSONResponse:
        return error_response(400, describe_validation_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, describe_validation_error(exc))

    @app.exception_handler(RouterUnavailable)
    async def _unavailable(_: Request, exc: RouterUnavailable) -> JSONResponse:
        return error_response(503, f"the router is unavailable: {exc}")

    @app.exception_handler(RouterError)
    async def _router_error(_: Request, exc: RouterError) -> JSONResponse:
        return error_response(500, f"the router failed: {exc}")

    @app.exception_handler(DuplicateRequestId)
    async def _duplicate(_: Request, exc: DuplicateRequestId) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
