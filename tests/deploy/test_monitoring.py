"""The Grafana dashboard and the Prometheus alert rules query only metrics the server and the
gateway export (read from their real /metrics renderers), and the chart ships these very files."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from radixcluster.gateway.config import HealthTunables
from radixcluster.gateway.metrics import GatewayMetrics
from radixcluster.gateway.replica import Replica
from radixcluster.router.api import metrics as api_metrics
from radixcluster.router.step_times import StepTimes
from support.chart_checks import CHART, REPO

DASHBOARD = REPO / "deploy" / "grafana" / "radixcluster-dashboard.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
# What PromQL expressions may name besides metrics: functions, keywords, labels, time units.
PROMQL_WORDS = {
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "and",
    "or",
    "unless",
    "offset",
    "rate",
    "irate",
    "increase",
    "deriv",
    "histogram_quantile",
    "min_over_time",
    "max_over_time",
    "avg_over_time",
    "label_values",
    "le",
    "reason",
    "job",
    "instance",
    "pod",
    "namespace",
    "replica",
    "outcome",
}
ISSUE_METRICS = {
    "radixcluster_prompt_tokens_total",
    "radixcluster_cached_tokens_total",
    "radixcluster_generation_tokens_total",
    "radixcluster_requests_total",
    "radixcluster_radix_cache_hit_total",
    "radixcluster_evicted_tokens_total",
    "radixcluster_num_running_reqs",
    "radixcluster_num_waiting_reqs",
    "radixcluster_token_usage",
    "radixcluster_time_to_first_token_seconds_bucket",
    "radixcluster_inter_token_latency_seconds_bucket",
    "radixcluster_e2e_request_latency_seconds_bucket",
    "radixcluster_gateway_requests_total",
    "radixcluster_gateway_predicted_cached_tokens_total",
    "radixcluster_gateway_cached_tokens_total",
    "radixcluster_gateway_predictions_total",
    "radixcluster_gateway_replica_available",
}


# what the hardening added: refusals by reason, aborts, retractions, step time
HARDENING_METRICS = {
    "radixcluster_rejected_requests_total",
    "radixcluster_aborted_requests_total",
    "radixcluster_retracted_requests_total",
    "radixcluster_step_duration_seconds_bucket",
}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Every sample name /metrics serves, from the real renderers: a replica's with every router
    stat present (the step histogram as the router's StepTimes reports it) and a refusal counted,
    and a gateway's with one replica."""
    stats: dict[str, Any] = {key: 1.0 for _, key, _ in api_metrics._COUNTERS + api_metrics._GAUGES}
    stats.update(num_pages=8, free_pages=2, page_size=1, evictable_tokens=3)  # the pool, as SGLang and vLLM name it
    steps = StepTimes()
    steps.observe(0.02)
    stats["step_seconds"] = steps.snapshot()
    metrics = api_metrics.ApiMetrics()
    metrics.count_rejection(429)
    replica = metrics.render(stats, "m").decode()
    gateway = GatewayMetrics()
    gateway.requests.labels("http://r").inc()
    gateway.predicted_tokens.labels("http://r").inc()
    gateway.cached_tokens.labels("http://r").inc()
    gateway.retries.labels("http://r").inc()
    text = replica + gateway.render([Replica("http://r", HealthTunables())], {}).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def metric_names(expr: str) -> set[str]:
    """Identifiers of ``expr`` that are neither PromQL words nor inside label matchers,
    strings, durations or Grafana variables."""
    bare = re.sub(r'"[^"]*"|\{[^}]*\}|\$\w+|\[[^\]]*\]|\b\d+(?:ms|[smhdwy])\b', " ", expr)
    return set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)) - PROMQL_WORDS


def dashboard_exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_exprs(item)


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_the_server_exports_the_metrics_deploy_relies_on(exported: set[str]) -> None:
    assert ISSUE_METRICS <= exported
    assert HARDENING_METRICS <= exported


def test_the_step_histogram_counts_every_step_once(exported: set[str]) -> None:
    steps = StepTimes()
    for seconds in (0.001, 0.02, 0.02, 30.0):
        steps.observe(seconds)
    text = api_metrics.ApiMetrics().render({"step_seconds": steps.snapshot()}, "m").decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "radixcluster_step_duration_seconds"]
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert (buckets["0.005"], buckets["0.025"], buckets["10.0"], buckets["+Inf"]) == (1, 3, 3, 4)


def test_dashboard_queries_exported_metrics(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = list(dashboard_exprs(dashboard["panels"])) + list(dashboard_exprs(dashboard["templating"]))
    assert len(exprs) >= 20
    used = set().union(*(metric_names(e) for e in exprs))
    assert used <= exported | {"up"}, used - exported
    assert {"radixcluster_generation_tokens_total", "radixcluster_token_usage"} <= used
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Time to first token", "Inter-token latency", "Prefix cache hit rate", "Queue"} <= titles
    assert {"Gateway: predicted vs actual cached tokens", "Gateway: predictions by outcome"} <= titles
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_dashboard_reads_counters_as_rates() -> None:
    for expr in dashboard_exprs(json.loads(DASHBOARD.read_text())["panels"]):
        for counter in re.findall(r"radixcluster_\w+_(?:total|bucket)\b", expr):
            assert re.search(rf"rate\({counter}\b", expr), f"{counter} read without rate() in {expr}"


def test_alerts_query_exported_metrics(exported: set[str]) -> None:
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert {
        "RadixclusterDown",
        "RadixclusterCacheHitRateCollapse",
        "RadixclusterQueueGrowing",
        "RadixclusterKVCacheExhausted",
        "RadixclusterGatewayNoReplica",
        "RadixclusterGatewayPredictionsDrift",
    } == names
    for rule in rules:
        assert metric_names(rule["expr"]) <= exported | {"up"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and re.fullmatch(r"\d+[smh]", rule["for"])


def test_metric_name_check_catches_a_typo(exported: set[str]) -> None:
    assert metric_names('sum(rate(radixcluster_generated_tokens_total{job=~"$job"}[5m]))') - exported


def test_chart_ships_these_files() -> None:
    for shipped, source in (
        (CHART / "files" / "alerts.yaml", ALERTS),
        (CHART / "files" / "radixcluster-dashboard.json", DASHBOARD),
    ):
        assert shipped.resolve() == source.resolve()
