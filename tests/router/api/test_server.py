"""The api app's gates, in process (no router behind it): a drain refuses new requests and
readiness with 503, a missing key is a 401, and an unexpected exception is a 500 whose body says
nothing of it; refusals are counted by reason."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from radixcluster.router.api.cache_routes import PAGE_FILES
from radixcluster.router.api.context import ApiConfig
from radixcluster.router.api.server import create_app


def config_in(tmp_path: Path, api_key: str | None = None, **fields: Any) -> ApiConfig:
    """An api's config whose router sockets live in ``tmp_path`` (nothing answers on them)."""
    return ApiConfig(
        host="127.0.0.1",
        port=0,
        request_address=f"ipc://{tmp_path}/in",
        output_address=f"ipc://{tmp_path}/out",
        api_key=api_key,
        served_model_name="m",
        **fields,
    )


@pytest.fixture()
def app(tmp_path: Path):
    app = create_app(config_in(tmp_path, api_key="k"))

    @app.get("/broken")
    async def broken() -> None:
        raise RuntimeError("secret internal detail")

    return app


def rejections(app, reason: str) -> float:
    return app.state.ctx.metrics.rejected_requests.labels(reason=reason)._value.get()


def test_an_unexpected_exception_is_a_500_that_keeps_its_details_to_the_log(app, caplog):
    with TestClient(app, raise_server_exceptions=False) as client:
        resp = client.get("/broken", headers={"Authorization": "Bearer k"})
    assert resp.status_code == 500
    assert "secret" not in resp.text and "RuntimeError" not in resp.text
    assert "logged on the server" in resp.json()["error"]["message"]
    assert any("secret internal detail" in r.getMessage() or r.exc_info for r in caplog.records)


def test_a_missing_key_is_a_401_counted_as_a_refusal(app):
    with TestClient(app) as client:
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
    assert rejections(app, "unauthorized") == 1


