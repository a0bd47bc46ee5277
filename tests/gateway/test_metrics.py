"""/metrics of the gateway: its own counters and its view of each replica, and every replica's
own metrics (rendered by the replica's real renderer) labelled with the replica."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from radixcluster.gateway.config import HealthTunables
from radixcluster.gateway.metrics import GatewayMetrics
from radixcluster.gateway.replica import Replica
from radixcluster.router.api.metrics import ApiMetrics


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_one_scrape_sees_the_gateway_and_every_replica() -> None:
    metrics = GatewayMetrics()
    metrics.requests.labels("http://a").inc(3)
    metrics.predictions.labels("evicted").inc()
    a, b = Replica("http://a", HealthTunables()), Replica("http://b", HealthTunables())
    a.poll_passed()
    a.load.inflight_requests = 2
    replica_text = ApiMetrics().render({"cached_tokens_total": 640, "running_requests": 2}, "m").decode()
    got = samples(metrics.render([a, b], {"http://a": replica_text, "http://b": replica_text}))
    assert got[("radixcluster_gateway_requests_total", (("replica", "http://a"),))] == 3
    assert got[("radixcluster_gateway_predictions_total", (("outcome", "evicted"),))] == 1
    assert got[("radixcluster_gateway_predictions_total", (("outcome", "exact"),))] == 0
    # counters the dashboard rates read 0 before their first event, not "no data"
    assert got[("radixcluster_gateway_retries_total", (("replica", "http://b"),))] == 0
    assert got[("radixcluster_gateway_replica_available", (("replica", "http://a"),))] == 1
    assert got[("radixcluster_gateway_replica_available", (("replica", "http://b"),))] == 0
    assert got[("radixcluster_gateway_inflight_requests", (("replica", "http://a"),))] == 2
    for url in ("http://a", "http://b"):
        assert got[("radixcluster_cached_tokens_total", (("replica", url),))] == 640
        assert got[("radixcluster_num_running_reqs", (("replica", url),))] == 2
        assert ("radixcluster_time_to_first_token_seconds_count", (("replica", url),)) in got
        assert got[("radixcluster_rejected_requests_total", (("reason", "queue_full"), ("replica", url)))] == 0
        assert got[("sglang:num_running_reqs", (("model_name", "m"), ("replica", url)))] == 2
