"""Prometheus metrics of one api app: latency histograms measured here, and the router's
counters and gauges rendered from its ``stats`` payload at each scrape; then, under SGLang's and
vLLM's own names, those they export too."""

from __future__ import annotations

from dataclasses import dataclass
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
    (
        "radixcluster_token_hit_rate",
        "token_hit_rate",
        "Prompt tokens served from the radix cache over prompt tokens received, since start.",
    ),
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

# Other engines' names of the families counted here as those engines count them (counters keep
# their ``_total``, histograms their buckets, ours), so that what reads those engines reads a
# replica: SGLang's Grafana dashboard; the Kubernetes Gateway API Inference Extension, whose
# scrapers read SGLang's queue, running, token_usage and cache_config_info or vLLM's
# num_requests_waiting, num_requests_running, kv_cache_usage_perc and cache_config_info; vLLM's
# dashboards and routers. Each engine's labels are its own (SGLang: model_name; vLLM: model_name
# and engine).
_SGLANG_NAMES = (
    ("radixcluster_prompt_tokens", "sglang:prompt_tokens"),
    ("radixcluster_generation_tokens", "sglang:generation_tokens"),
    ("radixcluster_cached_tokens", "sglang:cached_tokens"),
    ("radixcluster_requests", "sglang:num_requests"),
    ("radixcluster_aborted_requests", "sglang:num_aborted_requests"),
    ("radixcluster_num_running_reqs", "sglang:num_running_reqs"),
    ("radixcluster_num_waiting_reqs", "sglang:num_queue_reqs"),
    ("radixcluster_gen_throughput", "sglang:gen_throughput"),
    ("radixcluster_token_hit_rate", "sglang:cache_hit_rate"),
    ("radixcluster_time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    ("radixcluster_inter_token_latency_seconds", "sglang:inter_token_latency_seconds"),
    ("radixcluster_e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
)
_VLLM_NAMES = (
    ("radixcluster_prompt_tokens", "vllm:prompt_tokens"),
    ("radixcluster_generation_tokens", "vllm:generation_tokens"),
    # vLLM counts its prefix cache in tokens: those looked up (every prompt token) and those found
    ("radixcluster_prompt_tokens", "vllm:prefix_cache_queries"),
    ("radixcluster_cached_tokens", "vllm:prefix_cache_hits"),
    ("radixcluster_num_running_reqs", "vllm:num_requests_running"),
    ("radixcluster_num_waiting_reqs", "vllm:num_requests_waiting"),
    ("radixcluster_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"),
    ("radixcluster_inter_token_latency_seconds", "vllm:inter_token_latency_seconds"),
    ("radixcluster_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds"),
)

# CPU serving is slow: the buckets reach into tens of seconds.
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def _router_families(stats: dict[str, Any]) -> list[Metric]:
    """The families of one ``stats`` payload."""
    families: list[Metric] = []
    for name, key, doc in _COUNTERS:
        if key in stats:
            families.append(CounterMetricFamily(name, doc, value=float(stats[key])))
    for name, key, doc in _GAUGES:
        if key in stats:
            families.append(GaugeMetricFamily(name, doc, value=float(stats[key])))
    for name, key, doc in _HISTOGRAMS:
        if key in stats:
            h = stats[key]
            buckets = [(repr(float(b)), c) for b, c in zip(h["buckets"], h["counts"])]
            buckets.append(("+Inf", h["count"]))
            families.append(HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h["sum"]))
    return families + _tenant_counters(stats.get("tenants") or {})


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


@dataclass(frozen=True, slots=True)
class _Pool:
    """The KV pool as other engines report it: what requests hold, not what the tree keeps
    evictable (both SGLang and vLLM count cached tokens no request uses as free)."""

    page_size: int
    num_pages: int
    used_tokens: int

    @classmethod
    def of(cls, stats: dict[str, Any]) -> _Pool | None:
        if not {"num_pages", "free_pages", "page_size", "evictable_tokens"} <= stats.keys():
            return None
        page_size, num_pages = int(stats["page_size"]), int(stats["num_pages"])
        used = (num_pages - int(stats["free_pages"])) * page_size - int(stats["evictable_tokens"])
        return cls(page_size, num_pages, used)

    @property
    def total_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def usage(self) -> float:
        return self.used_tokens / self.total_tokens if self.total_tokens else 0.0


def _gauge(name: str, doc: str, labels: dict[str, str], value: float) -> Metric:
    gauge = GaugeMetricFamily(name, doc, labels=list(labels))
    gauge.add_metric(list(labels.values()), float(value))
    return gauge


def _renamed(families: list[Metric], names: tuple[tuple[str, str], ...], labels: dict[str, str]) -> list[Metric]:
    """The families that ``names`` pairs (ours, theirs) name, under their names with ``labels`` added."""
    by_name = {family.name: family for family in families}
    out: list[Metric] = []
    for ours, name in names:
        family = by_name.get(ours)
        if family is None:
            continue
        renamed = Metric(name, family.documentation, family.type)
        for sample in family.samples:
            suffix = sample.name[len(family.name) :]  # _total, _bucket, _sum, _count, _created
            renamed.add_sample(name + suffix, {**sample.labels, **labels}, sample.value, sample.timestamp)
        out.append(renamed)
    return out


def _sglang_pool(pool: _Pool, labels: dict[str, str]) -> list[Metric]:
    info = {**labels, "page_size": str(pool.page_size), "num_pages": str(pool.num_pages)}
    return [
        _gauge("sglang:num_used_tokens", "Tokens of the KV pool that requests hold.", labels, pool.used_tokens),
        _gauge("sglang:token_usage", "Fraction of the KV pool that requests hold.", labels, pool.usage),
        _gauge("sglang:max_total_num_tokens", "Tokens the KV pool holds.", labels, pool.total_tokens),
        _gauge("sglang:cache_config_info", "The KV pool's layout (value 1).", info, 1),
    ]


def _vllm_pool(pool: _Pool, labels: dict[str, str]) -> list[Metric]:
    info = {**labels, "block_size": str(pool.page_size), "num_gpu_blocks": str(pool.num_pages)}
    return [
        _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, pool.usage),
        _gauge("vllm:cache_config_info", "The KV pool's layout (value 1).", info, 1),
    ]


