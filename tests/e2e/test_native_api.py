"""SGLang's native API against a real `radixcluster up`: /generate (single, batch, n,
streaming, logprobs), health, server and cache information, flushing, metrics, aborts."""

from __future__ import annotations

import math
import secrets

import pytest
import requests

from support.api_helpers import GREEDY, TIMEOUT_S, generate, get, metric_value, post, sse_events, wait_idle

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
# Long enough that its KV spans several pages, so a repeat must hit the radix cache.
LONG_PROMPT = "You are a careful assistant who answers questions about geography. " * 12 + "Name a river."


def assert_consistent(result: dict, max_new_tokens: int) -> None:
    meta = result["meta_info"]
    assert isinstance(result["text"], str)
    assert meta["completion_tokens"] == len(result["output_ids"]) <= max_new_tokens
    assert meta["prompt_tokens"] > 0
    assert 0 <= meta["cached_tokens"] < meta["prompt_tokens"]
    assert meta["e2e_latency"] > 0
    assert meta["finish_reason"]["type"] in ("stop", "length")
    if meta["finish_reason"]["type"] == "length":
        assert meta["completion_tokens"] == max_new_tokens == meta["finish_reason"]["length"]


def test_generate_returns_text_and_consistent_meta_info(server):
    result = generate(server, PROMPT, max_new_tokens=8, rid="my-request-1")
    assert_consistent(result, 8)
    assert result["meta_info"]["id"] == "my-request-1"
    assert result["text"]


def test_top_level_max_tokens_as_users_send_it(server):
    # The seed's request, verbatim in shape: no sampling_params at all.
    resp = post(server, "/generate", {"text": PROMPT, "max_tokens": 4})
    assert resp.status_code == 200, resp.text
    assert_consistent(resp.json(), 4)
    exact = post(server, "/generate", {"text": PROMPT, "max_new_tokens": 3, "sampling_params": {"ignore_eos": True}})
    assert exact.json()["meta_info"]["completion_tokens"] == 3


def test_repeated_prompt_is_deterministic_and_hits_the_cache(server):
    first = generate(server, LONG_PROMPT, max_new_tokens=6)
    second = generate(server, LONG_PROMPT, max_new_tokens=6)
    assert second["output_ids"] == first["output_ids"]
    assert second["text"] == first["text"]
    assert 0 < second["meta_info"]["cached_tokens"] < second["meta_info"]["prompt_tokens"]


def test_input_ids_prompt_counts_its_tokens(server):
    ids = [504, 3458, 282, 4649, 314]
    resp = post(server, "/generate", {"input_ids": ids, "sampling_params": {**GREEDY, "max_new_tokens": 4}})
    assert resp.status_code == 200, resp.text
    assert resp.json()["meta_info"]["prompt_tokens"] == len(ids)
    assert_consistent(resp.json(), 4)


def test_batch_with_n_keeps_input_order_and_distinct_ids(server):
    prompts = [[504, 3458, 282], [504, 3458, 282, 4649, 314, 1345, 28, 1789]]
    body = {"input_ids": prompts, "sampling_params": {**GREEDY, "max_new_tokens": 3, "n": 2}, "rid": "batch"}
    resp = post(server, "/generate", body)
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert [r["meta_info"]["prompt_tokens"] for r in results] == [3, 3, 8, 8]
    assert len({r["meta_info"]["id"] for r in results}) == 4
    # greedy copies of one prompt agree
    assert results[0]["output_ids"] == results[1]["output_ids"]
    assert results[2]["output_ids"] == results[3]["output_ids"]


def test_text_batch_with_per_prompt_sampling_params(server):
    body = {
        "text": [PROMPT, "Water boils at"],
        "sampling_params": [
            {**GREEDY, "max_new_tokens": 2, "ignore_eos": True},
            {**GREEDY, "max_new_tokens": 5, "ignore_eos": True},
        ],
    }
    results = post(server, "/generate", body).json()
    assert [r["meta_info"]["completion_tokens"] for r in results] == [2, 5]


