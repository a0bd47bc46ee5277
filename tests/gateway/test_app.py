"""The gateway app without a live replica: it refuses what it must (auth, the admin key, bad
bodies, nothing to route to) with the replicas' own error shapes, serves the cache page, and its
replica list can be edited."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixcluster import __version__
from radixcluster.gateway.config import GatewayConfig, HealthTunables
from radixcluster.gateway.server import create_app
from support.servers import free_port

KEY = "sesame"
TENANTS = {"ka": "alpha", "kb": "beta"}


@pytest.fixture(scope="module")
def client(model_path) -> Iterator[TestClient]:
    nowhere = f"http://127.0.0.1:{free_port()}"  # bound and released: nothing listens
    config = GatewayConfig(
        host="127.0.0.1",
        port=0,
        model_path=model_path,
        replicas=[nowhere],
        api_key=KEY,
        health=HealthTunables(interval_s=0.05),
    )
    with TestClient(create_app(config), headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


@pytest.fixture(scope="module")
def keyed(model_path) -> Iterator[TestClient]:
    """A gateway with the replicas' admin and tenants' keys (and no API key of its own)."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    config = GatewayConfig(
        host="127.0.0.1",
        port=0,
        model_path=model_path,
        replicas=[nowhere],
        admin_api_key="boss",
        tenant_keys=TENANTS,
        health=HealthTunables(interval_s=0.05),
    )
    with TestClient(create_app(config)) as c:
        yield c


def error(resp, status: int) -> str:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]["message"]


def test_without_an_available_replica_requests_get_503_and_health_fails(client) -> None:
    assert "no replica is available" in error(client.post("/generate", json={"text": "hi"}), 503)
    assert "no replica is available" in error(client.put("/generate", json={"text": "hi"}), 503)  # SGLang's PUT
    assert "takes POST" in error(client.put("/v1/completions", json={"prompt": "hi"}), 405)
    assert "no replica is available" in error(client.post("/tokenize", json={"prompt": "hi"}), 503)
    assert "no replica is available" in error(client.get("/model_info"), 503)
    assert error(client.get("/health"), 503).startswith("unhealthy")
    assert client.head("/ready").status_code == client.head("/health_generate").status_code == 503
    (replica,) = client.get("/replicas").json()["replicas"]
    assert replica["available"] is False


def test_the_version_is_served_without_a_replica(client) -> None:
    assert client.get("/version").json() == {"version": __version__}


def test_bad_bodies_and_missing_keys_are_refused_as_a_replica_would(client) -> None:
    assert "empty" in error(client.post("/generate", json={"text": ""}), 400)
    assert "JSON" in error(client.post("/v1/completions", content=b"{not json"), 400)
    assert "messages" in error(client.post("/v1/chat/completions", json={"messages": []}), 400)
    assert "rid" in error(client.post("/abort_request", json={}), 400)
    anonymous = client.post("/generate", json={"text": "hi"}, headers={"Authorization": ""})
    assert "API key" in error(anonymous, 401)


def test_replicas_are_added_and_removed_at_run_time(client) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    added = client.post("/replicas", json={"url": url + "/"}).json()
    assert added["url"] == url and added["available"] is False
    assert len(client.get("/replicas").json()["replicas"]) == 2
    assert client.request("DELETE", "/replicas", json={"url": url}).json() == {"removed": url}
    assert "no replica" in error(client.request("DELETE", "/replicas", json={"url": url}), 404)
    assert "http://" in error(client.post("/replicas", json={"url": "ftp://x"}), 400)
    for bad, words in (("http://[::1", "not a URL"), ("http://", "no host"), ("http://x:70000", "not a URL")):
        assert words in error(client.post("/replicas", json={"url": bad}), 400)
    assert "invalid JSON in the request body" in error(client.post("/replicas", content=b"not json"), 400)
    assert error(client.request("DELETE", "/replicas", json=[url]), 400) == (
        "the request body must be a JSON object, not an array"
    )
    assert len(client.get("/replicas").json()["replicas"]) == 1


def test_tenants_keys_pass_the_admin_key_guards_cache_control_and_the_page_is_public(keyed) -> None:
    tenant, boss = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer boss"}
    assert "API key" in error(keyed.get("/replicas"), 401)
    assert keyed.get("/replicas", headers=tenant).status_code == 200
    prefix = {"text": "a shared system prompt"}
    for method, path, body in (
        ("POST", "/cache/warm", prefix),
        ("POST", "/cache/pin", {**prefix, "ttl_s": 5}),
        ("DELETE", "/cache/pin", prefix),
        ("POST", "/cache/evict", prefix),
    ):
        assert "admin key" in error(keyed.request(method, path, json=body, headers=tenant), 401)
        assert "no replica is available" in error(keyed.request(method, path, json=body, headers=boss), 503)
    assert "ttl_s" in error(keyed.post("/cache/pin", json=prefix, headers=boss), 400)
    page = keyed.get("/cache")
    assert page.status_code == 200 and 'id="replica"' in page.text
    assert keyed.get("/cache/page.js").status_code == 200


def test_one_replicas_cache_is_named_by_url_or_index(keyed) -> None:
    tenant = {"Authorization": "Bearer kb"}
    assert "GET /replicas" in error(keyed.get("/cache/tree?replica=7", headers=tenant), 404)
    assert "not available" in error(keyed.get("/cache/tree?replica=0", headers=tenant), 503)
    assert "no replica is available" in error(keyed.get("/cache_info", headers=tenant), 503)


def test_a_salt_in_a_tenants_namespace_is_refused_without_its_key(client) -> None:
    forged = {"text": "hi", "cache_salt": "\x00tenant\x00alpha\x00"}
    assert "cache_salt" in error(client.post("/generate", json=forged), 400)


def test_a_web_page_of_any_origin_may_call_the_gateway_the_key_still_guarding_it(client) -> None:
    page = {"Origin": "https://chat.example"}
    ask = {**page, "Access-Control-Request-Method": "POST", "Authorization": ""}
    preflight = client.options("/v1/chat/completions", headers=ask)
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "*"
    refused = client.get("/v1/models", headers={**page, "Authorization": ""})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "*"
