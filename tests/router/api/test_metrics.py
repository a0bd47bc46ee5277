"""The api's /metrics text, parsed back as Prometheus reads it: the router's counters and gauges
and the api's histograms under our names, and again under SGLang's names with its model_name
label, with SGLang's KV-pool gauges counting what requests hold (not what the tree keeps)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from radixcluster.router.api.metrics import ApiMetrics

STATS = {
    "prompt_tokens_total": 1000,
    "cached_tokens_total": 600,
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
    }
    for ours, sglang in pairs.items():
        assert got[(sglang, MODEL)] == got[(ours, ())], sglang
    assert got[("sglang:num_queue_reqs", MODEL)] == 2 and got[("sglang:num_running_reqs", MODEL)] == 3


def test_latency_histograms_are_exported_under_sglang_names_too() -> None:
    got = rendered()
    for ours, sglang in (
        ("radixcluster_time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
        ("radixcluster_inter_token_latency_seconds", "sglang:inter_token_latency_seconds"),
        ("radixcluster_e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
    ):
        assert got[(sglang + "_count", MODEL)] == got[(ours + "_count", ())]
        assert got[(sglang + "_sum", MODEL)] == got[(ours + "_sum", ())]
        buckets = {labels: v for (name, labels), v in got.items() if name == ours + "_bucket"}
        for labels, value in buckets.items():
            assert got[(sglang + "_bucket", tuple(sorted((*labels, *MODEL))))] == value
    assert got[("sglang:inter_token_latency_seconds_count", MODEL)] == 2


def test_sglang_pool_gauges_count_what_requests_hold() -> None:
    got = rendered()
    # 1,600 tokens; 640 free and 320 evictable in the tree: requests hold 640
    assert got[("sglang:max_total_num_tokens", MODEL)] == 1600
    assert got[("sglang:num_used_tokens", MODEL)] == 640
    assert got[("sglang:token_usage", MODEL)] == 0.4
    info = tuple(sorted((*MODEL, ("page_size", "16"), ("num_pages", "100"))))
    assert got[("sglang:cache_config_info", info)] == 1


def test_a_payload_without_the_pool_renders_without_its_gauges() -> None:
    got = parsed(ApiMetrics().render({"running_requests": 1}, "m"))
    assert got[("sglang:num_running_reqs", (("model_name", "m"),))] == 1
    assert not any(name.startswith(("sglang:token_usage", "sglang:cache_config_info")) for name, _ in got)
