"""The gateway's Prometheus metrics: requests per replica, predicted against actual cached
tokens and why they differed, retries, routing time, and each replica's state; plus every
replica's own metrics, labelled with the replica, so one scrape sees the whole cluster."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from radixcluster.gateway.replica import Replica

# why predicted and actual cached tokens differed (see predictions.py)
OUTCOMES = ("exact", "evicted", "in_flight", "tokenization", "stale_view")
_OWN_TIME_BUCKETS = (0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.1)


class _ReplicaState:
    """Gauges read from the replicas at each scrape."""

    def __init__(self, replicas: Iterable[Replica]) -> None:
        self._replicas = list(replicas)

    def collect(self) -> list[Metric]:
        up = GaugeMetricFamily(
            "radixcluster_gateway_replica_available", "1 if the replica gets traffic.", labels=["replica"]
        )
        blocks = GaugeMetricFamily(
            "radixcluster_gateway_view_cached_tokens",
            "Tokens the gateway's view says the replica's tree holds.",
            labels=["replica"],
        )
        inflight = GaugeMetricFamily(
            "radixcluster_gateway_inflight_requests", "Requests sent to the replica, not finished.", labels=["replica"]
        )
        load = GaugeMetricFamily(
            "radixcluster_gateway_load_tokens", "Running and waiting tokens the routing counts.", labels=["replica"]
        )
        resyncs = CounterMetricFamily(
            "radixcluster_gateway_view_resyncs",
            "Snapshots the view of the replica was synced from.",
            labels=["replica"],
        )
        for r in self._replicas:
            up.add_metric([r.url], float(r.available))
            blocks.add_metric([r.url], float(len(r.view.cached) * r.view.page_size))
            inflight.add_metric([r.url], float(r.load.inflight_requests))
            load.add_metric([r.url], float(r.load.tokens))
            resyncs.add_metric([r.url], float(r.view.resyncs))
        return [up, blocks, inflight, load, resyncs]


class _Relabelled:
    """Metric families parsed from a replica's /metrics, each sample labelled with the replica."""

    def __init__(self, texts: dict[str, str]) -> None:
        self._texts = texts

    def collect(self) -> list[Metric]:
        merged: dict[str, Metric] = {}
        for url, text in self._texts.items():
            for family in text_string_to_metric_families(text):
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type)
                for sample in family.samples:
                    out.add_sample(sample.name, {**sample.labels, "replica": url}, sample.value)
        return list(merged.values())


class GatewayMetrics:
    """The gateway's own counters and histograms, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "radixcluster_gateway_requests", "Requests forwarded.", ["replica"], registry=self.registry
        )
        self.retries = Counter(
            "radixcluster_gateway_retries",
            "Requests that failed on a replica before their first byte and were sent to another.",
            ["replica"],
            registry=self.registry,
        )
        self.predicted_tokens = Counter(
            "radixcluster_gateway_predicted_cached_tokens",
            "Prompt tokens the gateway predicted cached on the replica it chose.",
            ["replica"],
            registry=self.registry,
        )
        self.cached_tokens = Counter(
            "radixcluster_gateway_cached_tokens",
            "Prompt tokens the replicas reported cached, for the same requests.",
            ["replica"],
            registry=self.registry,
        )
        self.predictions = Counter(
            "radixcluster_gateway_predictions",
            "Predictions checked against the replica's report, by outcome: exact, or why they differed.",
            ["outcome"],
            registry=self.registry,
        )
        self.gap_tokens = Counter(
            "radixcluster_gateway_prediction_gap_tokens",
            "Tokens by which predicted and actual cached tokens differed, by reason.",
            ["outcome"],
            registry=self.registry,
        )
        self.routing_seconds = Histogram(
            "radixcluster_gateway_routing_seconds",
            "Time from a request's arrival to its forwarding: read, tokenize, place.",
            buckets=_OWN_TIME_BUCKETS,
            registry=self.registry,
        )
        self.own_seconds = Histogram(
            "radixcluster_gateway_own_seconds",
            "Time a non-streamed request spends in the gateway itself: before it is forwarded, "
            "and from the replica's answer to the gateway's (not the wait for the replica).",
            buckets=_OWN_TIME_BUCKETS,
            registry=self.registry,
        )
        for outcome in OUTCOMES:
            self.predictions.labels(outcome)
            self.gap_tokens.labels(outcome)

    def render(self, replicas: Iterable[Replica], replica_texts: dict[str, str]) -> bytes:
        """Prometheus text: the gateway's metrics, its view of each replica, each replica's own."""
        replicas = list(replicas)
        for replica in replicas:
            self.retries.labels(replica.url)  # 0 until the first: a dashboard's rate reads "no data" otherwise
        scrape = CollectorRegistry()
        scrape.register(_ReplicaState(replicas))
        scrape.register(_Relabelled(replica_texts))
        return generate_latest(self.registry) + generate_latest(scrape)