def test_generate_takes_put_as_sglangs_does(server):
    body = {"text": PROMPT, "sampling_params": {**GREEDY, "max_new_tokens": 4}}
    put = requests.put(server.url + "/generate", json=body, headers=server.headers(), timeout=TIMEOUT_S)
    assert put.status_code == 200 and put.json()["text"] == post(server, "/generate", body).json()["text"]


def test_a_passed_deadline_tells_sdks_not_to_retry(server):
    """The OpenAI and Anthropic SDKs retry a 5xx unless told not to: each retry would run it again."""
    late = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "deadline_s": 1e-9})
    assert late.status_code == 504 and late.headers["x-should-retry"] == "false", late.text


def test_a_stop_string_spelled_by_a_skipped_special_token_still_stops(server):
    """As SGLang matches stop strings (on the text with special tokens spelled): a frontend's
    end-of-turn stop ends an answer generated with ignore_eos, though the text leaves it out."""
    chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    free = generate(server, chat, 40, sampling_params={"ignore_eos": True})
    assert 2 in free["output_ids"]  # <|im_end|>, which ignore_eos passes over
    stopped = generate(server, chat, 40, sampling_params={"ignore_eos": True, "stop": ["<|im_end|>"]})
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": "<|im_end|>"}
    end = free["output_ids"].index(2)
    assert stopped["output_ids"] == free["output_ids"][: end + 1]
    assert stopped["text"] == generate(server, chat, end, sampling_params={"ignore_eos": True})["text"]


def test_single_prompt_with_n_returns_a_list(server):
    results = post(
        server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 3, "n": 3, "seed": 7}}
    ).json()
    assert isinstance(results, list) and len(results) == 3


@pytest.mark.parametrize("seed", [7, -2])  # -2's samples draw with seeds -2, -1 and 0
def test_a_seeded_prompts_n_samples_differ_and_repeat(server, seed):
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 12, "n": 3, "seed": seed, "temperature": 1.0}}
    first, again = (post(server, "/generate", body).json() for _ in range(2))
    assert [r["output_ids"] for r in first] == [r["output_ids"] for r in again]
    assert len({tuple(r["output_ids"]) for r in first}) == 3
    # sample 0 is the draw of the seed alone
    single = post(server, "/generate", {**body, "sampling_params": {**body["sampling_params"], "n": 1}}).json()
    assert single["output_ids"] == first[0]["output_ids"]


def test_streaming_chunks_are_cumulative_and_end_with_done(server):
    params = {**GREEDY, "max_new_tokens": 8}
    with requests.post(
        server.url + "/generate",
        json={"text": PROMPT, "sampling_params": params, "stream": True},
        headers=server.headers(),
        stream=True,
        timeout=TIMEOUT_S,
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks
    for before, after in zip(chunks, chunks[1:]):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] is not None
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    # as SGLang: the latency once, at the end
    assert chunks[-1]["meta_info"]["e2e_latency"] > 0 and all("e2e_latency" not in c["meta_info"] for c in chunks[:-1])
    whole = generate(server, PROMPT, max_new_tokens=8)
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["text"] == whole["text"]


def test_logprobs_line_up_with_output_ids(server):
    result = generate(server, PROMPT, max_new_tokens=4, return_logprob=True, top_logprobs_num=2, logprob_start_len=0)
    meta = result["meta_info"]
    assert [entry[1] for entry in meta["output_token_logprobs"]] == result["output_ids"]
    assert all(entry[0] <= 0 for entry in meta["output_token_logprobs"])
    assert all(len(tops) == 2 for tops in meta["output_top_logprobs"])
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    tops = meta["input_top_logprobs"]
    assert len(tops) == meta["prompt_tokens"] and tops[0] is None and all(len(top) == 2 for top in tops[1:])


