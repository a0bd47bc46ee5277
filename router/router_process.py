"""The router process: the only holder of request state. It turns api messages into scheduler
requests, runs one step at a time against rank 0 over ZeroMQ, and streams outputs back."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import zmq

from radixcluster.model_config import load_model_config
from radixcluster.protocol import (
    AbortRequest,
    ControlRequest,
    ControlResponse,
    ForwardBatch,
    GenerateRequest,
    RequestOutput,
    Shutdown,
    StepResult,
    decode,
    encode,
)
from radixcluster.router.output_streams import OutputStreams
from radixcluster.router.request_intake import RequestIntake, RequestRejected
from radixcluster.router.scheduler import Scheduler, SchedulerConfig
from radixcluster.router.text.tokenizer import load_tokenizer
from radixcluster.router.tree_events import TreeEventLog

logger = logging.getLogger(__name__)

Executor = Callable[[ForwardBatch], StepResult]
EVENTS_HWM = 100_000


@dataclass(slots=True)
class RouterAddresses:
    """ZeroMQ endpoints, all bound by the router."""

    request: str  # the api PUSHes GenerateRequest/AbortRequest/ControlRequest
    output: str  # the api PULLs RequestOutput/ControlResponse
    batch: str  # rank 0 PULLs ForwardBatch
    result: str  # rank 0 PUSHes StepResult
    events: str | None = None  # gateways SUBscribe to TreeEvent here (tcp://); None: not published


@dataclass(slots=True)
class RouterConfig:
    model_path: Path
    served_model_name: str
    num_pages: int
    page_size: int
    context_length: int
    max_running_requests: int
    chunked_prefill_size: int
    schedule_policy: str
    eviction_policy: str
    enable_radix_cache: bool
    tp_size: int
    device: str
    dtype: str
    log_level: str = "warning"


class Router:
    """Request state without sockets: ``submit`` takes api messages, ``step`` runs one batch
    through an executor (rank 0 over ZeroMQ, or an in-process runner for offline use).
    With ``tree_events`` the tree's changes collect there, for the router process to publish."""

    def __init__(self, config: RouterConfig, tree_events: TreeEventLog | None = None) -> None:
        self.config = config
        self.tree_events = tree_events
        model_config = load_model_config(config.model_path)
        self.tokenizer = load_tokenizer(config.model_path)
        self.scheduler = Scheduler(
            SchedulerConfig(
                num_pages=config.num_pages,
                page_size=config.page_size,
                max_running_requests=config.max_running_requests,
                chunked_prefill_size=config.chunked_prefill_size,
                max_context_len=config.context_length,
                schedule_policy=config.schedule_policy,
                enable_radix_cache=config.enable_radix_cache,
                eviction_policy=config.eviction_policy,
            ),
            on_tree_event=tree_events.on_event if tree_events is not None else None,
        )
        self.intake = RequestIntake(self.tokenizer, model_config.vocab_size, config.context_length)
        self.streams = OutputStreams(self.tokenizer, self.intake.memo)

    def submit(self, msg: object) -> list[RequestOutput | ControlResponse]:
        """Handle one api message; returns what must be answered right away."""
        if isinstance(msg, GenerateRequest):
            try:
                request, prompt_text = self.intake.make_request(msg)
            except RequestRejected as exc:
                return [RequestOutput(rid=msg.rid, finished=True, error=str(exc), status=400)]
            self.streams.open(msg, request, prompt_text)
            self.scheduler.add_request(request)
            return []
        if isinstance(msg, AbortRequest):
            rids = self.streams.rids() if msg.abort_all else [msg.rid] if msg.rid in self.streams else []
            aborted: list[RequestOutput | ControlResponse] = [*self._abort(rids, "the request was aborted", 200)]
            return aborted
        if isinstance(msg, ControlRequest):
            return [self._control(msg)]
        logger.warning("ignoring unexpected message %s", type(msg).__name__)
        return []

    def idle(self) -> bool:
        return self.scheduler.is_idle()

    def step(self, execute: Executor) -> list[RequestOutput]:
        """Schedule and run one batch; returns the outputs it produced (empty when idle)."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        result = execute(batch.forward)
        advanced = self.scheduler.process_result(batch, result)
        if result.error is not None:
            logger.error("step %d failed on the worker: %s", result.step_id, result.error)
            message = f"internal error in the model worker: {result.error}"
            return [self.streams.abort(r.rid, message, 500) for r in advanced if r.rid in self.streams]
        return self.streams.collect(advanced, self.scheduler)

    def abort_all(self, message: str, status: int = 200) -> list[RequestOutput]:
        """End every open request (shutdown)."""
        return self._abort(self.streams.rids(), message, status)

    def _abort(self, rids: list[str], message: str, status: int) -> list[RequestOutput]:
        for rid in rids:
            self.scheduler.abort_request(rid, message)
        return [self.streams.abort(rid, message, status) for rid in rids]

    def _control(self, msg: ControlRequest) -> ControlResponse:
        if msg.kind == "flush_cache":
            ok = self.scheduler.flush_cache()
            message = "Cache flushed." if ok else "Cache not flushed: requests are running or waiting."
            return ControlResponse(msg.cid, {"success": ok, "message": message})
        if msg.kind == "cache_info":
            return ControlResponse(msg.cid, self.scheduler.cache_info())
        if msg.kind == "stats":
            return ControlResponse(msg.cid, self._stats())
        if msg.kind == "server_info":
            return ControlResponse(msg.cid, self._server_info())
        if msg.kind in ("tokenize", "detokenize"):
            try:
                payload = self._tokenize(msg.args) if msg.kind == "tokenize" else self._detokenize(msg.args)
            except ValueError as exc:
                return ControlResponse(msg.cid, error=str(exc))
            return ControlResponse(msg.cid, payload)
        if msg.kind == "cache_blocks":
            if self.tree_events is None:
                return ControlResponse(msg.cid, error="tree events are off: start the server with --kv-events-address")
            return ControlResponse(msg.cid, self.tree_events.snapshot(self.scheduler.tree.root))
        return ControlResponse(msg.cid, error=f"unknown control request {msg.kind!r}")

    def _stats(self) -> dict:
        """The scheduler's counters and gauges, the tokens streamed, the last tree event."""
        events = self.tree_events
        return {
            **self.scheduler.stats(),
            "generation_tokens_total": self.streams.generated_tokens_total,
            "tree_events_instance": events.instance if events is not None else None,
            "tree_events_seq": events.seq if events is not None else None,
        }

    def _tokenize(self, args: dict) -> dict:
        """``{"tokens": [ids of each prompt]}``: ``prompts`` encoded as /generate would, or
        ``messages`` rendered with the chat template first; ValueError on a bad chat."""
        if "messages" in args:
            text = self.tokenizer.apply_chat_template(args["messages"], args.get("add_generation_prompt", True))
            return {"tokens": [self.tokenizer.encode(text, add_special_tokens=False)]}
        add_special = bool(args.get("add_special_tokens", True))
        return {"tokens": [self.tokenizer.encode(p, add_special_tokens=add_special) for p in args["prompts"]]}

    def _detokenize(self, args: dict) -> dict:
        """``{"texts": [text of each id list]}``; ValueError naming ids outside the vocabulary."""
        vocab = self.intake.vocab_size
        for ids in args["tokens"]:
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        skip = bool(args.get("skip_special_tokens", True))
        return {"texts": [self.tokenizer.decode(ids, skip_special_tokens=skip) for ids in args["tokens"]]}

    def _server_info(self) -> dict:
        c = self.config
        return {
            "model_path": str(c.model_path),
            "tokenizer_path": str(self.tokenizer.path),
            "served_model_name": c.served_model_name,
            "tp_size": c.tp_size,
            "page_size": c.page_size,
            "context_length": c.context_length,
            "max_total_num_tokens": c.num_pages * c.page_size,
            "max_running_requests": c.max_running_requests,
            "chunked_prefill_size": c.chunked_prefill_size,
            "schedule_policy": self.scheduler.policy.policy,
            "radix_eviction_policy": c.eviction_policy,
            "disable_radix_cache": not c.enable_radix_cache,
            "device": c.device,
            "dtype": c.dtype,
            "vocab_size": self.intake.vocab_size,
            "kv_events_address": self.tree_events.address if self.tree_events is not None else None,
        }