def test_a_web_page_of_any_origin_may_call_it_the_key_still_guarding_it(app):
    """SGLang's and vLLM's CORS defaults: the preflight needs no key; every answer, a 401 too,
    lets the page read it."""
    page = {"Origin": "https://chat.example"}
    with TestClient(app) as client:
        preflight = client.options(
            "/v1/chat/completions",
            headers={
                **page,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "*"
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        refused = client.get("/v1/models", headers=page)
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "*"
        served = client.get("/v1/models", headers={**page, "Authorization": "Bearer k"})
        assert served.status_code == 200 and served.headers["access-control-allow-origin"] == "*"


def test_a_drain_refuses_readiness_and_new_requests_but_not_metrics(app):
    with TestClient(app) as client:
        app.state.ctx.draining = True
        for method, path in (("GET", "/health"), ("GET", "/health_generate"), ("POST", "/generate")):
            resp = client.request(method, path, json={"text": "hi"}, headers={"Authorization": "Bearer k"})
            assert resp.status_code == 503 and "shutting down" in resp.json()["error"]["message"]
    assert rejections(app, "unavailable") == 3


def test_a_full_queue_answer_carries_retry_after(app):
    from radixcluster.router.api.errors import error_response

    resp = error_response(429, "busy")
    assert resp.status_code == 429 and resp.headers["retry-after"] == "1"


@pytest.fixture()
def admin_app(tmp_path: Path):
    return create_app(config_in(tmp_path, api_key="k", admin_api_key="boss"))


def test_the_cache_page_files_are_served_without_a_key(app):
    with TestClient(app) as client:
        page = client.get("/cache")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<script src="/cache/page.js">' in page.text and 'href="/cache/page.css"' in page.text
        assert "fetch(" in client.get("/cache/page.js").text
        assert client.get("/cache/page.css").headers["content-type"].startswith("text/css")
        assert client.get("/cache/tree").status_code == 401  # the data needs the key


def test_the_cache_page_files_take_nothing_from_the_query(app):
    with TestClient(app) as client:
        for path in PAGE_FILES:
            plain = client.get(path)
            spoofed = client.get(path, params={"content": "<script>alert(1)</script>", "media": "text/html"})
            assert spoofed.status_code == 200 and spoofed.content == plain.content
            assert spoofed.headers["content-type"] == plain.headers["content-type"]
        assert client.get("/cache", params={"media": "\U0003d382"}).status_code == 200


def test_tree_bounds_are_a_400_naming_the_parameter(app):
    with TestClient(app) as client:
        for query, word in (("depth=0", "depth"), ("depth=65", "depth"), ("min_tokens=-1", "min_tokens")):
            resp = client.get(f"/cache/tree?{query}", headers={"Authorization": "Bearer k"})
            assert resp.status_code == 400 and word in resp.json()["error"]["message"], resp.text


def test_the_cache_control_calls_need_the_admin_key_which_also_opens_the_rest(admin_app):
    with TestClient(admin_app) as client:
        for method, path in (
            ("POST", "/cache/warm"),
            ("POST", "/cache/pin"),
            ("DELETE", "/cache/pin"),
            ("POST", "/cache/evict"),
        ):
            resp = client.request(method, path, json={"text": "x"}, headers={"Authorization": "Bearer k"})
            assert resp.status_code == 401 and "admin key" in resp.json()["error"]["message"], (path, resp.text)
        boss = {"Authorization": "Bearer boss"}
        resp = client.post("/cache/pin", json={"text": "x"}, headers=boss)
        assert resp.status_code == 400 and "ttl_s" in resp.json()["error"]["message"]
        resp = client.post("/cache/evict", json={"text": "x", "input_ids": [1]}, headers=boss)
        assert resp.status_code == 400 and "exactly one of text and input_ids" in resp.json()["error"]["message"]
        assert client.post("/cache/evict", json={"txt": "x"}, headers=boss).json()["error"]["message"].startswith("txt")
        assert client.get("/v1/models", headers=boss).status_code == 200


def test_tenant_keys_are_accepted_beside_the_api_key(tmp_path: Path):
    config = config_in(tmp_path, tenant_keys={"ka": "alpha"})
    with TestClient(create_app(config)) as client:
        assert client.get("/v1/models", headers={"Authorization": "Bearer ka"}).status_code == 200
        assert client.get("/v1/models", headers={"Authorization": "Bearer kb"}).status_code == 401
        assert client.get("/v1/models").status_code == 401


def test_an_error_names_the_field_at_fault_as_openais_param(app):
    with TestClient(app) as client:
        auth = {"Authorization": "Bearer k"}
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}
        error = client.post("/v1/chat/completions", json=chat, headers=auth).json()["error"]
        assert (error["param"], error["code"], error["type"]) == ("max_tokens", 400, "invalid_request_error")
        wrong = {"text": "hi", "sampling_params": {"temperature": -1}}
        assert (
            client.post("/generate", json=wrong, headers=auth).json()["error"]["param"] == "sampling_params.temperature"
        )
        not_json = client.post("/generate", content=b"{", headers=auth).json()["error"]
        assert not_json["param"] is None and "invalid JSON" in not_json["message"]
        # a refusal of how fields go together names the field it blames
        hi = [{"role": "user", "content": "hi"}]
        for path, body, param in (
            ("/v1/completions", {"prompt": "hi", "suffix": "!"}, "suffix"),
            ("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 1}, "best_of"),
            ("/v1/completions", {"prompt": "", "max_tokens": 1}, "prompt"),
            ("/v1/chat/completions", {"messages": hi, "stream_options": {"include_usage": True}}, "stream_options"),
            ("/v1/chat/completions", {"messages": hi, "top_logprobs": 2}, "top_logprobs"),
            ("/v1/chat/completions", {"messages": hi, "tool_choice": "required"}, "tool_choice"),
            (
                "/v1/chat/completions",
                {"messages": hi, "response_format": {"type": "json_schema"}},
                "response_format.json_schema",
            ),
            (
                "/generate",
                {"text": "hi", "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 2}},
                "sampling_params.min_new_tokens",
            ),
            ("/generate", {"text": "hi", "rid": ["a"]}, "rid"),
            ("/v1/completions", {"prompt": "hi", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ):
            error = client.post(path, json=body, headers=auth).json()["error"]
            assert error["param"] == param, (body, error)


def test_a_client_that_leaves_while_sending_its_body_is_not_an_error(app, caplog):
    """Its body ends in a disconnect: nobody to answer, no traceback in the log, no refusal counted."""
    events = iter([{"type": "http.request", "body": b'{"text": "hel', "more_body": True}, {"type": "http.disconnect"}])
    sent: list[dict] = []

    async def receive() -> dict:
        return next(events)

    async def send(message: dict) -> None:
        sent.append(message)

    headers = [(b"host", b"x"), (b"authorization", b"Bearer k"), (b"content-length", b"64")]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/generate",
        "raw_path": b"/generate",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 0),
    }
    with caplog.at_level(logging.WARNING), TestClient(app) as client:
        client.portal.call(app, scope, receive, send)
    assert sent[0]["status"] == 499
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    counted = app.state.ctx.metrics.rejected_requests.collect()
    assert sum(s.value for family in counted for s in family.samples if s.name.endswith("_total")) == 0


def test_a_predict_route_that_is_one_of_ours_leaves_it_ours(tmp_path: Path, monkeypatch, caplog) -> None:
    """AIP_PREDICT_ROUTE=/generate: /generate stays the native call (as in SGLang, whose own route
    wins); it answered every request with [] as an empty prediction."""
    monkeypatch.setenv("AIP_PREDICT_ROUTE", "/generate")
    with TestClient(create_app(config_in(tmp_path))) as client:
        wrong = {"text": "hi", "sampling_params": {"temperature": -1}}
        error = client.post("/generate", json=wrong).json()["error"]
        assert error["param"] == "sampling_params.temperature"
    assert "$AIP_PREDICT_ROUTE is /generate, a route of this server's own" in caplog.text


def test_each_operation_of_the_openapi_document_has_an_id_of_its_own(app):
    """FastAPI names every method of a route after its first (/generate's POST and PUT were both
    generate_generate_post), which code generators refuse."""
    with TestClient(app) as client:
        document = client.get("/openapi.json", headers={"Authorization": "Bearer k"}).json()
    ids = [op["operationId"] for ops in document["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)) and len(ids) > 50
    generate = document["paths"]["/generate"]
    assert (generate["post"]["operationId"], generate["put"]["operationId"]) == (
        "generate_generate_post",
        "generate_generate_put",
    )
