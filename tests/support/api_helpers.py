"""HTTP helpers shared by the api's end-to-end tests."""

from __future__ import annotations

import json
import time
from typing import Any

import requests

TIMEOUT_S = 120
GREEDY = {"temperature": 0.0}


def post(server, path: str, body: Any, **kwargs: Any) -> requests.Response:
    return requests.post(server.url + path, json=body, headers=server.headers(), timeout=TIMEOUT_S, **kwargs)


def get(server, path: str) -> requests.Response:
    return requests.get(server.url + path, headers=server.headers(), timeout=TIMEOUT_S)


def generate(server, text: str, max_new_tokens: int = 8, **fields: Any) -> dict[str, Any]:
    params = {**GREEDY, "max_new_tokens": max_new_tokens, **fields.pop("sampling_params", {})}
    resp = post(server, "/generate", {"text": text, "sampling_params": params, **fields})
    assert resp.status_code == 200, resp.text
    return resp.json()


def sse_events(resp: requests.Response) -> list[Any]:
    """The decoded ``data:`` payloads of an SSE response, ``[DONE]`` kept as a string."""
    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line.startswith("data: "):
            data = line[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def metric_value(server, name: str) -> float:
    """One sample of /metrics (the first line starting with ``name``)."""
    text = get(server, "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def wait_idle(server, deadline_s: float = 300) -> None:
    """Wait until the router runs and queues nothing (bounded, for cleanup checks)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if (
            metric_value(server, "radixcluster_num_running_reqs") == 0
            and metric_value(server, "radixcluster_num_waiting_reqs") == 0
        ):
            return
        time.sleep(0.2)
    raise AssertionError("the router still has requests after the deadline")


def assert_error(resp: requests.Response, status: int, *words: str) -> str:
    """A JSON error body with the status and a message naming ``words``; returns the message."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert error["code"] == status
    assert isinstance(error["message"], str) and error["message"]
    for word in words:
        assert word.lower() in error["message"].lower(), error["message"]
    return error["message"]