class RouterSockets:
    """The four ZeroMQ sockets the router binds, and a remote executor over two of them."""

    def __init__(self, addresses: RouterAddresses) -> None:
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

    def _bind(self, kind: int, address: str) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.bind(address)
        return sock

    def execute(self, batch: ForwardBatch) -> StepResult:
        self.batches.send(encode(batch))
        result = decode(self.results.recv())
        if result.step_id != batch.step_id:
            raise RuntimeError(f"rank 0 answered step {result.step_id}, expected {batch.step_id}")
        return result

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

    def send(self, outputs: list) -> None:
        for out in outputs:
            self.outputs.send(encode(out))

    def close(self) -> None:
        self.batches.send(encode(Shutdown()))
        self.ctx.destroy(linger=1000)


def run_router(config: RouterConfig, addresses: RouterAddresses, ready: Connection) -> None:
    """Entry point of the router process: serve until SIGTERM, then abort what is left."""
    logging.basicConfig(level=getattr(logging, config.log_level.upper()))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when we stop
    router = Router(config, TreeEventLog(config.page_size) if addresses.events else None)
    sockets = RouterSockets(addresses)
    if router.tree_events is not None:
        router.tree_events.address = sockets.events_address()
    ready.send("ready")
    try:
        while not stopping.is_set():
            timeout = 100 if router.idle() else 0
            if sockets.poller.poll(timeout):
                while True:
                    try:
                        frame = sockets.requests.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    answers = router.submit(_decode_or_none(frame))
                    sockets.publish(router.tree_events)  # a flush's evictions precede its answer
                    sockets.send(answers)
            outputs = router.step(sockets.execute)
            sockets.publish(router.tree_events)  # a prefix is announced before its request's output
            sockets.send(outputs)
        sockets.send(router.abort_all("the server is shutting down"))
    finally:
        sockets.close()


def _decode_or_none(frame: bytes) -> object:
    try:
        return decode(frame)
    except ValueError as exc:
        logger.error("dropping a malformed frame from the api: %s", exc)
        return None
