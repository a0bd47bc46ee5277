"""How long the router's steps take (schedule, model step, outputs), as a histogram for /metrics,
and when the last one ended (a busy router that still makes progress is healthy)."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any

# seconds; a CPU prefill chunk can take seconds
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(slots=True)
class StepTimes:
    counts: list[int] = field(default_factory=lambda: [0] * len(STEP_BUCKETS))
    total_s: float = 0.0
    steps: int = 0
    last_end: float | None = None  # time.monotonic() when the last step ended

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(STEP_BUCKETS, seconds)
        if index < len(STEP_BUCKETS):
            self.counts[index] += 1
        self.total_s += seconds
        self.steps += 1
        self.last_end = time.monotonic()

    def snapshot(self) -> dict[str, Any]:
        """Prometheus' shape: cumulative counts per upper bound (the +Inf bucket is ``count``)."""
        cumulative, running = [], 0
        for count in self.counts:
            running += count
            cumulative.append(running)
        return {"buckets": list(STEP_BUCKETS), "counts": cumulative, "sum": self.total_s, "count": self.steps}

    def seconds_since_last(self) -> float | None:
        return None if self.last_end is None else time.monotonic() - self.last_end
