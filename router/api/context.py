"""What every api route needs: the configuration, the router client and the app's metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from radixcluster.router.api.metrics import ApiMetrics
from radixcluster.router.api.router_client import RouterClient

DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
# the longest wait a flag may set (timeouts, intervals): the event loop's and ZeroMQ's timers
# count milliseconds in integers, and 1e308 s of them is inf
MAX_WAIT_S = 7 * 24 * 3600.0


@dataclass(slots=True)
class ApiConfig:
    """How to run the api process; the router binds both addresses, the api connects."""

    host: str
    port: int
    request_address: str
    output_address: str
    api_key: str | None
    served_model_name: str
    max_body_bytes: int = 16 * 2**20
    admin_api_key: str | None = None  # when set, the cache-control calls require it
    tenant_keys: dict[str, str] = field(default_factory=dict)  # --api-key-file: API key -> tenant
    # after SIGTERM, requests in flight get this long to finish before they end with an error
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    tool_call_parser: str | None = None  # the served model's format of tool calls (tool_parsers)
    reasoning_parser: str | None = None  # how the served model marks its thinking (reasoning)
    context_length: int | None = None  # the served context: a chat of more messages is refused at once

    @property
    def validation(self) -> dict[str, Any]:
        """The context request bodies are validated in (the schemas' ``ValidationInfo.context``)."""
        return {"context_length": self.context_length}


@dataclass(slots=True)
class ApiContext:
    config: ApiConfig
    client: RouterClient
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    created: int = field(default_factory=lambda: int(time.time()))
    # set by SIGTERM: /health and every new request answer 503, requests in flight go on
    draining: bool = False
