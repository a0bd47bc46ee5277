"""SageMaker's /invocations in front of an app: the body names the call, which the app then
serves on its own path with the same body; other requests pass untouched."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.invocations import Invocations, invoked_path


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})


APP = Starlette(
    routes=[
        Route(p, echo, methods=["GET", "POST"]) for p in ("/v1/chat/completions", "/v1/completions", "/invocations")
    ]
)
CLIENT = TestClient(Invocations(APP, max_body_bytes=1000))


@pytest.mark.parametrize(
    "body,path",
    [
        ('{"messages": [{"role": "user", "content": "Hi"}]}', "/v1/chat/completions"),
        ('{"prompt": "Once", "max_tokens": 2}', "/v1/completions"),
        ('{"prompt": "Once", "messages": []}', "/v1/chat/completions"),  # vLLM tries the chat first
    ],
)
def test_the_body_names_the_call_and_is_handed_on_unchanged(body, path):
    answered = CLIENT.post("/invocations", content=body).json()
    assert answered == {"path": path, "body": body}
    assert invoked_path(body.encode()) == path


@pytest.mark.parametrize(
    "body, why",
    [
        (b'{"input": "Hi"}', "a chat .* or a completion"),
        (b"[1, 2]", "must be a JSON object, not an array"),
        (b'"prompt"', "must be a JSON object, not a string"),
        (b'{"prompt": "Hi"', "invalid JSON"),
        (b"\xff", "invalid JSON"),
    ],
)
def test_a_body_that_is_neither_call_is_a_400_that_says_why(body, why):
    with pytest.raises(ApiError, match=f"^POST /invocations: .*{why}"):
        invoked_path(body)
    answered = CLIENT.post("/invocations", content=body)
    assert answered.status_code == 400 and "POST /invocations" in answered.json()["error"]["message"]


def test_a_body_over_the_limit_is_a_413_and_other_calls_pass_untouched():
    assert CLIENT.post("/invocations", content=b'{"prompt": "' + b"x" * 2000 + b'"}').status_code == 413
    assert CLIENT.get("/invocations").json() == {"path": "/invocations", "body": ""}
    assert CLIENT.post("/v1/completions", content=b"{}").json() == {"path": "/v1/completions", "body": "{}"}
