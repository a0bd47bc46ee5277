"""HTTP errors of the api: one OpenAI-shaped JSON body for every failure (Anthropic's shape on
its Messages API's paths), and the handlers that turn exceptions (ours, pydantic's, Starlette's)
into it."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Message, Receive

from radixcluster.router.api.field_error import FieldError
from radixcluster.router.api.json_text import JsonResponse
from radixcluster.router.api.router_client import DuplicateRequestId, RouterError, RouterUnavailable

logger = logging.getLogger(__name__)

# the status of a request whose client left while sending its body (nginx's "client closed
# request"): nobody reads it, an access log shows it
CLIENT_CLOSED = 499

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
# Anthropic's names of the same statuses (its 529 "overloaded" is a 503 here)
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
ANTHROPIC_PATH = "/v1/messages"
SHUTTING_DOWN = "the server is shutting down"
# a 429 (queue full) or 503 (draining, workers restarting) asks the client to come back after this long
RETRY_AFTER_S = 1


class ApiError(Exception):
    """A failure with the HTTP status and message the client should see."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param  # the field at fault, when one is


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error")


def anthropic_path(path: str) -> bool:
    """Whether ``path`` is the Messages API's, whose clients read Anthropic's error shape."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def error_body(status: int, message: str, param: str | None = None, path: str = "") -> dict:
    """The JSON body of an error response to a call of ``path``: OpenAI's shape (``param``
    names the field at fault, when one is), or Anthropic's on the Messages API's paths."""
    if anthropic_path(path):
        kind = ANTHROPIC_ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None, path: str = "") -> JsonResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
    if status == 504:
        # the request's own deadline passed: the OpenAI and Anthropic SDKs retry any 5xx unless
        # told not to, which would run it again from the start each time
        headers = {"x-should-retry": "false"}
    return JsonResponse(error_body(status, message, param, path), status_code=status, headers=headers)


# pydantic's tags of union members in an error's location ("list[str]", "str", "constrained-int"
# for a bounded one); no field is named like one
_SCALAR_TAGS = {"str", "int", "float", "bool", "bytes", "none"}


def _is_tag(part: object) -> bool:
    text = str(part)
    return "[" in text or text in _SCALAR_TAGS or text.startswith("constrained-")


def _union_member(err: Any) -> tuple[tuple[str, ...], str] | None:
    """The union ``err`` came from, as (its field's path, the member's tag); None outside a union."""
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    for i, part in enumerate(loc):
        if _is_tag(part):
            return tuple(loc[:i]), part
    return None


def _helpful(errors: list[Any]) -> list[Any]:
    """The errors worth reporting. Where some members of a union failed only on values, not
    types, the input took their shape (``sampling_params`` a dict, not a list): only their
    errors stay, since the others' "should be a valid list" would hide what is wrong."""
    members = [_union_member(err) for err in errors]
    misfits = {m for err, m in zip(errors, members) if m and err.get("type", "").endswith("_type")}
    fitting = {m for m in members if m and m not in misfits}
    fitting_sites = {site for site, _ in fitting}
    return [err for err, m in zip(errors, members) if m is None or m[0] not in fitting_sites or m in fitting]


# a body read under another API's field names (Anthropic's Messages as a chat): each model's
# (pydantic's error title) client spellings of them, as (pattern over a dotted path, replacement)
_CLIENT_NAMES: dict[str, tuple[tuple[re.Pattern[str], str], ...]] = {}


def name_fields_as_sent(model: type, renames: dict[str, str]) -> None:
    """Errors in ``model``'s body name its fields as its clients send them: ``renames`` maps
    regular expressions over a field's dotted path (as the model reads it) to the client's."""
    _CLIENT_NAMES[model.__name__] = tuple((re.compile(pattern), name) for pattern, name in renames.items())


def _location(err: Any, title: str = "") -> str:
    """The dotted path of the field an error is about ("" for the whole body), as the client
    of the body's model (``title``) names it."""
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body" and not _is_tag(p))
    for pattern, name in _CLIENT_NAMES.get(title, ()):
        loc = pattern.sub(name, loc)
    return loc


def _param(err: Any, title: str = "") -> str:
    """The dotted path of the field an error is about, a FieldError's field included."""
    loc, cause = _location(err, title), (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError) and cause.field:
        return f"{loc}.{cause.field}" if loc else cause.field
    return loc


def _title(exc: ValidationError | RequestValidationError) -> str:
    return exc.title if isinstance(exc, ValidationError) else ""


