"""The api process's bridge to the router: a ZeroMQ PUSH socket for requests, a PULL socket for
outputs, one asyncio queue per request id and one future per control call."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Any, NamedTuple

import zmq
import zmq.asyncio

from radixcluster.protocol import (
    MID_STEP_KINDS,
    STEP_OVERDUE_S,
    AbortRequest,
    ControlRequest,
    ControlResponse,
    GenerateRequest,
    ProtocolError,
    RequestOutput,
    decode,
    encode,
)

logger = logging.getLogger(__name__)

# How long a frame may wait for the router to take it before the router counts as unreachable.
SEND_TIMEOUT_S = 5.0
CONTROL_TIMEOUT_S = 10.0
# a control call the router answers only between steps may wait for a long prefill step on a
# loaded host too: up to the time past which /health calls the step overdue
STEP_WAIT_TIMEOUT_S = STEP_OVERDUE_S + CONTROL_TIMEOUT_S


def control_timeout(kind: str) -> float:
    """How long a control call of ``kind`` may wait for its answer: those the router answers
    while a step runs, briefly; the others, past the step in flight."""
    return CONTROL_TIMEOUT_S if kind in MID_STEP_KINDS else STEP_WAIT_TIMEOUT_S


class RouterUnavailable(Exception):
    """The router did not take a message or did not answer in time."""


class RouterError(Exception):
    """The router answered a control call with an error."""


class DuplicateRequestId(ValueError):
    """A request id that is already running."""


class _Sockets(NamedTuple):
    ctx: zmq.asyncio.Context
    push: zmq.asyncio.Socket
    pull: zmq.asyncio.Socket


class RouterClient:
    """Sends requests to the router and routes its outputs back to the waiting callers.

    Must be started and used inside one running event loop.
    """

    def __init__(self, request_address: str, output_address: str) -> None:
        self._request_address = request_address
        self._output_address = output_address
        self._sockets: _Sockets | None = None
        self._receiver: asyncio.Task | None = None
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._controls: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._pending_sends: set[asyncio.Future] = set()

    async def start(self) -> None:
        ctx = zmq.asyncio.Context()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        # Queue only on a live connection, so a send to an absent router waits (and times out)
        # instead of piling up requests the router would run long after their callers left.
        push.setsockopt(zmq.IMMEDIATE, 1)
        push.connect(self._request_address)
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.LINGER, 0)
        pull.connect(self._output_address)
        self._sockets = _Sockets(ctx, push, pull)
        self._receiver = asyncio.create_task(self._receive_loop(pull), name="router-client-receive")

    async def close(self) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
            await asyncio.gather(self._receiver, return_exceptions=True)
        for fut in self._controls.values():
            if not fut.done():
                fut.set_exception(RouterUnavailable("the api is shutting down"))
        if self._sockets is not None:
            self._sockets.push.close()
            self._sockets.pull.close()
            self._sockets.ctx.term()

    @property
    def in_flight(self) -> int:
        """Generations sent and not finished."""
        return len(self._streams)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[RequestOutput, None]:
        """Send ``request`` and yield its outputs until one is finished or carries an error.

        Leaving early (the caller is cancelled, or closes the iterator) aborts the request on
        the router, so its pages are released.
        """
        if request.rid in self._streams:
            raise DuplicateRequestId(f"request id {request.rid!r} is already running")
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request.rid] = queue
        done = False
        try:
            await self._send(request)
            while not done:
                out = await queue.get()
                done = out.finished or out.error is not None
                yield out
        finally:
            self._streams.pop(request.rid, None)
            if not done:
                self.abort(request.rid)

    def fail_all(self, status: int, message: str) -> None:
        """End every generation in flight with an error (its caller reports it to its client),
        and abort it on the router."""
        for rid in self._streams:
            self._end(rid, status, message)
            self.abort(rid)

    def abort(self, rid: str, abort_all: bool = False) -> None:
        """Tell the router to drop ``rid`` (every request with ``abort_all``); never blocks, so
        it is safe while being cancelled."""
        if self._sockets is None:
            return
        fut = asyncio.ensure_future(self._sockets.push.send(encode(AbortRequest(rid=rid, abort_all=abort_all))))
        self._pending_sends.add(fut)
        fut.add_done_callback(self._sent)

    def _sent(self, fut: asyncio.Future) -> None:
        self._pending_sends.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            logger.warning("could not send an abort to the router: %s", fut.exception())

    async def control(
        self, kind: str, args: dict[str, Any] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        """Ask the router a control question and return its payload (``timeout``: by default
        ``control_timeout(kind)``).

        Raises RouterUnavailable on timeout, RouterError when the router reports an error.
        """
        if timeout is None:
            timeout = control_timeout(kind)
        cid = uuid.uuid4().hex
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._controls[cid] = fut
        try:
            await self._send(ControlRequest(cid=cid, kind=kind, args=args or {}), timeout)
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise RouterUnavailable(f"the router did not answer {kind!r} within {timeout:g} s") from None
        finally:
            self._controls.pop(cid, None)

    async def _send(self, msg: Any, timeout: float = SEND_TIMEOUT_S) -> None:
        if self._sockets is None:
            raise RouterUnavailable("the api's router client is not started")
        try:
            await asyncio.wait_for(self._sockets.push.send(encode(msg)), timeout)
        except asyncio.TimeoutError:
            raise RouterUnavailable(f"the router did not accept a request within {timeout:g} s") from None

    async def _receive_loop(self, pull: zmq.asyncio.Socket) -> None:
        while True:
            frame = await pull.recv()
            try:
                msg = decode(frame)
            except ProtocolError as exc:
                logger.error("dropping a malformed frame from the router: %s", exc)
                self._fail_unreadable(exc)
                continue
            if isinstance(msg, RequestOutput):
                queue = self._streams.get(msg.rid)
                if queue is not None:  # otherwise the caller already left
                    queue.put_nowait(msg)
            elif isinstance(msg, ControlResponse):
                self._resolve(msg)
            else:
                logger.error("unexpected %s from the router", type(msg).__name__)

    def _fail_unreadable(self, exc: ProtocolError) -> None:
        """The request or call an unreadable answer names fails (500) instead of waiting for ever."""
        why = f"the api could not read the router's answer (is the router of the same version?): {exc}"
        rid, cid = exc.named("rid"), exc.named("cid")
        if rid in self._streams:
            self._end(rid, 500, why)
        if cid is not None:
            self._resolve(ControlResponse(cid, error=why))

    def _end(self, rid: str, status: int, message: str) -> None:
        """``rid``'s stream ends with an error (its caller reports it to its client)."""
        self._streams[rid].put_nowait(RequestOutput(rid=rid, finished=True, error=message, status=status))

    def _resolve(self, msg: ControlResponse) -> None:
        fut = self._controls.get(msg.cid)
        if fut is None or fut.done():
            return
        if msg.error is not None:
            fut.set_exception(RouterError(msg.error))
        else:
            fut.set_result(msg.payload)
