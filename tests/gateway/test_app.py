"""The gateway app without a live replica: it refuses what it must (auth, bad bodies, nothing
to route to) with the replicas' own error shapes, and its replica list can be edited."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixcluster.gateway.config import GatewayConfig, HealthTunables
from radixcluster.gateway.server import create_app
from support.servers import free_port

KEY = "sesame"


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


def error(resp, status: int) -> str:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]["message"]


def test_without_an_available_replica_requests_get_503_and_health_fails(client) -> None:
    assert "no replica is available" in error(client.post("/generate", json={"text": "hi"}), 503)
    assert "no replica is available" in error(client.post("/tokenize", json={"prompt": "hi"}), 503)
    assert "no replica is available" in error(client.get("/model_info"), 503)
    assert error(client.get("/health"), 503).startswith("unhealthy")
    (replica,) = client.get("/replicas").json()["replicas"]
    assert replica["available"] is False


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
