"""Vertex AI's prediction call, as SGLang serves it on ``$AIP_PREDICT_ROUTE`` (else
``/vertex_generate``): ``{"instances": [{"text": ...}, ...], "parameters": {...}}`` is one native
``/generate`` of the instances' prompts, its answers returned as ``{"predictions": [...]}``. Raw
ASGI in front of a server's app (a replica's api, the gateway), as /invocations is, so that the
call is everything ``/generate`` is: auth, drain, the gateway's routing, a stream."""

from __future__ import annotations

import json
import os
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixcluster.router.api.errors import ApiError, failure_response, parse_json_for, receive_body, replayed
from radixcluster.router.api.json_text import JsonResponse

PREDICT_ROUTE_ENV = "AIP_PREDICT_ROUTE"
DEFAULT_PREDICT_ROUTE = "/vertex_generate"
GENERATE = "/generate"
# an instance's prompt, the first of these the first instance has (SGLang's order); image_data
# goes on too, for /generate to refuse by name
_PROMPTS = ("text", "input_ids")
_SHAPE = 'the body is {"instances": [{"text": ...}, ...], "parameters": {...}}'


def predict_route() -> str:
    """Where Vertex AI sends predictions to this container."""
    return os.environ.get(PREDICT_ROUTE_ENV) or DEFAULT_PREDICT_ROUTE


def generate_body(body: bytes, route: str) -> dict[str, Any] | None:
    """The /generate body of a prediction call; None when it has no instances (answered []).
    ApiError (400) when it is not a prediction call."""
    value = parse_json_for(f"POST {route}", body)
    instances, parameters = value.get("instances") or [], value.get("parameters") or {}
    if not isinstance(instances, list) or not all(isinstance(i, dict) for i in instances):
        raise ApiError(400, f"POST {route}: instances must be a list of objects; {_SHAPE}")
    if not isinstance(parameters, dict):
        raise ApiError(400, f"POST {route}: parameters must be an object; {_SHAPE}")
    if not instances:
        return None
    key = next((k for k in _PROMPTS if instances[0].get(k)), None)
    if key is None:
        raise ApiError(400, f"POST {route}: each instance has a text or input_ids")
    inputs = {key: [i.get(key) for i in instances]}
    if any("image_data" in i for i in instances):
        inputs["image_data"] = [i.get("image_data") for i in instances]
    clash = sorted(inputs.keys() & parameters.keys())
    if clash:
        raise ApiError(400, f"POST {route}: {', '.join(clash)} belongs in the instances, not the parameters")
    return {**parameters, **inputs}


class VertexPredict:
    """Serves ``POST route`` as /generate of its instances, wrapping a JSON answer in
    ``{"predictions": ...}`` (a stream, or an error, goes back as /generate sent it); passes
    everything else to ``app``."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, route: str) -> None:
        self._app = app
        self._max_body_bytes = max_body_bytes
        self._route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self._route or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        try:
            generate = generate_body(
                await receive_body(receive, Headers(scope=scope), self._max_body_bytes), self._route
            )
        except ClientDisconnect:
            return  # it left while sending its body: nobody to answer
        except ApiError as exc:
            await failure_response(exc, "POST", self._route)(scope, receive, send)
            return
        if generate is None:
            await JsonResponse([])(scope, receive, send)
            return
        body = json.dumps(generate).encode()
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        inner = {**scope, "path": GENERATE, "raw_path": GENERATE.encode(), "headers": headers}
        await self._app(inner, replayed(body, receive), _Predictions(send))


class _Predictions:
    """The ``send`` of /generate's answer: a 200 JSON answer is held whole and sent again as
    ``{"predictions": answer}``; anything else passes as it comes."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._start: Message | None = None  # a JSON answer's start, held
        self._body = bytearray()

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            content_type = Headers(raw=message.get("headers", [])).get("content-type", "")
            if message["status"] == 200 and content_type.startswith("application/json"):
                self._start = message
                return
        if self._start is None:
            await self._send(message)
            return
        self._body += message.get("body", b"")
        if message.get("more_body", False):
            return
        wrapped = json.dumps({"predictions": json.loads(self._body)}).encode()
        headers = [(k, v) for k, v in self._start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(wrapped)).encode()))
        await self._send({**self._start, "headers": headers})
        await self._send({"type": "http.response.body", "body": wrapped, "more_body": False})
