"""The router's ZeroMQ side: the sockets it binds (api in and out, rank 0's batches and results,
the tree events) and the remote executor that runs one step on the TP group and waits for it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from radixcluster.protocol import ForwardBatch, Profile, RankFailed, RequestOutput, Shutdown, StepResult, decode, encode
from radixcluster.router.tree_events import TreeEventLog

logger = logging.getLogger(__name__)

EVENTS_HWM = 100_000


class StepAbandoned(Exception):
    """The step in flight will get no result: the router stops waiting for it."""


class GroupLost(StepAbandoned):
    """The TP group can run no further step: a rank reported a failure, or gave no result within
    the step timeout (a stopped process, a collective that never completes). Not one batch's
    failure: the group is replaced and its requests re-queued."""


class LauncherSpoke(StepAbandoned):
    """The launcher wrote on the control pipe mid-step (a rank died, or stop): read it."""


@dataclass(slots=True)
class RouterAddresses:
    """ZeroMQ endpoints, all bound by the router."""

    request: str  # the api PUSHes GenerateRequest/AbortRequest/ControlRequest
    output: str  # the api PULLs RequestOutput/ControlResponse
    batch: str  # rank 0 PULLs ForwardBatch
    result: str  # rank 0 PUSHes StepResult
    events: str | None = None  # gateways SUBscribe to TreeEvent here (tcp://); None: not published


class RouterSockets:
    """The four ZeroMQ sockets the router binds, and a remote executor over two of them."""

    def __init__(
        self,
        addresses: RouterAddresses,
        step_timeout_s: float,
        interrupt_fd: int | None = None,
        while_stepping: Callable[[bytes, float], None] | None = None,
    ) -> None:
        """``while_stepping(frame, running_s)`` is given each api message that comes while a
        step waits for its result (None: they wait on the socket until the step ends)."""
        self.step_timeout_s = step_timeout_s
        self.while_stepping = while_stepping
        self.ctx = zmq.Context()
        self.requests = self._bind(zmq.PULL, addresses.request)
        self.outputs = self._bind(zmq.PUSH, addresses.output)
        self.batches = self._bind(zmq.PUSH, addresses.batch)
        self.results = self._bind(zmq.PULL, addresses.result)
        self.events = self._bind(zmq.PUB, addresses.events) if addresses.events else None
        if self.events is not None:
            # a subscriber that falls this far behind loses messages, sees the gap and resyncs
            self.events.setsockopt(zmq.SNDHWM, EVENTS_HWM)
        self.poller = zmq.Poller()
        self.poller.register(self.requests, zmq.POLLIN)
        # a step's wait ends with its result, a rank's failure, the step timeout, or a word from
        # the launcher on ``interrupt_fd`` (a rank died: no result will come)
        self.step_poller = zmq.Poller()
        self.step_poller.register(self.results, zmq.POLLIN)
        self.send_poller = zmq.Poller()
        self.send_poller.register(self.batches, zmq.POLLOUT)
        self.interrupt_fd = interrupt_fd
        if interrupt_fd is not None:
            for poller in (self.poller, self.step_poller, self.send_poller):
                poller.register(interrupt_fd, zmq.POLLIN)
        if while_stepping is not None:
            for poller in (self.step_poller, self.send_poller):
                poller.register(self.requests, zmq.POLLIN)

    def _bind(self, kind: int, address: str) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.bind(address)
        return sock

    def execute(self, batch: ForwardBatch) -> StepResult:
        started = time.monotonic()
        deadline = started + self.step_timeout_s
        self._send_batch(encode(batch), started, deadline)
        while (remaining_s := deadline - time.monotonic()) > 0:
            events = dict(self.step_poller.poll(max(1, int(remaining_s * 1000))))
            if self.requests in events:
                self._heard_mid_step(started)
            if self.results in events:
                msg = decode(self.results.recv())
                if msg.step_id < batch.step_id:
                    continue  # a replaced group's late word
                if isinstance(msg, RankFailed):
                    raise GroupLost(f"rank {msg.rank} failed in step {msg.step_id}: {msg.error}")
                if msg.step_id != batch.step_id:
                    raise RuntimeError(f"rank 0 answered step {msg.step_id}, expected {batch.step_id}")
                return msg
            if self.interrupt_fd in events:
                raise LauncherSpoke
        raise GroupLost(f"step {batch.step_id} got no result within --step-timeout {self.step_timeout_s:g} s")

    def _send_batch(self, frame: bytes, started: float, deadline: float) -> None:
        """Hand the frame to rank 0; with no rank 0 connected (it died) a send would block, so
        the wait ends like a step's: the launcher's word or the timeout."""
        while (remaining_s := deadline - time.monotonic()) > 0:
            events = dict(self.send_poller.poll(max(1, int(remaining_s * 1000))))
            if self.requests in events:
                self._heard_mid_step(started)
            if self.batches in events:
                self.batches.send(frame)
                return
            if self.interrupt_fd in events:
                raise LauncherSpoke
        raise GroupLost(f"rank 0 took no step within --step-timeout {self.step_timeout_s:g} s")

    def _heard_mid_step(self, started: float) -> None:
        """Each api message waiting now, to ``while_stepping`` with how long the step has run."""
        assert self.while_stepping is not None
        while True:
            try:
                frame = self.requests.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.while_stepping(frame, time.monotonic() - started)

    def tell_ranks(self, messages: list[Profile]) -> None:
        """Queue messages for the ranks between steps. With no rank 0 connected (the group is
        being lost) they are dropped: the group's loss ends what they were about."""
        for msg in messages:
            try:
                self.batches.send(encode(msg), zmq.NOBLOCK)
            except zmq.Again:
                logger.warning("rank 0 is not connected; %s not delivered", type(msg).__name__)

    def drop_results(self) -> None:
        """Discard what a replaced group sent (before the new one gets its first step)."""
        while True:
            try:
                self.results.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def events_address(self) -> str | None:
        """Where the tree events are published (the port chosen when the address asked for 0)."""
        if self.events is None:
            return None
        return self.events.getsockopt_string(zmq.LAST_ENDPOINT)

    def publish(self, tree_events: TreeEventLog | None) -> None:
        """Send the tree events collected since the last call (they never block the loop)."""
        if self.events is None or tree_events is None:
            return
        for event in tree_events.drain():
            self.events.send(encode(event), zmq.NOBLOCK)

    def send(self, outputs: list, block: bool = True) -> None:
        """Send outputs to the api; one that cannot be encoded becomes an error for its request.
        ``block=False`` drops what the api (gone at shutdown) does not take."""
        for out in outputs:
            try:
                frame = encode(out)
            except Exception:
                logger.exception("cannot encode an output of %s", getattr(out, "rid", "?"))
                error = "internal error while sending the output"
                frame = encode(RequestOutput(rid=out.rid, finished=True, error=error, status=500))
            try:
                self.outputs.send(frame, 0 if block else zmq.NOBLOCK)
            except zmq.Again:
                return

    def close(self) -> None:
        try:
            self.batches.send(encode(Shutdown()), zmq.NOBLOCK)
        except zmq.Again:
            pass  # rank 0 is gone
        self.ctx.destroy(linger=1000)
