"""Predicted against actual cached tokens, request by request, and why they differed:

- ``evicted``: the replica evicted predicted blocks after the request was placed;
- ``in_flight``: the tree changed between placement and admission in a way the view could
  not know: blocks another request was computing landed first, or a pending prompt shared
  too short a run with this one for the router to make it wait, so both computed it;
- ``tokenization``: the router's ids are not a fresh encode of the text (it reuses the ids
  of an earlier prompt + answer that the text extends: the prompt memo);
- ``stale_view``: the view was being resynced when the request was placed.

A cache salt never explains a gap: the gateway names blocks with the salt as the router does.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from radixcluster.gateway.metrics import OUTCOMES, GatewayMetrics
from radixcluster.gateway.routing import Placement


@dataclass(slots=True)
class Report:
    """What the replica said about some prompts of a request (OpenAI sums its usage over them)."""

    indices: list[int]
    cached_tokens: int
    prompt_tokens: int


def classify(placement: Placement, report: Report, our_prompt_tokens: int) -> str:
    predicted = sum(placement.predicted[i] for i in report.indices)
    if report.cached_tokens == predicted:
        return "exact"
    if report.prompt_tokens != our_prompt_tokens:
        return "tokenization"
    view = placement.replica.view
    if report.cached_tokens < predicted:
        for i in report.indices:
            names = placement.names[i][: placement.predicted[i] // view.page_size]
            if any(view.evicted_since(name, placement.seq) for name in names):
                return "evicted"
    return "in_flight" if placement.synced else "stale_view"


class PredictionLedger:
    """Counts outcomes into the metrics, and keeps their totals for ``/cache_info``."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self.outcomes: Counter[str] = Counter()
        self.predicted_tokens = 0
        self.cached_tokens = 0

    def summary(self) -> dict[str, object]:
        checked = sum(self.outcomes.values())
        return {
            "predictions": checked,
            "exact_ratio": self.outcomes["exact"] / checked if checked else 0.0,
            "outcomes": {outcome: self.outcomes[outcome] for outcome in OUTCOMES},
            "predicted_cached_tokens_total": self.predicted_tokens,
            "cached_tokens_total": self.cached_tokens,
        }

    def record(self, placement: Placement, report: Report, our_prompt_tokens: int) -> str:
        outcome = classify(placement, report, our_prompt_tokens)
        predicted = sum(placement.predicted[i] for i in report.indices)
        replica = placement.replica.url
        m = self.metrics
        m.predicted_tokens.labels(replica).inc(predicted)
        m.cached_tokens.labels(replica).inc(report.cached_tokens)
        m.predictions.labels(outcome).inc()
        m.gap_tokens.labels(outcome).inc(abs(report.cached_tokens - predicted))
        self.outcomes[outcome] += 1
        self.predicted_tokens += predicted
        self.cached_tokens += report.cached_tokens
        return outcome