def _peer_families(own: list[Metric], stats: dict[str, Any], model_name: str) -> list[Metric]:
    """SGLang's and vLLM's names of the families of ``own``, and their KV-pool gauges."""
    sglang = {"model_name": model_name}
    vllm = {"model_name": model_name, "engine": "0"}
    families = _renamed(own, _SGLANG_NAMES, sglang) + _renamed(own, _VLLM_NAMES, vllm)
    pool = _Pool.of(stats)
    if pool is not None:
        families += _sglang_pool(pool, sglang) + _vllm_pool(pool, vllm)
    return families


class _Families:
    """A collector of families already collected: each scrape collects once and renders once."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


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
        for reason in REJECTION_REASONS.values():  # each at 0 from the start, as dashboards read rates
            self.rejected_requests.labels(reason=reason)

    def count_rejection(self, status: int) -> None:
        """Count an error answer under its reason, when it refused a request."""
        reason = REJECTION_REASONS.get(status)
        if reason is not None:
            self.rejected_requests.labels(reason=reason).inc()

    def render(self, router_stats: dict[str, Any], model_name: str) -> bytes:
        """Prometheus text: the router's counters, gauges and step histogram, then the api's own,
        then SGLang's and vLLM's names of them for the served ``model_name``."""
        own = [*_router_families(router_stats), *self.registry.collect()]
        scrape = CollectorRegistry()
        scrape.register(_Families([*own, *_peer_families(own, router_stats, model_name)]))
        return generate_latest(scrape)
