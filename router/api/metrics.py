"""Prometheus metrics of one api app: latency histograms measured here, and the router's
counters and gauges rendered from its ``stats`` payload at each scrape; then, under SGLang's own
names, those SGLang exports too."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (exported name, stats key, help); counters get the ``_total`` suffix from prometheus_client.
_COUNTERS = (
    ("radixcluster_prompt_tokens", "prompt_tokens_total", "Prompt tokens received."),
    ("radixcluster_cached_tokens", "cached_tokens_total", "Prompt tokens served from the radix cache."),
    ("radixcluster_generation_tokens", "generation_tokens_total", "Tokens generated."),
    ("radixcluster_requests", "total_requests", "Requests admitted (each counted once, at its first admission)."),
    ("radixcluster_radix_cache_hit", "cache_hits", "Requests that reused a cached prefix."),
    # SGLang's name for the same counter, so existing dashboards keep working.
    ("sglang_radix_cache_hit", "cache_hits", "Requests that reused a cached prefix (SGLang name)."),
    ("radixcluster_evicted_tokens", "evicted_tokens_total", "Tokens evicted from the radix cache."),
    (
        "radixcluster_aborted_requests",
        "aborted_requests_total",
        "Requests ended before they finished: client gone, deadline, shutdown, or a failed step.",
    ),
    (
        "radixcluster_retracted_requests",
        "retractions_total",
        "Running requests sent back to the queue (their KV freed) when the KV pool ran out.",
    ),
    ("radixcluster_worker_restarts", "worker_restarts_total", "TP groups replaced after a rank died, hung or failed."),
    (
        "radixcluster_requeued_requests",
        "requeued_requests_total",
        "Requests re-queued, with the tokens they had streamed, when their TP group was lost.",
    ),
    (
        "radixcluster_seconds_without_workers",
        "seconds_without_group_total",
        "Seconds spent with no TP group serving (between a loss and its replacement).",
    ),
)
# (exported name, key of each tenant's stats, help)
_TENANT_COUNTERS = (
    ("radixcluster_tenant_requests", "requests", "Requests admitted, by tenant."),
    ("radixcluster_tenant_prompt_tokens", "prompt_tokens_total", "Prompt tokens received, by tenant."),
    (
        "radixcluster_tenant_cached_tokens",
        "cached_tokens_total",
        "Prompt tokens served from the radix cache, by tenant.",
    ),
)
_TENANT_GAUGE = (
    "radixcluster_tenant_tree_tokens",
    "cached_tokens",
    "Tokens the tenant's prefixes hold in the radix tree.",
)
# (exported name, stats key, help): a histogram the router keeps (cumulative bucket counts)
_HISTOGRAMS = (("radixcluster_step_duration_seconds", "step_seconds", "Router steps: schedule, model step, outputs."),)
# HTTP statuses that refuse a request before it runs, by the reason they are counted under
REJECTION_REASONS = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    429: "queue_full",
    503: "unavailable",
}
_GAUGES = (
    ("radixcluster_num_running_reqs", "running_requests", "Requests being decoded or prefilled."),
    ("radixcluster_num_waiting_reqs", "waiting_requests", "Requests waiting for admission."),
    ("radixcluster_token_usage", "token_usage", "Fraction of KV pages in use."),
    ("radixcluster_tree_cached_tokens", "cached_tokens", "Tokens held by the radix tree."),
    ("radixcluster_evictable_tokens", "evictable_tokens", "Tokens in the tree that no request locks."),
    ("radixcluster_free_pages", "free_pages", "Free KV pages."),
    ("radixcluster_total_pages", "num_pages", "KV pages in the pool."),
    ("radixcluster_tree_nodes", "tree_nodes", "Nodes of the radix tree."),
    ("radixcluster_pinned_tokens", "pinned_tokens", "Tokens of the radix tree that pins keep from eviction."),
    ("radixcluster_workers_up", "group_up", "1 while a TP group serves, 0 while one is being replaced."),
    (
        "radixcluster_gen_throughput",
        "gen_throughput",
        "Tokens per second decoded over the last --decode-log-interval decode steps (0 once 30 s old).",
    ),
)

# SGLang's names (labelled ``model_name``, as SGLang labels them) of the families counted here as
# SGLang counts them: SGLang's Grafana dashboard, and the Kubernetes Gateway API Inference
# Extension's scraper for SGLang (queue, running, token_usage, cache_config_info), read a replica
# as they read SGLang. Counters keep their ``_total``, histograms their buckets (ours).
_SGLANG_NAMES = {
    "radixcluster_prompt_tokens": "sglang:prompt_tokens",
    "radixcluster_generation_tokens": "sglang:generation_tokens",
    "radixcluster_cached_tokens": "sglang:cached_tokens",
    "radixcluster_requests": "sglang:num_requests",
    "radixcluster_aborted_requests": "sglang:num_aborted_requests",
    "radixcluster_num_running_reqs": "sglang:num_running_reqs",
    "radixcluster_num_waiting_reqs": "sglang:num_queue_reqs",
    "radixcluster_gen_throughput": "sglang:gen_throughput",
    "radixcluster_time_to_first_token_seconds": "sglang:time_to_first_token_seconds",
    "radixcluster_inter_token_latency_seconds": "sglang:inter_token_latency_seconds",
    "radixcluster_e2e_request_latency_seconds": "sglang:e2e_request_latency_seconds",
}

# CPU serving is slow: the buckets reach into tens of seconds.
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class _RouterStats:
    """A collector over one ``stats`` payload."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self._stats = stats

    def collect(self) -> list[Metric]:
        families: list[Metric] = []
        for name, key, doc in _COUNTERS:
            if key in self._stats:
                families.append(CounterMetricFamily(name, doc, value=float(self._stats[key])))
        for name, key, doc in _GAUGES:
            if key in self._stats:
                families.append(GaugeMetricFamily(name, doc, value=float(self._stats[key])))
        for name, key, doc in _HISTOGRAMS:
            if key in self._stats:
                h = self._stats[key]
                buckets = [(repr(float(b)), c) for b, c in zip(h["buckets"], h["counts"])]
                buckets.append(("+Inf", h["count"]))
                families.append(HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h["sum"]))
        families += _tenant_counters(self._stats.get("tenants") or {})
        return families