def test_a_prompt_longer_than_a_chunk_is_scored_at_every_token(server):
    """The prompt token after a chunk's end is scored at the chunk's last position (it was None):
    the values equal those of a request whose one chunk holds that boundary inside it."""
    prompt = " ".join(f"item{i}" for i in range(700))  # ~2,800 tokens: two chunks of 2,048 at most
    whole = generate(server, prompt, max_new_tokens=1, return_logprob=True, logprob_start_len=0)["meta_info"]
    entries = whole["input_token_logprobs"]
    assert len(entries) == whole["prompt_tokens"] > 2048
    assert [i for i, (lp, _, _) in enumerate(entries) if lp is None] == [0]
    # from token 2,000 on: the cached prompt is matched up to there and the rest is one chunk
    tail = generate(server, prompt, max_new_tokens=1, return_logprob=True, logprob_start_len=2000)["meta_info"]
    later = [lp for lp, _, _ in tail["input_token_logprobs"][1:]]
    assert later == pytest.approx([lp for lp, _, _ in entries[2001:]], abs=1e-3)


def test_a_logprob_start_at_the_prompts_end_scores_none_of_it_and_one_past_is_refused(server):
    """As SGLang: logprob_start_len == the prompt's length asks for no prompt entries; more is a 400."""
    n = generate(server, PROMPT, max_new_tokens=1)["meta_info"]["prompt_tokens"]
    at_end = generate(server, PROMPT, max_new_tokens=1, return_logprob=True, logprob_start_len=n)["meta_info"]
    assert at_end["input_token_logprobs"] == [] and len(at_end["output_token_logprobs"]) == 1
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": 1},
        "return_logprob": True,
        "logprob_start_len": n + 1,
    }
    resp = post(server, "/generate", body)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "logprob_start_len", resp.text


def test_zero_new_tokens_only_prefills(server):
    result = generate(server, LONG_PROMPT + " Zero", max_new_tokens=0)
    assert result["output_ids"] == [] and result["text"] == ""
    assert result["meta_info"]["completion_tokens"] == 0


def test_health_info_and_models(server):
    assert requests.get(server.url + "/health", timeout=TIMEOUT_S).status_code == 200
    assert get(server, "/health_generate").status_code == 200
    for path in ("/health", "/ready", "/ping", "/health_generate"):  # a load balancer's HEAD check
        head = requests.head(server.url + path, headers=server.headers(), timeout=TIMEOUT_S)
        assert head.status_code == 200 and head.content == b"", path
    info = get(server, "/get_server_info").json()
    assert info["served_model_name"] and info["version"]
    models = get(server, "/v1/models").json()["data"]
    assert [m["id"] for m in models] == [info["served_model_name"]]


def test_health_generate_probes_count_in_no_statistic(server):
    """An idle server's probe generates a token, but a readiness probe every few seconds must
    not drag down the hit rate users watch (SGLang's probes carry log_metrics false too)."""
    wait_idle(server)
    counters = ("radixcluster_generation_tokens_total", "sglang:num_requests_total", "vllm:prefix_cache_queries_total")
    before = get(server, "/cache_info").json(), [metric_value(server, name) for name in counters]
    for _ in range(3):
        assert get(server, "/health_generate").status_code == 200
    after = get(server, "/cache_info").json(), [metric_value(server, name) for name in counters]
    for key in ("total_requests", "cache_hits", "hit_rate", "prompt_tokens_total", "cached_tokens_total"):
        assert after[0][key] == before[0][key], key
    assert after[1] == before[1]


def test_cache_info_has_the_fields_users_read(server):
    generate(server, LONG_PROMPT, max_new_tokens=2)
    generate(server, LONG_PROMPT, max_new_tokens=2)
    info = get(server, "/cache_info").json()
    for key in ("total_requests", "cache_hits", "hit_rate", "shared_prefix_length_avg", "tree_nodes"):
        assert isinstance(info[key], (int, float)), key
    assert info["cache_hits"] >= 1 and info["total_requests"] >= 2
    assert 0 < info["hit_rate"] <= 1