def validation_param(exc: ValidationError | RequestValidationError) -> str | None:
    """The first offending field, as OpenAI's ``param`` names it (None: the whole body)."""
    return next((loc for err in _helpful(list(exc.errors())) if (loc := _param(err, _title(exc)))), None)


_BOUNDS = {"le": "less than or equal to", "ge": "greater than or equal to", "lt": "less than", "gt": "greater than"}


def describe_validation_error(exc: ValidationError | RequestValidationError) -> str:
    """One line naming each offending field and what is wrong with it."""
    parts: list[str] = []
    for err in _helpful(list(exc.errors())):
        loc = _location(err, _title(exc))
        msg = err.get("msg", "invalid value")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        elif err.get("type") == "value_error":
            msg = msg.removeprefix("Value error, ")  # pydantic's prefix to our validators' own words
        bound = next(((k, v) for k, v in (err.get("ctx") or {}).items() if k in _BOUNDS and isinstance(v, float)), None)
        if bound is not None:  # pydantic spells a float bound out in full: 3.4e38 in 39 digits
            msg = f"Input should be {_BOUNDS[bound[0]]} {bound[1]:g}"
        part = f"{loc}: {msg}" if loc else msg
        if part not in parts:
            parts.append(part)
    return "; ".join(parts) or "invalid request"


_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def parse_json(body: bytes) -> dict[str, Any]:
    """Decode a request body, as a 400 ApiError when it is not a JSON object, not valid unicode,
    or holds what a JSON parser should not take: NaN, Infinity or a float past the largest
    finite one (named by its field), an integer of more digits than Python converts."""
    non_finite: list[str] = []  # the literals Python's parser takes beyond JSON

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            non_finite.append(literal)
        return value

    try:
        value = json.loads(body, parse_constant=number, parse_float=number)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError among them
        raise ApiError(400, f"invalid JSON in the request body: {exc}") from None
    except RecursionError:
        raise ApiError(400, "invalid JSON in the request body: nested too deeply") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {_JSON_KINDS.get(type(value), 'null')}")
    if non_finite:
        field = first_path(value, lambda item: isinstance(item, float) and not math.isfinite(item)) or "the body"
        raise ApiError(400, f"{field}: {non_finite[0]} is not a finite number (JSON has no Infinity or NaN)", field)
    # a lone surrogate comes from a \u escape (a backslash byte in any of JSON's encodings) or
    # from its code unit's bytes (never ASCII): a body with neither needs no walk
    where = None if body.isascii() and b"\\" not in body else first_path(value, _unencodable)
    if where is not None:
        # a path through an object key may hold the surrogate itself: escaped, the message is UTF-8
        where = where.encode("utf-8", "backslashreplace").decode("utf-8")
        raise ApiError(400, f"{where or 'the body'}: invalid unicode (a lone surrogate such as \\ud800)")
    return value


def parse_json_for(call: str, body: bytes) -> dict[str, Any]:
    """parse_json for a call that answers under its own name (``POST /invocations: ...``)."""
    try:
        return parse_json(body)
    except ApiError as exc:
        raise ApiError(exc.status, f"{call}: {exc.message}") from None


def _unencodable(item: object) -> bool:
    """A string that holds an unpaired UTF-16 surrogate, which JSON's escapes can spell but no
    UTF-8 text holds."""
    if not isinstance(item, str):
        return False
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def lone_surrogate(value: object) -> str | None:
    """The dotted path of the first string (value or key) in ``value`` that holds an unpaired
    surrogate; None if none."""
    return first_path(value, _unencodable)


def first_path(value: object, bad: Callable[[object], bool]) -> str | None:
    """The dotted path of the first item of ``value`` (an object's keys included) that is
    ``bad``; "" for ``value`` itself, None if none."""
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if bad(item):
            return path
        if isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                stack.append((child_path, key))
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}" if path else str(i), child) for i, child in enumerate(item))
    return None


async def read_json(request: Request, max_bytes: int, empty_ok: bool = False) -> dict[str, Any]:
    """The request body, a JSON object, refused with 413 once it passes ``max_bytes``;
    ``empty_ok``: no body is ``{}`` (a call whose fields are all optional)."""
    body = await read_body(request, max_bytes, empty_ok)
    return parse_json(body) if body else {}


async def read_body(request: Request, max_bytes: int, empty_ok: bool = False) -> bytes:
    """The request body (not empty, unless ``empty_ok``), refused with 413 once it passes ``max_bytes``."""
    return await receive_body(request.receive, request.headers, max_bytes, empty_ok)


