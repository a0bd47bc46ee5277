"""The gateway's generation routes (its raw ASGI fast path) in front of a real replica: answers
and streams relayed with the replica and the prediction in them, bad requests refused with the
replica's own errors, keys checked, other methods and paths left to FastAPI, and a client that
leaves aborting its request on the replica."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import requests

from radixcluster.router.api.gateway_tokens import pack_ids
from radixcluster.router.text.tokenizer import load_tokenizer
from support.api_helpers import GREEDY, get, metric_value, post, sse_events
from support.servers import ServerHandle, launch_server, wait_replicas
from support.streams import sse_stream

pytestmark = pytest.mark.slow

KEY = "fast-path-key"
ENDLESS = {**GREEDY, "max_new_tokens": 2000, "ignore_eos": True}
SHORT = {**GREEDY, "max_new_tokens": 2}
RUNNING_USAGE = {"prompt_tokens", "completion_tokens", "total_tokens"}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ServerHandle, ServerHandle]]:
    with launch_server("--kv-events-address", "tcp://127.0.0.1:0", api_key=KEY) as replica:
        with launch_server(f"--replica={replica.url}", command="gateway", api_key=KEY) as gateway:
            wait_replicas(gateway, 1)
            yield replica, gateway


def wait_for(what: str, check, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)


def test_answers_carry_the_replica_and_the_prediction(servers) -> None:
    replica, gateway = servers
    native = post(gateway, "/generate", {"text": "The sky is", "sampling_params": SHORT}).json()
    assert native["meta_info"]["replica"] == replica.url
    assert isinstance(native["meta_info"]["predicted_cached_tokens"], int)
    completion = post(gateway, "/v1/completions", {"model": "m", "prompt": "One, two,", "max_tokens": 2}).json()
    assert completion["usage"]["replica"] == replica.url and "predicted_cached_tokens" in completion["usage"]


def test_streams_are_relayed_frame_by_frame(servers) -> None:
    replica, gateway = servers
    native = {"text": "Once upon", "sampling_params": SHORT, "stream": True}
    frames = sse_events(post(gateway, "/generate", native, stream=True))
    assert frames[-1] == "[DONE]" and all(f["meta_info"]["replica"] == replica.url for f in frames[:-1])
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
    frames = sse_events(post(gateway, "/v1/chat/completions", chat, stream=True))
    assert frames[-1] == "[DONE]" and not any(f.get("usage") for f in frames[:-1])  # the forced usage dropped
    asked = {**chat, "stream_options": {"include_usage": True}}
    usage = sse_events(post(gateway, "/v1/chat/completions", asked, stream=True))[-2]["usage"]
    assert usage["replica"] == replica.url and "predicted_cached_tokens" in usage
    # vLLM's continuous_usage_stats: every chunk's running counts go through as they are; only the
    # last chunk's usage is the request's (the one the gateway annotates and learns from)
    running = {**chat, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    *chunks, last, done = sse_events(post(gateway, "/v1/chat/completions", running, stream=True))
    assert done == "[DONE]" and all(c["choices"] and set(c["usage"]) == RUNNING_USAGE for c in chunks)
    assert last["choices"] == [] and last["usage"]["replica"] == replica.url


def test_responses_are_relayed_with_their_events_and_the_prediction(servers) -> None:
    replica, gateway = servers
    body = {"input": "Name a colour.", "instructions": "Be brief.", "max_output_tokens": 4, "temperature": 0}
    direct, through = (post(s, "/v1/responses", body).json() for s in servers)
    assert through["output"][0]["content"] == direct["output"][0]["content"]
    assert through["usage"]["replica"] == replica.url and "predicted_cached_tokens" in through["usage"]
    with post(gateway, "/v1/responses", {**body, "stream": True}, stream=True) as resp:
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    frames = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert names == [f["type"] for f in frames] and names[-1] == "response.incomplete"  # no [DONE]
    assert frames[-1]["response"]["usage"]["replica"] == replica.url


def test_anthropic_messages_are_relayed_with_their_events_and_the_prediction(servers) -> None:
    replica, gateway = servers
    body = {"model": "m", "max_tokens": 4, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]}
    body = {**body, "temperature": 0}
    direct, through = (post(s, "/v1/messages", body).json() for s in servers)
    assert through["content"] == direct["content"]
    usage = through["usage"]
    assert usage["replica"] == replica.url and usage["predicted_cached_tokens"] <= usage["cache_read_input_tokens"]
    with post(gateway, "/v1/messages", {**body, "stream": True}, stream=True) as resp:
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line]
    names = [line[len("event: ") :] for line in lines if line.startswith("event: ")]
    frames = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert names == [f["type"] for f in frames] and names[-1] == "message_stop"  # no [DONE]
    assert frames[-2]["usage"]["replica"] == replica.url
    counted = requests.post(
        gateway.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": KEY}, timeout=120
    )
    assert counted.json() == {"input_tokens": usage["input_tokens"] + usage["cache_read_input_tokens"]}
    refused = post(gateway, "/v1/messages", {**body, "max_tokens": -1})
    assert refused.status_code == 400 and refused.json()["type"] == "error"


def test_sagemakers_invocations_go_the_fast_path(servers) -> None:
    replica, gateway = servers
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    direct, through = (post(s, "/invocations", chat).json() for s in servers)
    assert through["choices"][0]["message"] == direct["choices"][0]["message"]
    assert through["usage"]["replica"] == replica.url and "predicted_cached_tokens" in through["usage"]
    assert post(gateway, "/invocations", {"input": "Hi"}).status_code == 400


def test_vertex_predictions_go_the_fast_path(servers) -> None:
    replica, gateway = servers
    call = {
        "instances": [{"text": "One, two,"}],
        "parameters": {"sampling_params": {"max_new_tokens": 3, "temperature": 0}},
    }
    (direct,), (through,) = (post(s, "/vertex_generate", call).json()["predictions"] for s in servers)
    assert through["text"] == direct["text"] and through["meta_info"]["replica"] == replica.url
    assert post(gateway, "/vertex_generate", {"instances": [{"prompt": "Hi"}]}).status_code == 400


def test_the_replica_serves_the_ids_the_gateway_tokenized(servers, model_path) -> None:
    replica, gateway = servers
    tokenizer = load_tokenizer(model_path)
    # handed ids of another text with its tokenizer's fingerprint, a replica serves those ids
    ids = tokenizer.encode("The capital of France is")
    handed = {"tokenizer": tokenizer.fingerprint, "prompts": [pack_ids(np.array(ids))]}
    served = post(replica, "/generate", {"text": "Hi", "sampling_params": SHORT, "gateway_tokens": handed}).json()
    plain = post(replica, "/generate", {"input_ids": ids, "sampling_params": SHORT}).json()
    assert served["text"] == plain["text"] and served["meta_info"]["prompt_tokens"] == len(ids)
    # through the gateway every kind of request is answered as the replica answers it alone
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    for path, body in [
        ("/generate", {"text": ["The sky is", "Two plus two is"], "sampling_params": SHORT}),
        ("/v1/completions", {"model": "m", "prompt": ["One, two,", "A, B,"], "max_tokens": 2, "temperature": 0}),
        ("/v1/chat/completions", {"model": "m", "messages": chat, "max_tokens": 3, "temperature": 0}),
    ]:
        direct, through = (post(s, path, body).json() for s in (replica, gateway))
        if path == "/generate":
            assert [a["text"] for a in through] == [a["text"] for a in direct]
            assert [a["meta_info"]["prompt_tokens"] for a in through] == [
                a["meta_info"]["prompt_tokens"] for a in direct
            ]
        else:
            assert through["choices"] == direct["choices"]
            assert through["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", b"{not json"),
        ("/generate", b""),
        ("/generate", b"[1, 2]"),
        ("/generate", json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": -1}}).encode()),
        ("/v1/chat/completions", json.dumps({"model": "m", "messages": []}).encode()),
        ("/generate", json.dumps({"text": "hi", "cache_salt": "\x00tenant\x00x\x00"}).encode()),
    ],
)
def test_bad_requests_get_the_replicas_own_error(servers, path: str, body: bytes) -> None:
    answers = [
        requests.post(s.url + path, data=body, headers={**s.headers(), "Content-Type": "application/json"}, timeout=30)
        for s in servers
    ]
    direct, through = ((a.status_code, a.json()) for a in answers)
    assert through == direct and direct[0] == 400


def test_a_passed_deadline_is_the_replicas_504_and_leaves_the_replica_available(servers) -> None:
    replica, gateway = servers
    late = {"text": "hi", "sampling_params": SHORT, "deadline_s": 1e-9}
    for path, body in [("/generate", late), ("/v1/completions", {"model": "m", "prompt": "hi", "deadline_s": 1e-9})]:
        for _ in range(4):  # more in a row than the breaker's 3 failures
            resp = post(gateway, path, body)
            assert resp.status_code == 504 and "deadline_s" in resp.json()["error"]["message"], resp.text
    assert get(gateway, "/health").status_code == 200
    assert requests.post(gateway.url + "/ping", timeout=30).status_code == 200  # vLLM's name, keyless
    assert requests.get(gateway.url + "/ready", timeout=30).status_code == 200  # SGLang's
    assert post(gateway, "/generate", {"text": "hi", "sampling_params": SHORT}).status_code == 200


def test_keys_are_checked_and_other_methods_and_paths_go_to_fastapi(servers) -> None:
    replica, gateway = servers
    for key in (None, "wrong"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        direct, through = (requests.post(s.url + "/generate", json={"text": "hi"}, headers=headers) for s in servers)
        assert through.status_code == 401 and through.json() == direct.json()
    assert requests.get(gateway.url + "/generate", headers=gateway.headers()).status_code == 405
    slash = requests.post(gateway.url + "/generate/", json={}, headers=gateway.headers(), allow_redirects=False)
    assert slash.status_code == 307 and slash.headers["location"].endswith("/generate")
    assert requests.post(gateway.url + "/generate/x", json={}, headers=gateway.headers()).status_code == 404
    # a stored response's calls are the replica's 404, which says none are stored
    for method, path in (("GET", "/v1/responses/resp_1"), ("POST", "/v1/responses/resp_1/cancel")):
        direct, through = (requests.request(method, s.url + path, headers=s.headers()) for s in servers)
        assert through.status_code == 404 and through.json() == direct.json()
        assert "stores no responses" in through.json()["error"]["message"]


def test_the_gateway_bounds_a_request_head_as_the_replica_does(servers) -> None:
    answers = [
        requests.get(s.url + "/health", headers={**s.headers(), "X-Big": "a" * 2**20}, timeout=30) for s in servers
    ]
    direct, through = ((a.status_code, a.json()) for a in answers)
    assert through == direct and direct[0] == 431


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_aborts_its_request_on_the_replica(servers, stream: bool) -> None:
    replica, gateway = servers
    body = {"text": "Count to a thousand:", "sampling_params": ENDLESS, "stream": stream}
    if stream:  # leaves after the first frame
        with requests.post(gateway.url + "/generate", json=body, headers=gateway.headers(), stream=True) as resp:
            next(resp.iter_lines())
    else:  # gives up waiting for the answer
        with pytest.raises(requests.Timeout):
            requests.post(gateway.url + "/generate", json=body, headers=gateway.headers(), timeout=(10, 1))
    wait_for("the replica stops running it", lambda: metric_value(replica, "radixcluster_num_running_reqs") == 0)
    wait_for("the gateway ends it", lambda: get(gateway, "/replicas").json()["replicas"][0]["inflight_requests"] == 0)
    again = post(gateway, "/generate", {"text": "Still there?", "sampling_params": SHORT})
    assert again.status_code == 200, again.text


def test_sigterm_drains_the_gateway_and_ends_what_outlasts_its_timeout_with_503s(servers) -> None:
    """A second gateway with a 3 s drain: requests that would run for a minute end with the
    shutdown's 503 (an error event, numbered next on the Responses API, on a stream that has
    begun), a new request meanwhile gets a 503, and the replica aborts what was abandoned."""
    replica, _ = servers
    with launch_server(f"--replica={replica.url}", "--shutdown-timeout", "3", command="gateway", api_key=KEY) as gw:
        wait_replicas(gw, 1)
        native = {"text": "Count to a thousand:", "sampling_params": ENDLESS}
        ask = {"input": "Count to a thousand.", "max_output_tokens": 2000, "ignore_eos": True, "stream": True}
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            starts = [threading.Event() for _ in range(2)]
            streams = [
                pool.submit(sse_stream, gw, "/generate", {**native, "stream": True}, starts[0]),
                pool.submit(sse_stream, gw, "/v1/responses", ask, starts[1]),
            ]
            plain = pool.submit(post, gw, "/generate", native)
            assert all(s.wait(120) for s in starts)
            gw.process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            late = post(gw, "/generate", {"text": "Too late", "sampling_params": SHORT})
            assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
            assert plain.result().status_code == 503 and "shutting down" in plain.result().json()["error"]["message"]
            generated, responses = (s.result() for s in streams)
        assert gw.process.wait(timeout=30) == 0
    assert generated[-1] == "[DONE]" and "shutting down" in generated[-2]["error"]["message"]
    error = responses[-1]
    assert (error["type"], error["code"]) == ("error", "service_unavailable")
    assert [e["sequence_number"] for e in responses] == list(range(len(responses)))
    wait_for("the replica aborts them", lambda: metric_value(replica, "radixcluster_num_running_reqs") == 0)
