"""How the gateway runs and routes: where it listens, which replicas it fronts, and the
tunables of its choice between them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from radixcluster.router.api.context import DEFAULT_SHUTDOWN_TIMEOUT_S, MAX_WAIT_S

POLICIES = ("cache-aware", "round-robin")


def replica_url_problem(url: str) -> str | None:
    """What keeps ``url`` from being a replica's base URL (None: nothing): it is an http:// or
    https:// URL with a host and, if any, a port in 1-65535."""
    if not url.startswith(("http://", "https://")):
        return "a replica is an http:// or https:// URL"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # an unclosed [IPv6 literal, a port out of range or not a number
        return f"not a URL: {exc}"
    if not parts.hostname:
        return "the URL names no host"
    if port == 0:
        return "the URL's port must be in 1-65535"
    if parts.path.strip("/") or parts.query or parts.fragment:
        # the gateway calls <url>/load, <url>/generate...: an OpenAI base URL's /v1 would never answer
        return f"give the replica's base URL, without a path ({urlunsplit(parts._replace(path='', query='', fragment=''))})"
    return None


@dataclass(slots=True, frozen=True)
class RoutingTunables:
    """``cache-aware``: pick the replica where the prompt's cached tokens minus ``load_weight``
    x its load (prompt tokens it still has to compute, for requests queued or running) is
    highest; when no replica holds at least ``min_overlap`` of the prompt, the least loaded
    one. ``round-robin``: each in turn (a baseline)."""

    policy: str = "cache-aware"
    load_weight: float = 0.5
    min_overlap: float = 0.25

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {POLICIES}, got {self.policy!r}")
        if not 0 <= self.load_weight < math.inf:  # nan too: every score would tie
            raise ValueError(f"--load-weight must be a finite number >= 0, got {self.load_weight}")
        if not 0 <= self.min_overlap <= 1:
            raise ValueError(f"--min-overlap must be in [0, 1], got {self.min_overlap}")


@dataclass(slots=True, frozen=True)
class HealthTunables:
    """A replica is polled every ``interval_s``; ``breaker_failures`` failures in a row (polls
    or forwarded requests) open its circuit: no traffic for ``breaker_cooldown_s``, then a poll
    decides."""

    interval_s: float = 1.0
    breaker_failures: int = 3
    breaker_cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        if not (0 < self.interval_s <= MAX_WAIT_S and 0 <= self.breaker_cooldown_s <= MAX_WAIT_S):
            raise ValueError(
                f"--health-interval must be in (0, {MAX_WAIT_S:g}] s, --breaker-cooldown in [0, {MAX_WAIT_S:g}]"
            )
        if self.breaker_failures < 1:
            raise ValueError("--breaker-failures must be >= 1")


@dataclass(slots=True)
class GatewayConfig:
    """``replicas``: base URLs; ``discover``: a HOST:PORT whose addresses (a Kubernetes headless
    Service) are the replicas, resolved again every ``discover_interval_s``. ``api_key``: what
    clients must send; ``replica_api_key``: what the gateway's own calls (polls, snapshots) send
    to the replicas. ``admin_api_key`` and ``tenant_keys`` (API key -> tenant) are accepted too;
    with either, a client's key goes on to the replica with its generations and cache calls (the
    replica, which holds the same keys, applies the tenant and the admin check)."""

    host: str
    port: int
    model_path: Path
    replicas: list[str] = field(default_factory=list)
    discover: str | None = None
    discover_interval_s: float = 5.0
    api_key: str | None = None
    replica_api_key: str | None = None
    admin_api_key: str | None = None
    tenant_keys: dict[str, str] = field(default_factory=dict)
    chat_template: str | None = None  # --chat-template's text: the replicas render chats with it
    tokenizer_path: Path | None = None  # the replicas' --tokenizer-path (None: the model's own)
    routing: RoutingTunables = field(default_factory=RoutingTunables)
    health: HealthTunables = field(default_factory=HealthTunables)
    max_body_bytes: int = 16 * 2**20
    log_level: str = "warning"
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S

    @property
    def passes_client_keys(self) -> bool:
        """Whether a client's own key goes on to the replicas (they tell tenants or the admin apart)."""
        return bool(self.admin_api_key or self.tenant_keys)
