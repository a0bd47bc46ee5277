"""Forwarding a request to the chosen replica and its answer back, streamed through as it comes.

A request that fails before its first byte (the replica cannot be reached, dies before
answering, or answers 502/503) goes to another replica; one that fails later ends with an
error frame. Every answer says where it ran and what was predicted: ``meta_info.replica`` and
``meta_info.predicted_cached_tokens`` (native), the same keys in OpenAI's ``usage`` and at the
top of a warm's or a pin's answer; the replica's own count of cached tokens is checked against
the prediction.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import Response
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send

from radixcluster.gateway.connections import Exchange, UpstreamError
from radixcluster.gateway.metrics import GatewayMetrics
from radixcluster.gateway.predictions import PredictionLedger, Report
from radixcluster.gateway.prompts import CACHE_KINDS, CHAT_SHAPES, MESSAGES, NATIVE, RESPONSES, RoutedRequest
from radixcluster.gateway.replica import Replica
from radixcluster.gateway.replica_set import ReplicaSet
from radixcluster.gateway.routing import NoReplicaAvailable, Placement, ReplicaChooser
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.generation import (
    SSE_DONE,
    SSEResponse,
    error_frame,
    next_number,
    sse,
    until_disconnect,
)
from radixcluster.router.api.json_text import JsonResponse

logger = logging.getLogger(__name__)

# a replica that answers these has not run the request: another one may. Not 504: a replica
# answers it when the client's own deadline_s passed, which no other replica would meet, and
# counting it as the replica's failure would let a client open every circuit
RETRY_STATUSES = frozenset({502, 503})
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _NotServed(Exception):
    """The replica did not serve the request (before any byte of an answer)."""


@dataclass(slots=True)
class Dispatch:
    """A request on its way to a replica: its tokens count as load until ``end``, its prompts
    as pending there until the replica's view has their blocks (after ``end``)."""

    placement: Placement
    tokens: int
    ended: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        replica = self.placement.replica
        for names in self.placement.names:
            replica.view.add_pending(names)
        replica.load.inflight_tokens += self.tokens
        replica.load.inflight_requests += 1
        replica.requests_total += 1

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        replica, ended = self.placement.replica, time.monotonic()
        for names in self.placement.names:
            replica.view.finish_pending(names, ended)
        replica.load.inflight_tokens -= self.tokens
        replica.load.inflight_requests -= 1


class _RelayResponse(SSEResponse):
    """A relayed stream whose dispatch and upstream connection end however it ends (also when
    the client left before the first frame, so the body generator never started)."""

    def __init__(self, body: AsyncGenerator[bytes, None], dispatch: Dispatch, release: Callable[[], None]) -> None:
        super().__init__(body, headers=SSE_HEADERS)
        self._dispatch, self._release = dispatch, release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._dispatch.end()
            # back to the pool when the stream was read to its end; closed (the replica sees
            # the client leave and aborts) when not
            self._release()