async def receive_body(receive: Receive, headers: Headers, max_bytes: int, empty_ok: bool = False) -> bytes:
    """The body of the request whose ``headers`` came with ``receive`` (raw ASGI), as
    ``read_body``; ClientDisconnect when the client leaves before sending all of it."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ApiError(415, f"a request body in Content-Encoding {encoding!r} is not supported: send it uncompressed")
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise ApiError(413, f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if size == 0 and not empty_ok:
        raise ApiError(400, "the request body is empty; send a JSON object")
    return b"".join(chunks)


def replayed(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` whole once (a body read ahead, or made anew), then what
    the client sends next (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def failure_response(exc: Exception, method: str, path: str) -> JsonResponse:
    """The error response to an exception raised while serving ``method path``; an unexpected
    one is logged, its details kept from whoever sent the request."""
    status, message, param = 500, "internal error (logged on the server)", None
    if isinstance(exc, ApiError):
        status, message, param = exc.status, exc.message, exc.param
    elif isinstance(exc, (ValidationError, RequestValidationError)):
        status, message, param = 400, describe_validation_error(exc), validation_param(exc)
    elif isinstance(exc, RouterUnavailable):
        status, message = 503, f"the router is unavailable: {exc}"
    elif isinstance(exc, RouterError):
        message = f"the router failed: {exc}"
    elif isinstance(exc, DuplicateRequestId):
        status, message = 400, str(exc)
    elif isinstance(exc, StarletteHTTPException):
        status, message = exc.status_code, _routing_message(exc, method, path)
    else:
        logger.exception("unhandled error on %s %s", method, path, exc_info=exc)
    return error_response(status, message, param, path)


_NOT_GENERATION = (
    "the served model generates text: embeddings, scores, reranking and classification are not served here"
)
# SGLang's, vLLM's and OpenAI's endpoints that this server does not serve, and why (their 404
# says it); a path under one of them too (/v1/files/ID, Ollama's /api/...)
NOT_SERVED = {
    **dict.fromkeys(
        ("/v1/embeddings", "/encode", "/classify", "/v1/classify", "/pooling", "/score", "/v1/score", "/rerank")
        + ("/v1/rerank", "/v2/rerank"),
        _NOT_GENERATION,
    ),
    "/v1/audio": "the served model reads and writes text: audio is not served here",
    "/v1/images": "the served model writes text: images are not generated here",
    "/v1/moderations": "moderation is not served here",
    **dict.fromkeys(
        ("/open_session", "/close_session"), "sessions are not supported (the radix cache shares prefixes without them)"
    ),
    "/api": "Ollama's API is not served here: use /v1/chat/completions or /v1/completions",
    **dict.fromkeys(
        ("/v1/batches", "/v1/files"), "the OpenAI Batch API is not served here: send the requests themselves"
    ),
}


def _not_served(path: str) -> str | None:
    """Why ``path`` or a path above it is in NOT_SERVED, or None."""
    parts = path.rstrip("/").split("/")
    return next((NOT_SERVED[p] for n in range(len(parts), 1, -1) if (p := "/".join(parts[:n])) in NOT_SERVED), None)


def _routing_message(exc: StarletteHTTPException, method: str, path: str) -> str:
    """Starlette's routing refusals ("Not Found", "Method Not Allowed") said with the call."""
    if exc.status_code == 404 and exc.detail == "Not Found":
        return f"{method} {path}: {_not_served(path) or 'no such endpoint on this server'}"
    allowed = (exc.headers or {}).get("Allow")
    if exc.status_code == 405 and allowed:
        # Starlette lists a route's methods in a set's order, which changes from run to run
        methods = ", ".join(sorted(m.strip() for m in allowed.split(",")))
        return f"{method} {path}: not allowed; this endpoint takes {methods}"
    return str(exc.detail)


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None] | None = None) -> None:
    """Route every exception to a JSON error body; the server keeps serving. ``on_error`` is
    told the status of each (the rejection metrics)."""

    async def handle(request: Request, exc: Exception) -> JsonResponse:
        response = failure_response(exc, request.method, request.url.path)
        if on_error is not None:
            on_error(response.status_code)
        return response

    async def left(request: Request, exc: Exception) -> Response:
        return Response(status_code=CLIENT_CLOSED)  # not an error: no traceback, no refusal counted

    # Starlette picks a handler by the exception's class: every class that has a response of
    # its own, and Exception for the rest (whose handler answers, and then the exception goes
    # on to the server, which logs it again)
    answered = (ApiError, ValidationError, RequestValidationError, RouterUnavailable, RouterError, DuplicateRequestId)
    for kind in (*answered, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, handle)
    app.add_exception_handler(ClientDisconnect, left)