def test_hit_rate_reads_as_the_seed_reads_it(server):
    """Seed 003: a random id leading each prompt gives a hit rate under 10 %; prompts that share
    a header are hits. A hit takes at least half of its prompt from the cache."""
    before = get(server, "/cache_info").json()
    for i in range(4):
        generate(server, f"req_id={secrets.token_hex(3)} What is the capital of country number {i}?", max_new_tokens=1)
    led_by_ids = get(server, "/cache_info").json()
    assert (
        led_by_ids["cache_hits"] == before["cache_hits"]
        and led_by_ids["total_requests"] == before["total_requests"] + 4
    )
    header = "你是一个资深Python工程师，请回答以下问题：\n\n" * 3
    for question in ("如何实现一个LRU缓存？", "如何实现一个LFU缓存？", "如何实现一个FIFO缓存？"):
        generate(server, header + question, max_new_tokens=1)
    shared = get(server, "/cache_info").json()
    assert shared["cache_hits"] == led_by_ids["cache_hits"] + 2
    hit_tokens = shared["hit_cached_tokens_total"] - led_by_ids["hit_cached_tokens_total"]
    assert (
        hit_tokens > 2 * 30
        and shared["shared_prefix_length_avg"] == shared["hit_cached_tokens_total"] / shared["cache_hits"]
    )


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_flush_cache_empties_the_tree(server, method):
    generate(server, LONG_PROMPT, max_new_tokens=2)
    wait_idle(server)
    resp = requests.request(method, server.url + "/flush_cache", headers=server.headers(), timeout=TIMEOUT_S)
    assert resp.status_code == 200, resp.text
    assert generate(server, LONG_PROMPT, max_new_tokens=2)["meta_info"]["cached_tokens"] == 0


def test_a_request_not_streamed_times_its_first_token_and_the_rest(server):
    """As SGLang and vLLM time them in the engine: a request answered once at its end still
    counts its first token's time, not its whole time, and each token after it its share of
    the rest."""
    names = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds")
    before = {name: metric_value(server, f"vllm:{name}_sum") for name in names}
    counts = {name: metric_value(server, f"vllm:{name}_count") for name in names}
    generate(server, LONG_PROMPT, max_new_tokens=24, sampling_params={"ignore_eos": True})
    grew = {name: metric_value(server, f"vllm:{name}_sum") - before[name] for name in names}
    observed = {name: metric_value(server, f"vllm:{name}_count") - counts[name] for name in names}
    assert observed == {**dict.fromkeys(names, 1), "inter_token_latency_seconds": 23}
    # 23 decode steps come after the first token: its time is well short of the whole
    assert 0 < grew["time_to_first_token_seconds"] < grew["e2e_request_latency_seconds"]
    rest = grew["e2e_request_latency_seconds"] - grew["time_to_first_token_seconds"]
    assert math.isclose(grew["inter_token_latency_seconds"], rest, rel_tol=1e-6)


