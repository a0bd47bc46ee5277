"""Draining an HTTP server (the api, the gateway) on SIGTERM: readiness and new requests answer
503 while the requests in flight finish, for up to the shutdown timeout; those still running
then end with an error (a 503, or an error event on a stream that has begun), and uvicorn stops."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixcluster.router.api.errors import SHUTTING_DOWN, anthropic_path, error_response
from radixcluster.router.api.generation import SSE_DONE, error_frame

logger = logging.getLogger(__name__)

# Served while draining too: monitoring watches the drain.
DRAIN_PATHS = frozenset({"/metrics"})
# after the requests of a drain are ended with an error, how long their responses get to go out
FAIL_FLUSH_S = 5
RESPONSES_PATH = "/v1/responses"


async def refused_while_draining(draining: bool, scope: Scope, receive: Receive, send: Send) -> bool:
    """Answer an HTTP request the drain's 503 while ``draining`` (monitoring's paths are still
    served); whether it did."""
    if not draining or scope["type"] != "http" or scope["path"] in DRAIN_PATHS:
        return False
    await error_response(503, SHUTTING_DOWN, path=scope["path"])(scope, receive, send)
    return True


class Drain(Protocol):
    """What a draining server asks of its app."""

    draining: bool

    def in_flight(self) -> int: ...

    def fail_all(self) -> None:
        """End every request in flight with the shutdown's error."""


class DrainingServer(uvicorn.Server):
    """uvicorn, with SIGTERM starting a drain instead of closing the listener at once.

    SIGTERM flips ``drain.draining``; each tick of uvicorn's loop then checks the drain: nothing
    in flight, or ``shutdown_timeout_s`` passed and the stragglers were ended with an error (and
    had ``FAIL_FLUSH_S`` to send it): uvicorn shuts down. SIGINT, or a second SIGTERM, skips the
    rest of the wait (the launcher sends SIGINT when a part of the replica failed: what is in
    flight cannot finish)."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        shutdown_timeout_s: float,
        on_listening: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self.shutdown_timeout_s = shutdown_timeout_s
        self.on_listening = on_listening  # called once the listener is bound
        self._fail_at: float | None = None  # when the stragglers get their error
        self._failed_at: float | None = None
        self._cut_short = False  # SIGINT, or a second signal: no wait for what is in flight
        self._announced = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_listening is not None:
            self.on_listening()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # runs as a signal handler on the loop's thread: only flags and times are set here
        now = time.monotonic()
        if self._fail_at is None:
            self.drain.draining = True
            self._cut_short = sig == signal.SIGINT
            self._fail_at = now if self._cut_short else now + self.shutdown_timeout_s
        else:
            self._cut_short = True
            self._fail_at = min(self._fail_at, now)

    async def on_tick(self, counter: int) -> bool:
        if self._fail_at is not None and not self.should_exit:
            now = time.monotonic()
            if not self._announced and not self._cut_short:
                logger.warning(
                    "shutting down: new requests get 503; %d in flight get up to %g s to finish",
                    self.drain.in_flight(),
                    self.shutdown_timeout_s,
                )
            self._announced = True
            if self.drain.in_flight() == 0:
                self.should_exit = True
            elif self._failed_at is None and now >= self._fail_at:
                reason = (
                    "shutdown cut short" if self._cut_short else f"shutdown timeout ({self.shutdown_timeout_s:g} s)"
                )
                logger.warning("%s: ending %d request(s) with an error", reason, self.drain.in_flight())
                self.drain.fail_all()
                self._failed_at = now
            elif self._failed_at is not None and now >= self._failed_at + FAIL_FLUSH_S:
                self.should_exit = True
        return await super().on_tick(counter)


@dataclass(slots=True)
class _Answer:
    """One request's answer as it goes out, so that a failed request's can be ended right."""

    send: Send
    path: str
    started: bool = False
    stream: bool = False
    frames: int = 0  # body messages sent: a relayed stream sends one per event
    ended: bool = False
    failed: bool = False

    async def relay(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            headers = dict(message.get("headers", []))
            self.stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body":
            self.frames += bool(message.get("body"))
            self.ended = not message.get("more_body", False)
        await self.send(message)

    async def fail(self, scope: Scope, receive: Receive) -> None:
        if not self.started:
            await error_response(503, SHUTTING_DOWN, path=self.path)(scope, receive, self.send)
        elif not self.ended:
            body = b""
            if self.stream:  # the error event of the path's API (numbered next on the Responses API's)
                typed = self.path == RESPONSES_PATH or anthropic_path(self.path)
                body = error_frame(503, SHUTTING_DOWN, typed, self.path, self.frames) + (b"" if typed else SSE_DONE)
            await self.send({"type": "http.response.body", "body": body, "more_body": False})


class RequestDrain:
    """A Drain for an app that holds no generations of its own (the gateway): the gate that
    refuses new requests while draining, and the requests in flight, seen at the ASGI level.
    Failing one cancels what serves it (the replica's request is aborted with its connection)
    and ends its answer with the error."""

    def __init__(self) -> None:
        self.draining = False
        self._answers: dict[asyncio.Task[object], _Answer] = {}

    def in_flight(self) -> int:
        return len(self._answers)

    def fail_all(self) -> None:
        for task, answer in self._answers.items():
            answer.failed = True
            task.cancel()

    def gate(self, app: ASGIApp) -> ASGIApp:
        async def gated(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                return await app(scope, receive, send)
            if await refused_while_draining(self.draining, scope, receive, send):
                return None
            task, answer = asyncio.current_task(), _Answer(send, scope["path"])
            assert task is not None
            self._answers[task] = answer
            try:
                await app(scope, receive, answer.relay)
            except asyncio.CancelledError:
                if not answer.failed:
                    raise
                await answer.fail(scope, receive)
            finally:
                del self._answers[task]

        return gated
