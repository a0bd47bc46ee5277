"""ReplicaSet with a live replica: the view syncs from the replica's snapshot and follows its
events; an answered prompt counts as cached there until its event arrives; a snapshot whose blocks are named under another protocol version (another radixcluster
version) is refused, and that replica is routed by load alone, predicting nothing cached."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from radixcluster.gateway import replica_set
from radixcluster.gateway.config import GatewayConfig, HealthTunables
from radixcluster.gateway.server import create_app
from radixcluster.protocol import PROTOCOL_VERSION
from support.servers import ServerHandle, launch_server

pytestmark = pytest.mark.slow

PROMPT = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}


@pytest.fixture(scope="module")
def replica() -> Iterator[ServerHandle]:
    with launch_server("--kv-events-address", "tcp://127.0.0.1:0") as handle:
        yield handle


def gateway(model_path, replica: ServerHandle, interval_s: float = 0.05) -> TestClient:
    config = GatewayConfig(
        host="127.0.0.1",
        port=0,
        model_path=model_path,
        replicas=[replica.url],
        health=HealthTunables(interval_s=interval_s),
    )
    return TestClient(create_app(config))


def described(client: TestClient, ready, timeout_s: float = 30.0) -> dict:
    """The replica as GET /replicas describes it, once ``ready`` holds of it."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = client.get("/replicas").json()["replicas"][0]
        if ready(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_the_view_syncs_and_predicts_what_the_replica_caches(model_path, replica) -> None:
    with gateway(model_path, replica) as client:
        assert described(client, lambda r: r["synced"])["synced"]
        first = client.post("/generate", json=PROMPT).json()["meta_info"]
        described(client, lambda r: r["cached_blocks"] > 0)
        again = client.post("/generate", json=PROMPT).json()["meta_info"]
    assert again["cached_tokens"] > 0
    assert again["predicted_cached_tokens"] == again["cached_tokens"], (first, again)


def test_a_request_right_after_an_answer_finds_its_prefix_before_the_event_arrives(
    model_path, replica, monkeypatch
) -> None:
    """The tree events are held back (as a slow network would) while a request repeats the
    one just answered: its blocks are still pending on the replica, so the prediction is
    exact; once the events flow, the answered prompts leave the pending set."""
    held: list[bytes] = []
    holding = [False]
    apply = replica_set.ReplicaSet._apply

    def late(self, replica, frame: bytes) -> None:
        if holding[0]:
            held.append(frame)
            return
        for earlier in held:
            apply(self, replica, earlier)
        held.clear()
        apply(self, replica, frame)

    monkeypatch.setattr(replica_set.ReplicaSet, "_apply", late)
    prompt = {**PROMPT, "text": "A request that repeats the one just answered"}
    # polls seconds apart: a view behind the router for a whole interval is resynced, which
    # would show the blocks without the pending set
    with gateway(model_path, replica, interval_s=5.0) as client:
        resyncs = described(client, lambda r: r["synced"])["resyncs"]
        holding[0] = True
        client.post("/generate", json=prompt)
        again = client.post("/generate", json=prompt).json()["meta_info"]
        assert held and described(client, lambda r: False, timeout_s=0)["pending_blocks"] > 0
        holding[0] = False
        client.post("/generate", json={**PROMPT, "text": "A new prompt"})  # its event carries the held ones in
        settled = described(client, lambda r: r["pending_blocks"] == 0)
    assert again["cached_tokens"] > 0 and again["predicted_cached_tokens"] == again["cached_tokens"], again
    assert settled["pending_blocks"] == 0 and settled["cached_blocks"] > 0 and settled["resyncs"] == resyncs


def test_a_snapshot_named_under_another_protocol_version_is_refused(model_path, replica, monkeypatch, caplog) -> None:
    monkeypatch.setattr(replica_set, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    with caplog.at_level(logging.ERROR, logger=replica_set.__name__), gateway(model_path, replica) as client:
        assert described(client, lambda r: r["available"])["available"]
        deadline = time.monotonic() + 30
        while "run the same radixcluster version" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
        client.post("/generate", json=PROMPT)
        answer = client.post("/generate", json=PROMPT)
        state = client.get("/replicas").json()["replicas"][0]
    said = f"under protocol {PROTOCOL_VERSION}, this gateway under {PROTOCOL_VERSION + 1}"
    assert caplog.text.count(said) == 1  # once, though every poll finds it again
    assert not state["synced"] and state["cached_blocks"] == 0
    meta = answer.json()["meta_info"]
    assert answer.status_code == 200 and meta["cached_tokens"] > 0 and meta["predicted_cached_tokens"] == 0