def test_metrics_counters_grow_with_requests(server):
    resp = get(server, "/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    assert "radixcluster_cache_hit_rate" not in resp.text
    names = (
        "radixcluster_requests_total",
        "radixcluster_generation_tokens_total",
        "radixcluster_prompt_tokens_total",
        "sglang_radix_cache_hit_total",
        "radixcluster_e2e_request_latency_seconds_count",
        "sglang:num_requests_total",
        "sglang:generation_tokens_total",
        "sglang:e2e_request_latency_seconds_count",
    )
    before = {name: metric_value(server, name) for name in names}
    generate(server, LONG_PROMPT, max_new_tokens=3, sampling_params={"ignore_eos": True})
    generate(server, LONG_PROMPT, max_new_tokens=3, sampling_params={"ignore_eos": True})
    after = {name: metric_value(server, name) for name in names}
    assert after["radixcluster_requests_total"] >= before["radixcluster_requests_total"] + 2
    assert after["radixcluster_generation_tokens_total"] >= before["radixcluster_generation_tokens_total"] + 6
    assert after["radixcluster_prompt_tokens_total"] > before["radixcluster_prompt_tokens_total"]
    assert after["sglang_radix_cache_hit_total"] >= before["sglang_radix_cache_hit_total"] + 1
    assert (
        after["radixcluster_e2e_request_latency_seconds_count"]
        >= before["radixcluster_e2e_request_latency_seconds_count"] + 2
    )
    assert metric_value(server, "radixcluster_radix_cache_hit_total") == after["sglang_radix_cache_hit_total"]
    # SGLang's names of the same counters, and the KV pool as SGLang's scrapers read it
    for ours, sglang in (
        ("radixcluster_requests_total", "sglang:num_requests_total"),
        ("radixcluster_generation_tokens_total", "sglang:generation_tokens_total"),
        ("radixcluster_e2e_request_latency_seconds_count", "sglang:e2e_request_latency_seconds_count"),
    ):
        assert after[sglang] - before[sglang] == after[ours] - before[ours], sglang
    info = get(server, "/get_server_info").json()
    assert metric_value(server, "sglang:max_total_num_tokens") == info["max_total_num_tokens"]
    assert 0 <= metric_value(server, "sglang:token_usage") <= metric_value(server, "radixcluster_token_usage")
    assert metric_value(server, "vllm:kv_cache_usage_perc") == metric_value(server, "sglang:token_usage")
    assert metric_value(server, "vllm:prefix_cache_hits_total") == metric_value(
        server, "radixcluster_cached_tokens_total"
    )


LONG_RUN = 4000  # far more tokens than the test waits for


def _long_request(stream: bool) -> dict:
    params = {**GREEDY, "max_new_tokens": LONG_RUN, "ignore_eos": True}
    return {"text": PROMPT, "sampling_params": params, "stream": stream}


def test_streaming_client_that_leaves_aborts_its_request(server):
    wait_idle(server)
    generated = metric_value(server, "radixcluster_generation_tokens_total")
    with requests.post(
        server.url + "/generate", json=_long_request(True), headers=server.headers(), stream=True, timeout=TIMEOUT_S
    ) as resp:
        next(resp.iter_lines())
    wait_idle(server)
    assert metric_value(server, "radixcluster_generation_tokens_total") - generated < LONG_RUN


def test_non_streaming_client_that_leaves_aborts_its_request(server):
    wait_idle(server)
    generated = metric_value(server, "radixcluster_generation_tokens_total")
    with pytest.raises(requests.Timeout):
        requests.post(server.url + "/generate", json=_long_request(False), headers=server.headers(), timeout=3)
    wait_idle(server)
    assert metric_value(server, "radixcluster_generation_tokens_total") - generated < LONG_RUN
    assert generate(server, PROMPT, max_new_tokens=2)["meta_info"]["completion_tokens"] <= 2


def test_vertex_predictions_are_the_generate_answers_of_the_instances(server):
    """Vertex AI's call, on SGLang's default route: {"instances", "parameters"} is one /generate."""
    params = {**GREEDY, "max_new_tokens": 4}
    prompts = ["The capital of France is", "One, two, three,"]
    call = {"instances": [{"text": p} for p in prompts], "parameters": {"sampling_params": params}}
    predictions = post(server, "/vertex_generate", call).json()["predictions"]
    answers = post(server, "/generate", {"text": prompts, "sampling_params": params}).json()
    assert [p["text"] for p in predictions] == [a["text"] for a in answers]
    assert [p["output_ids"] for p in predictions] == [a["output_ids"] for a in answers]
    assert post(server, "/vertex_generate", {"instances": []}).json() == []
    refused = post(
        server,
        "/vertex_generate",
        {"instances": [{"text": "hi"}], "parameters": {"sampling_params": {"temperature": -1}}},
    )
    assert refused.status_code == 400 and "temperature" in refused.json()["error"]["message"]
