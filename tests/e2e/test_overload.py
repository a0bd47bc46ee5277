"""Admission control against a real server with a small KV pool, two running slots and a queue of
two: a request that could never fit the pool is a 400, a full queue answers 429 with Retry-After
while readiness stays green, and a client that leaves while queued is never prefilled."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from support.api_helpers import GREEDY, TIMEOUT_S, assert_error, generate, get, metric_value, post, wait_idle
from support.servers import ServerHandle, launch_server

pytestmark = pytest.mark.slow

POOL = 3000


@pytest.fixture(scope="module")
def small() -> Iterator[ServerHandle]:
    with launch_server(
        "--max-total-tokens", str(POOL), "--max-running-requests", "2", "--max-queued-requests", "2"
    ) as handle:
        yield handle


def endless_stream(server: ServerHandle, text: str) -> tuple[requests.Response, Iterator[bytes]]:
    """A stream that runs until its client leaves, its first event read (the reader is kept:
    dropping it would close the connection, and the server would abort the stream)."""
    params = {**GREEDY, "max_new_tokens": 1400, "ignore_eos": True}  # two of them fit the pool
    resp = requests.post(
        server.url + "/generate",
        json={"text": text, "sampling_params": params, "stream": True},
        headers=server.headers(),
        stream=True,
        timeout=TIMEOUT_S,
    )
    assert resp.status_code == 200, resp.text
    lines = resp.iter_lines()
    next(lines)
    return resp, lines


@pytest.fixture()
def two_running(small: ServerHandle) -> Iterator[list[requests.Response]]:
    """Both running slots taken until the test ends (or closes them)."""
    wait_idle(small)
    streams = [endless_stream(small, f"Count from {i}:") for i in range(2)]
    assert metric_value(small, "radixcluster_num_running_reqs") == 2
    try:
        yield [resp for resp, _ in streams]
    finally:
        for resp, _ in streams:
            resp.close()
        wait_idle(small)


def test_a_request_larger_than_the_pool_is_a_400_and_the_server_serves_on(small):
    body = {"input_ids": [504] * 2000, "sampling_params": {"max_new_tokens": 1500}}
    assert_error(post(small, "/generate", body), 400, f"KV pool of {POOL} tokens")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": POOL}
    assert_error(post(small, "/v1/chat/completions", chat), 400, f"max_tokens ({POOL})")  # the chat's name of it
    assert generate(small, "Hello", max_new_tokens=2)["meta_info"]["completion_tokens"] <= 2


def test_a_full_queue_answers_429_with_retry_after_while_readiness_stays_green(small, two_running):
    """Two run, two wait; the fifth request is refused at once, and /health_generate does not
    queue behind them."""
    body = {"text": "Wait for it", "sampling_params": {"max_new_tokens": 1}}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = [pool.submit(post, small, "/generate", body) for _ in range(2)]
        while metric_value(small, "radixcluster_num_waiting_reqs") < 2:
            assert not any(f.done() for f in waiting)
            time.sleep(0.1)
        refused = post(small, "/generate", body)
        assert_error(refused, 429, "retry later")
        assert refused.headers["Retry-After"] == "1"
        assert get(small, "/health_generate").status_code == 200
        assert metric_value(small, 'radixcluster_rejected_requests_total{reason="queue_full"}') >= 1
        for resp in two_running:
            resp.close()  # the queue moves on: the two waiting requests run
        assert [f.result().status_code for f in waiting] == [200, 200]


def test_a_client_that_leaves_while_queued_is_never_prefilled(small, two_running):
    admitted = metric_value(small, "radixcluster_requests_total")
    gone = threading.Event()

    def leave_before_the_first_token() -> None:
        params = {**GREEDY, "max_new_tokens": 8}
        with pytest.raises(requests.Timeout):
            requests.post(
                small.url + "/generate",
                json={"text": "Nobody will read this " * 50, "sampling_params": params, "stream": True},
                headers=small.headers(),
                timeout=(10, 1),  # no response head within a second: it waits behind the two running
            )
        gone.set()

    thread = threading.Thread(target=leave_before_the_first_token)
    thread.start()
    thread.join()
    assert gone.is_set()
    while metric_value(small, "radixcluster_num_waiting_reqs") > 0:
        time.sleep(0.1)  # the abort reaches the router
    for resp in two_running:
        resp.close()
    wait_idle(small)
    assert metric_value(small, "radixcluster_requests_total") == admitted  # admitted: only the two running
    assert metric_value(small, "radixcluster_aborted_requests_total") >= 1
