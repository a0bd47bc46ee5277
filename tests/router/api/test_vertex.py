"""Vertex AI's prediction call in front of an app: the instances' prompts and the parameters make
one /generate body, whose JSON answer comes back as {"predictions": ...}; a stream or an error
comes back as /generate sent it; other requests pass untouched."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.vertex import DEFAULT_PREDICT_ROUTE, VertexPredict, generate_body, predict_route


async def generate(request: Request) -> Response:
    """Answers one entry per prompt echoing the body, a stream when asked, a 400 on "fail"."""
    body = await request.json()
    if body.get("fail"):
        return JSONResponse({"error": {"message": "refused", "code": 400}}, status_code=400)
    if body.get("stream"):
        return StreamingResponse(iter([b"data: 1\n\n", b"data: [DONE]\n\n"]), media_type="text/event-stream")
    return JSONResponse([{"path": request.url.path, "body": body} for _ in body["text"]])


async def other(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path})


APP = Starlette(routes=[Route("/generate", generate, methods=["POST"]), Route("/health", other)])
CLIENT = TestClient(VertexPredict(APP, max_body_bytes=1000, route="/predict"))


def test_the_instances_are_one_generate_and_its_answer_the_predictions():
    call = {"instances": [{"text": "a"}, {"text": "b"}], "parameters": {"sampling_params": {"max_new_tokens": 3}}}
    answered = CLIENT.post("/predict", json=call)
    assert answered.status_code == 200
    body = {"sampling_params": {"max_new_tokens": 3}, "text": ["a", "b"]}
    assert answered.json() == {"predictions": [{"path": "/generate", "body": body}] * 2}
    assert int(answered.headers["content-length"]) == len(answered.content)


def test_no_instances_predict_nothing_and_other_calls_pass_untouched():
    assert CLIENT.post("/predict", json={"instances": []}).json() == []
    assert CLIENT.post("/predict", json={}).json() == []
    assert CLIENT.get("/health").json() == {"path": "/health"}
    assert CLIENT.get("/predict").status_code == 404  # only POST is the call


def test_a_stream_or_an_error_comes_back_as_generate_sent_it():
    streamed = CLIENT.post("/predict", json={"instances": [{"text": "a"}], "parameters": {"stream": True}})
    assert streamed.text == "data: 1\n\ndata: [DONE]\n\n"
    refused = CLIENT.post("/predict", json={"instances": [{"text": "a"}], "parameters": {"fail": True}})
    assert refused.status_code == 400 and refused.json()["error"]["message"] == "refused"


@pytest.mark.parametrize(
    "call, why",
    [
        (b"[1]", "must be a JSON object, not an array"),
        (b"not json", "invalid JSON"),
        (json.dumps({"instances": "a"}).encode(), "a list of objects"),
        (json.dumps({"instances": [1]}).encode(), "a list of objects"),
        (json.dumps({"instances": [{"text": "a"}], "parameters": [1]}).encode(), "parameters must be an object"),
        (json.dumps({"instances": [{"prompt": "a"}]}).encode(), "a text or input_ids"),
        (json.dumps({"instances": [{"text": "a"}], "parameters": {"text": "b"}}).encode(), "text belongs in the"),
    ],
)
def test_a_body_that_is_no_prediction_call_is_a_400(call, why):
    with pytest.raises(ApiError, match=why):
        generate_body(call, "/predict")
    answered = CLIENT.post("/predict", content=call)
    assert answered.status_code == 400 and why in answered.json()["error"]["message"]


def test_token_ids_and_images_go_on_to_generate():
    ids = generate_body(json.dumps({"instances": [{"input_ids": [1, 2]}, {"input_ids": [3]}]}).encode(), "/p")
    assert ids == {"input_ids": [[1, 2], [3]]}
    imaged = generate_body(json.dumps({"instances": [{"text": "a", "image_data": "x"}]}).encode(), "/p")
    assert imaged == {"text": ["a"], "image_data": ["x"]}  # for /generate to refuse by name


def test_a_body_over_the_limit_is_a_413():
    assert CLIENT.post("/predict", content=b'{"instances": [{"text": "' + b"x" * 2000 + b'"}]}').status_code == 413


def test_the_route_is_vertexs_or_sglangs_default(monkeypatch):
    monkeypatch.delenv("AIP_PREDICT_ROUTE", raising=False)
    assert predict_route() == DEFAULT_PREDICT_ROUTE == "/vertex_generate"
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/v1/endpoints/e/deployedModels/m:predict")
    assert predict_route() == "/v1/endpoints/e/deployedModels/m:predict"