class Forwarder:
    def __init__(
        self,
        replicas: ReplicaSet,
        chooser: ReplicaChooser,
        metrics: GatewayMetrics,
        max_body_bytes: int,
    ) -> None:
        self.replicas = replicas
        self.chooser = chooser
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes  # the replicas' limit, as the gateway's own
        self.ledger = PredictionLedger(metrics)

    async def forward(
        self, receive: Receive, headers: Headers, path: str, routed: RoutedRequest, raw: bytes, arrived: float
    ) -> Response:
        """Serve ``routed`` (whose body was ``raw``, which arrived at ``arrived``, a perf_counter
        time, with ``headers``) on a replica; the client leaving a non-streamed request cancels
        it there."""
        sent = {**self.replicas.client_headers(headers), "Content-Type": "application/json"}
        forwarding = self._forward(path, routed, raw, sent, headers.get("x-session-id"), arrived)
        return await (forwarding if routed.stream else until_disconnect(receive, forwarding))

    async def _forward(
        self, path: str, routed: RoutedRequest, raw: bytes, headers: dict[str, str], session: str | None, arrived: float
    ) -> Response:
        forced_usage = routed.stream and routed.kind != NATIVE and not routed.include_usage
        if forced_usage:  # the usage chunk carries the replica's cached tokens; it is dropped again below
            raw = json.dumps({**routed.body, "stream_options": {"include_usage": True}}).encode()
        raw = routed.replica_body(raw, self.max_body_bytes)
        tried: set[Replica] = set()
        while True:
            try:
                placement = self.chooser.choose(routed, self.replicas.list(), session, tried)
            except NoReplicaAvailable as exc:
                last = next((r.last_error for r in tried if r.last_error), None)
                raise ApiError(503, str(exc) + (f"; last error: {last}" if last else "")) from None
            replica = placement.replica
            self.metrics.requests.labels(replica.url).inc()
            dispatch = Dispatch(placement, routed.tokens - placement.predicted_total)
            sent = time.perf_counter()
            if not tried:
                self.metrics.routing_seconds.observe(sent - arrived)
            try:
                upstream, content = await self._send(replica, path, raw, headers, routed.stream)
            except _NotServed as exc:
                dispatch.end()
                replica.request_failed(str(exc))
                self.metrics.retries.labels(replica.url).inc()
                tried.add(replica)
                logger.warning("%s not served by %s (%s); trying another replica", path, replica.url, exc)
                continue
            except BaseException:
                dispatch.end()  # cancelled: the client left
                raise
            replica.request_passed()
            if content is None:
                release = functools.partial(self.replicas.pool.release, replica.url, upstream)
                return _RelayResponse(self._relay(upstream, dispatch, routed, forced_usage, path), dispatch, release)
            answered = time.perf_counter()
            dispatch.end()
            if upstream.status != 200:
                return Response(content, upstream.status, media_type=upstream.content_type)
            response = JsonResponse(self._annotate_answer(json.loads(content), placement, routed))
            self.metrics.own_seconds.observe((sent - arrived) + (time.perf_counter() - answered))
            return response

    async def _send(
        self, replica: Replica, path: str, raw: bytes, headers: dict[str, str], stream: bool
    ) -> tuple[Exchange, bytes | None]:
        """The replica's answer and, unless it is a stream to relay, its whole body."""
        try:
            upstream = await self.replicas.pool.post(replica.url, path, raw, headers)
        except UpstreamError as exc:
            raise _NotServed(str(exc)) from None
        relay = stream and upstream.status == 200
        try:
            if upstream.status in RETRY_STATUSES:
                raise _NotServed(f"HTTP {upstream.status}")
            return upstream, None if relay else await upstream.read()
        except UpstreamError as exc:
            raise _NotServed(str(exc)) from None
        finally:
            if not relay:
                self.replicas.pool.release(replica.url, upstream)

    # ------------------------------------------------------------ answers

    def _annotate_answer(self, answer: Any, placement: Placement, routed: RoutedRequest) -> Any:
        if routed.kind in CACHE_KINDS:  # a warm's counts are a native meta_info's, at the top
            self._native_meta(answer, 0, placement, routed, final=True)
        elif routed.kind == NATIVE:
            for index, item in enumerate(answer if isinstance(answer, list) else [answer]):
                self._native_meta(item["meta_info"], index, placement, routed, final=True)
        elif answer.get("usage"):  # a failed response has none
            self._usage(answer["usage"], placement, routed)
        return answer

    def _native_meta(
        self, meta: dict[str, Any], index: int, placement: Placement, routed: RoutedRequest, final: bool
    ) -> None:
        meta["replica"] = placement.replica.url
        meta["predicted_cached_tokens"] = placement.predicted[index]
        if final:
            report = Report([index], meta["cached_tokens"], meta["prompt_tokens"])
            self.ledger.record(placement, report, len(routed.prompts[index].ids))

    def _usage(self, usage: dict[str, Any], placement: Placement, routed: RoutedRequest) -> None:
        firsts = list(range(0, len(routed.prompts), routed.usage_stride))
        usage["replica"] = placement.replica.url
        usage["predicted_cached_tokens"] = sum(placement.predicted[i] for i in firsts)
        report = Report(firsts, *_prompt_counts(usage, routed.kind))
        self.ledger.record(placement, report, sum(len(routed.prompts[i].ids) for i in firsts))

    async def _relay(
        self, upstream: Exchange, dispatch: Dispatch, routed: RoutedRequest, forced_usage: bool, path: str
    ) -> AsyncGenerator[bytes, None]:
        """The replica's SSE frames, annotated, as they arrive."""
        placement = dispatch.placement
        number = 0  # what a Responses API error event would be numbered
        try:
            async for line in upstream.lines():
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    yield SSE_DONE
                    continue
                chunk = json.loads(data)
                number = next_number(chunk, number)
                if routed.kind in CHAT_SHAPES:  # typed events, one near the end with the answer's usage
                    answered = _final_usage(chunk, routed.kind)
                    if answered:
                        self._usage(answered, placement, routed)
                    yield sse(chunk, chunk.get("type"))
                elif "error" in chunk:
                    yield sse(chunk)
                elif routed.kind == NATIVE:
                    meta = chunk["meta_info"]
                    final = meta.get("finish_reason") is not None
                    self._native_meta(meta, chunk.get("index", 0), placement, routed, final)
                    yield sse(chunk)
                elif chunk.get("usage") and not chunk.get("choices"):  # the last chunk's, not continuous_usage_stats'
                    self._usage(chunk["usage"], placement, routed)
                    if not forced_usage:
                        yield sse(chunk)
                else:
                    yield sse(chunk)
        except UpstreamError as exc:
            logger.warning("the stream from %s broke: %s", placement.replica.url, exc)
            typed = routed.kind in CHAT_SHAPES  # an error event (in the shape of the path's API), and no [DONE]
            yield error_frame(502, f"the replica {placement.replica.url} failed mid-stream: {exc}", typed, path, number)
            if not typed:
                yield SSE_DONE
        finally:
            dispatch.end()


def _prompt_counts(usage: dict[str, Any], kind: str) -> tuple[int, int]:
    """The cached and the whole prompt's tokens of an answer's ``usage``, in the names of its API:
    OpenAI's chat and completions, its Responses API, or Anthropic's (whose ``input_tokens``
    are those not read from the cache)."""
    if kind == MESSAGES:
        cached = usage.get("cache_read_input_tokens", 0)
        return cached, usage["input_tokens"] + cached + usage.get("cache_creation_input_tokens", 0)
    prompt = "input_tokens" if kind == RESPONSES else "prompt_tokens"
    return (usage.get(f"{prompt}_details") or {}).get("cached_tokens", 0), usage[prompt]


def _final_usage(event: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The usage of a typed stream's event that ends the answer: the Responses API's last
    response, the Messages API's message_delta; None for the others."""
    if kind == MESSAGES:
        return event.get("usage") if event.get("type") == "message_delta" else None
    return (event.get("response") or {}).get("usage")
