"""One replica behind the gateway: where it is, whether it may get traffic (health and a circuit
breaker), how busy it is, and the gateway's view of its cache."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from radixcluster.gateway.cache_view import ReplicaView
from radixcluster.gateway.config import HealthTunables

# a replica whose router has not answered a poll for this long (a hung step) gets no traffic
STALL_S = 120.0


@dataclass(slots=True)
class CircuitBreaker:
    """Closed until ``failures`` failed requests in a row; then open (no traffic) for
    ``cooldown_s``; then the next health poll that passes closes it."""

    failures: int
    cooldown_s: float
    consecutive: int = 0
    opened_at: float | None = None

    @property
    def is_open(self) -> bool:
        return self.opened_at is not None

    def allows_traffic(self) -> bool:
        return self.opened_at is None

    def may_probe(self, now: float) -> bool:
        return self.opened_at is None or now - self.opened_at >= self.cooldown_s

    def success(self) -> None:
        self.consecutive = 0
        self.opened_at = None

    def failure(self, now: float) -> None:
        self.consecutive += 1
        if self.consecutive >= self.failures:
            self.opened_at = now


@dataclass(slots=True)
class Load:
    """Prompt tokens the replica has to compute: for the requests this gateway sent and has
    not seen finish, their uncached tokens (live); plus, from the last poll, what the replica
    counted beyond those (other clients' requests)."""

    inflight_tokens: int = 0
    inflight_requests: int = 0
    others_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.inflight_tokens + self.others_tokens

    def polled(self, uncomputed_tokens: int) -> None:
        self.others_tokens = max(0, uncomputed_tokens - self.inflight_tokens)


@dataclass(slots=True, eq=False)
class Replica:
    url: str
    health: HealthTunables
    breaker: CircuitBreaker = field(init=False)
    view: ReplicaView = field(default_factory=ReplicaView)
    load: Load = field(default_factory=Load)
    healthy: bool = False
    last_error: str | None = None
    events_address: str | None = None  # where its router publishes tree events (None: it does not)
    requests_total: int = 0
    answered_at: float = 0.0  # time.monotonic() of the last poll it answered

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.breaker = CircuitBreaker(self.health.breaker_failures, self.health.breaker_cooldown_s)

    @property
    def available(self) -> bool:
        """May get new requests: its last health poll passed and its circuit is closed."""
        return self.healthy and self.breaker.allows_traffic()

    def poll_passed(self) -> None:
        """It answered a health poll: traffic may come back (an open circuit closes once its
        cool-down is over), and once it does, the outage's error is no longer its state."""
        self.healthy = True
        self.answered_at = time.monotonic()
        if self.breaker.may_probe(self.answered_at):
            self.breaker.success()
        if self.available:
            self.last_error = None

    def poll_slow(self) -> None:
        """A poll timed out: alive but busy; no new traffic once it has not answered for ``STALL_S``."""
        if time.monotonic() - self.answered_at > STALL_S:
            self.healthy = False
            self.last_error = f"no answer to health polls for {STALL_S:g} s"

    def poll_failed(self, error: str) -> None:
        """It is down, or restarting with an empty cache: no traffic, and forget its blocks."""
        self.healthy = False
        self.last_error = error
        self.view.clear()

    def request_failed(self, error: str) -> None:
        """A forwarded request failed before its first byte; enough in a row open the circuit."""
        self.last_error = error
        self.breaker.failure(time.monotonic())

    def request_passed(self) -> None:
        self.breaker.success()

    def events_endpoint(self, advertised: str) -> str:
        """The replica's advertised ``tcp://HOST:PORT``, with a wildcard host (it bound every
        interface) replaced by the host this gateway reaches it at."""
        scheme, _, rest = advertised.partition("://")
        host, _, port = rest.rpartition(":")
        if host in ("0.0.0.0", "*", "[::]", "::"):
            host = urlsplit(self.url).hostname or host
        return f"{scheme}://{host}:{port}"

    def describe(self) -> dict[str, object]:
        """For ``GET /replicas``."""
        view = self.view
        return {
            "url": self.url,
            "available": self.available,
            "healthy": self.healthy,
            "circuit_open": self.breaker.is_open,
            "last_error": self.last_error,
            "events_address": self.events_address,
            "synced": view.synced,
            "instance": view.instance,
            "event_seq": view.seq,
            "cached_blocks": len(view.cached),
            "cached_tokens": len(view.cached) * view.page_size,
            "pending_blocks": len(view.pending),
            "page_size": view.page_size,
            "resyncs": view.resyncs,
            "inflight_requests": self.load.inflight_requests,
            "load_tokens": self.load.tokens,
            "requests_total": self.requests_total,
        }
