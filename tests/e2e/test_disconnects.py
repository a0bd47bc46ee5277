"""Clients that leave, many at once and at random moments, against a real server: every request is
aborted, no page stays locked or leaks (free + evictable pages == the pool), and the server serves
on afterwards."""

from __future__ import annotations

import concurrent.futures
import random
from collections.abc import Callable

import pytest
import requests

from support.api_helpers import GREEDY, TIMEOUT_S, generate, get, metric_value, post, wait_idle

pytestmark = pytest.mark.slow

ENDLESS = {**GREEDY, "max_new_tokens": 2000, "ignore_eos": True}


def assert_pool_whole(server) -> None:
    """Nothing runs, nothing is locked, and every page is free or held by the tree alone."""
    wait_idle(server)
    info = get(server, "/cache_info").json()
    assert info["protected_tokens"] == 0
    free, pool = metric_value(server, "radixcluster_free_pages"), metric_value(server, "radixcluster_total_pages")
    assert free + info["evictable_tokens"] // info["page_size"] == pool
    assert metric_value(server, "radixcluster_num_running_reqs") == 0


def leave_before_the_first_token(server, i: int) -> None:
    # a long prompt of its own: its prefill has not produced a token when the client gives up
    text = f"Client {i} asks: " + " ".join(f"w{i}x{j}" for j in range(600))
    with pytest.raises(requests.Timeout):
        requests.post(
            server.url + "/generate",
            json={"text": text, "sampling_params": ENDLESS, "stream": True},
            headers=server.headers(),
            timeout=(10, 0.05),
        )


def leave_after_the_first_token(server, i: int) -> None:
    with requests.post(
        server.url + "/generate",
        json={"text": f"Client {i} counts:", "sampling_params": ENDLESS, "stream": True},
        headers=server.headers(),
        stream=True,
        timeout=TIMEOUT_S,
    ) as resp:
        assert resp.status_code == 200
        next(resp.iter_lines())


def test_24_clients_leaving_mid_stream_leave_nothing_running_or_locked(server):
    wait_idle(server)
    aborted = metric_value(server, "radixcluster_aborted_requests_total")
    leavers: list[Callable[[object, int], None]] = [leave_before_the_first_token, leave_after_the_first_token]
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        list(pool.map(lambda i: leavers[i % 2](server, i), range(24)))
    assert_pool_whole(server)
    # a client gone before the api sent its request on costs the router nothing at all
    assert 12 <= metric_value(server, "radixcluster_aborted_requests_total") - aborted <= 24
    assert generate(server, "Still serving?", max_new_tokens=2)["meta_info"]["completion_tokens"] <= 2


def one_request(server, rng: random.Random, i: int) -> None:
    """One of many kinds of request, and often a client that leaves part-way."""
    kind = rng.choice(["native", "stream", "batch", "chat", "chat_stream", "regex", "stop", "bad", "deadline"])
    params = {**GREEDY, "max_new_tokens": rng.randint(1, 6)}
    leave_after = rng.choice([None, 0, 1, 2])  # events read before leaving; None: read it all
    text = f"Soak {i % 7}: tell me about item {i}."
    if kind == "native":
        timeout = TIMEOUT_S if leave_after is None else rng.choice([0.05, 0.5])
        body = {"text": text, "sampling_params": params}
        try:
            requests.post(server.url + "/generate", json=body, headers=server.headers(), timeout=timeout)
        except requests.Timeout:
            pass  # the client left
        return
    if kind in ("stream", "chat_stream"):
        path, body = ("/generate", {"text": text, "sampling_params": params})
        if kind == "chat_stream":
            path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": text}], "max_tokens": 6}
        with requests.post(
            server.url + path, json={**body, "stream": True}, headers=server.headers(), stream=True, timeout=TIMEOUT_S
        ) as resp:
            for n, _ in enumerate(resp.iter_lines()):
                if leave_after is not None and n >= leave_after:
                    break
        return
    if kind == "batch":
        body = {"text": [text, text + " And more."], "sampling_params": {**params, "n": 2}}
        assert post(server, "/generate", body).status_code == 200
    elif kind == "chat":
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4, "n": 2, "temperature": 0}
        assert post(server, "/v1/chat/completions", body).status_code == 200
    elif kind == "regex":
        body = {"text": text, "sampling_params": {**params, "regex": f"(yes|no|maybe){{1,{1 + i % 3}}}"}}
        assert post(server, "/generate", body).status_code == 200
    elif kind == "stop":
        body = {"text": text, "sampling_params": {**params, "stop": ["e", " the", "\n"] * (1 + i % 3)}}
        assert post(server, "/generate", body).status_code == 200
    elif kind == "bad":
        body = {"text": text, "sampling_params": {**params, "seed": 2**64 + i}}
        assert post(server, "/generate", body).status_code == 400
    else:
        body = {"text": text, "sampling_params": {**ENDLESS, "max_new_tokens": 500}, "deadline_s": 0.5}
        assert post(server, "/generate", body).status_code == 504


def test_a_soak_of_mixed_requests_with_random_aborts_leaks_no_page(server):
    rng = random.Random(13)
    seeds = [rng.randrange(2**32) for _ in range(240)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        list(pool.map(lambda i: one_request(server, random.Random(seeds[i]), i), range(len(seeds))))
    assert_pool_whole(server)
    result = generate(server, "After the soak:", max_new_tokens=3, sampling_params={"ignore_eos": True})
    assert result["meta_info"]["completion_tokens"] == 3
