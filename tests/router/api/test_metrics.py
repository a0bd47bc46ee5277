"""The api's /metrics text, parsed back as Prometheus reads it: the router's counters and gauges
and the api's histograms under our names, and again under SGLang's names with its model_name
label and under vLLM's with its model_name and engine labels, with their KV-pool gauges counting
what requests hold (not what the tree keeps)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixcluster.router.api.metrics import ApiMetrics

STATS = {
    "prompt_tokens_total": 1000,
    "cached_tokens_total": 600,
    "token_hit_rate": 0.6,
    "generation_tokens_total": 96,
    "total_requests": 7,
    "aborted_requests_total": 1,
    "running_requests": 3,
    "waiting_requests": 2,
    "gen_throughput": 123.5,
    "num_pages": 100,
    "page_size": 16,
    "free_pages": 40,
    "evictable_tokens": 320,
}


def parsed(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def rendered() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    metrics = ApiMetrics()
    metrics.time_to_first_token.observe(0.3)
    metrics.inter_token_latency.observe(0.04)
    metrics.inter_token_latency.observe(0.05)
    metrics.e2e_request_latency.observe(1.5)
    return parsed(metrics.render(STATS, "served-model"))


MODEL = (("model_name", "served-model"),)
VLLM = (("engine", "0"), ("model_name", "served-model"))


def test_sglang_names_carry_our_values_with_the_model_name() -> None:
    got = rendered()
    pairs = {
        "radixcluster_prompt_tokens_total": "sglang:prompt_tokens_total",
        "radixcluster_cached_tokens_total": "sglang:cached_tokens_total",
        "radixcluster_generation_tokens_total": "sglang:generation_tokens_total",
        "radixcluster_requests_total": "sglang:num_requests_total",
        "radixcluster_aborted_requests_total": "sglang:num_aborted_requests_total",
        "radixcluster_num_running_reqs": "sglang:num_running_reqs",
        "radixcluster_num_waiting_reqs": "sglang:num_queue_reqs",
        "radixcluster_gen_throughput": "sglang:gen_throughput",
        "radixcluster_token_hit_rate": "sglang:cache_hit_rate",
    }
    for ours, sglang in pairs.items():
        assert got[(sglang, MODEL)] == got[(ours, ())], sglang
    assert got[("sglang:num_queue_reqs", MODEL)] == 2 and got[("sglang:num_running_reqs", MODEL)] == 3
    assert got[("sglang:cache_hit_rate", MODEL)] == 0.6


def test_vllm_names_carry_our_values_with_its_labels() -> None:
    got = rendered()
    pairs = {
        "radixcluster_prompt_tokens_total": ("vllm:prompt_tokens_total", "vllm:prefix_cache_queries_total"),
        "radixcluster_cached_tokens_total": ("vllm:prefix_cache_hits_total",),
        "radixcluster_generation_tokens_total": ("vllm:generation_tokens_total",),
        "radixcluster_num_running_reqs": ("vllm:num_requests_running",),
        "radixcluster_num_waiting_reqs": ("vllm:num_requests_waiting",),
    }
    for ours, names in pairs.items():
        for vllm in names:
            assert got[(vllm, VLLM)] == got[(ours, ())], vllm
    assert got[("vllm:prefix_cache_hits_total", VLLM)] / got[("vllm:prefix_cache_queries_total", VLLM)] == 0.6


@pytest.mark.parametrize("prefix, labels", [("sglang:", MODEL), ("vllm:", VLLM)])
def test_latency_histograms_are_exported_under_their_names_too(prefix, labels) -> None:
    got = rendered()
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        ours, theirs = "radixcluster_" + name, prefix + name
        assert got[(theirs + "_count", labels)] == got[(ours + "_count", ())]
        assert got[(theirs + "_sum", labels)] == got[(ours + "_sum", ())]
        buckets = {bucket: v for (sample, bucket), v in got.items() if sample == ours + "_bucket"}
        for bucket, value in buckets.items():
            assert got[(theirs + "_bucket", tuple(sorted((*bucket, *labels))))] == value
    assert got[(prefix + "inter_token_latency_seconds_count", labels)] == 2


def test_pool_gauges_count_what_requests_hold() -> None:
    got = rendered()
    # 1,600 tokens; 640 free and 320 evictable in the tree: requests hold 640
    assert got[("sglang:max_total_num_tokens", MODEL)] == 1600
    assert got[("sglang:num_used_tokens", MODEL)] == 640
    assert got[("sglang:token_usage", MODEL)] == 0.4
    info = tuple(sorted((*MODEL, ("page_size", "16"), ("num_pages", "100"))))
    assert got[("sglang:cache_config_info", info)] == 1
    assert got[("vllm:kv_cache_usage_perc", VLLM)] == 0.4
    info = tuple(sorted((*VLLM, ("block_size", "16"), ("num_gpu_blocks", "100"))))
    assert got[("vllm:cache_config_info", info)] == 1


def test_a_payload_without_the_pool_renders_without_its_gauges() -> None:
    got = parsed(ApiMetrics().render({"running_requests": 1}, "m"))
    assert got[("sglang:num_running_reqs", (("model_name", "m"),))] == 1
    pool = ("sglang:token_usage", "sglang:cache_config_info", "vllm:kv_cache_usage_perc", "vllm:cache_config_info")
    assert not any(name.startswith(pool) for name, _ in got)