def _tenant_counters(tenants: dict[str, dict[str, int]]) -> list[Metric]:
    """Requests, prompt and cached tokens of each tenant (--api-key-file), and what its prefixes
    hold in the tree now, labelled ``tenant``."""
    families: list[Metric] = []
    kinds = [(CounterMetricFamily, spec) for spec in _TENANT_COUNTERS] + [(GaugeMetricFamily, _TENANT_GAUGE)]
    for kind, (name, key, doc) in kinds:
        family = kind(name, doc, labels=["tenant"])
        for tenant, counts in sorted(tenants.items()):
            family.add_metric([tenant], float(counts[key]))
        families.append(family)
    return families


class _SglangNames:
    """The families of ``own`` that SGLang exports too, under its names; and its KV-pool gauges,
    which count (as SGLang does) the tokens that requests hold, not what the tree keeps evictable."""

    def __init__(self, own: list[Metric], stats: dict[str, Any], model_name: str) -> None:
        self._own, self._stats, self._model = own, stats, model_name

    def collect(self) -> list[Metric]:
        label = {"model_name": self._model}
        families: list[Metric] = []
        for family in self._own:
            name = _SGLANG_NAMES.get(family.name)
            if name is None:
                continue
            renamed = Metric(name, family.documentation, family.type)
            for sample in family.samples:
                suffix = sample.name[len(family.name) :]  # _total, _bucket, _sum, _count, _created
                renamed.add_sample(name + suffix, {**sample.labels, **label}, sample.value, sample.timestamp)
            families.append(renamed)
        if {"num_pages", "free_pages", "page_size", "evictable_tokens"} <= self._stats.keys():
            families += self._pool_gauges(label)
        return families

    def _pool_gauges(self, label: dict[str, str]) -> list[Metric]:
        page_size, num_pages = int(self._stats["page_size"]), int(self._stats["num_pages"])
        total = num_pages * page_size
        used = total - int(self._stats["free_pages"]) * page_size - int(self._stats["evictable_tokens"])
        gauges = (
            ("sglang:num_used_tokens", "Tokens of the KV pool that requests hold.", used),
            ("sglang:token_usage", "Fraction of the KV pool that requests hold.", used / total if total else 0.0),
            ("sglang:max_total_num_tokens", "Tokens the KV pool holds.", total),
        )
        families: list[Metric] = []
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=list(label))
            gauge.add_metric(list(label.values()), float(value))
            families.append(gauge)
        info = {**label, "page_size": str(page_size), "num_pages": str(num_pages)}
        config = GaugeMetricFamily("sglang:cache_config_info", "The KV pool's layout (value 1).", labels=list(info))
        config.add_metric(list(info.values()), 1.0)
        return [*families, config]


class ApiMetrics:
    """Latency histograms of one app, in a registry of its own (two apps never collide)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.time_to_first_token = Histogram(
            "radixcluster_time_to_first_token_seconds",
            "Time from request arrival to its first token.",
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )
        self.inter_token_latency = Histogram(
            "radixcluster_inter_token_latency_seconds",
            "Time between consecutive output tokens.",
            buckets=_ITL_BUCKETS,
            registry=self.registry,
        )
        self.e2e_request_latency = Histogram(
            "radixcluster_e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
            buckets=_E2E_BUCKETS,
            registry=self.registry,
        )
        self.rejected_requests = Counter(
            "radixcluster_rejected_requests",
            "Requests refused before they ran, by reason (invalid_request, queue_full, unavailable, ...).",
            ["reason"],
            registry=self.registry,
        )

    def count_rejection(self, status: int) -> None:
        """Count an error answer under its reason, when it refused a request."""
        reason = REJECTION_REASONS.get(status)
        if reason is not None:
            self.rejected_requests.labels(reason=reason).inc()

    def render(self, router_stats: dict[str, Any], model_name: str) -> bytes:
        """Prometheus text: the router's counters, gauges and step histogram, then the api's own,
        then SGLang's names of them for the served ``model_name``."""
        scrape = CollectorRegistry()
        scrape.register(_RouterStats(router_stats))
        own = [*scrape.collect(), *self.registry.collect()]
        sglang = CollectorRegistry()
        sglang.register(_SglangNames(own, router_stats, model_name))
        return generate_latest(scrape) + generate_latest(self.registry) + generate_latest(sglang)
