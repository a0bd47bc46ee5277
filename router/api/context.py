"""What every api route needs: the configuration, the router client, the app's metrics, and the
reading of a request body."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel

from radixcluster.router.api.errors import SHUTTING_DOWN, read_json
from radixcluster.router.api.metrics import ApiMetrics
from radixcluster.router.api.native_schemas import served_context
from radixcluster.router.api.router_client import RouterClient

M = TypeVar("M", bound=BaseModel)

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
    context_length: int | None = None  # the served context: longer lists in a body are refused at once
    radix_cache: bool = True  # false with --disable-radix-cache: there is no cache to warm
    log_level: str = "warning"  # --log-level: the api process logs as the others do


@dataclass(slots=True)
class ApiContext:
    config: ApiConfig
    client: RouterClient
    metrics: ApiMetrics = field(default_factory=ApiMetrics)
    created: int = field(default_factory=lambda: int(time.time()))
    # set by SIGTERM: /health and every new request answer 503, requests in flight go on
    draining: bool = False

    def in_flight(self) -> int:
        """Generations in flight (what a drain waits for)."""
        return self.client.in_flight

    def fail_all(self) -> None:
        """End every generation in flight with the shutdown's error (a drain's timeout)."""
        self.client.fail_all(503, SHUTTING_DOWN)

    async def body(self, request: Request, schema: type[M]) -> M:
        """The request's JSON body read (413 past the limit) and validated by ``schema`` in the
        served context."""
        raw = await read_json(request, self.config.max_body_bytes)
        return schema.model_validate(raw, context=served_context(self.config.context_length))
