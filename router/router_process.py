"""The router process: the only holder of request state. It turns api messages into scheduler
requests, runs one step at a time against rank 0 over ZeroMQ, and streams outputs back.

No request can end the process: each api message and each step is guarded, and what cannot be
served ends with an error to its own client (400 for the client's fault, 500 for ours, 429 when the
queue is full) while everyone else goes on. Nor can the loss of the TP group (a rank dead, hung or
failed): its requests go back to the queue with the tokens they streamed, the launcher replaces the
group, and they go on where they were. The launcher alone stops the router (Shutdown on the
control pipe, or the pipe closing when the launcher dies)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import zmq

from radixcluster.log_format import configure_logging
from radixcluster.model_config import load_model_config
from radixcluster.protocol import (
    MID_STEP_KINDS,
    STEP_OVERDUE_S,
    AbortRequest,
    ControlRequest,
    ControlResponse,
    ForwardBatch,
    GenerateRequest,
    GroupDown,
    GroupUp,
    ProtocolError,
    RequestOutput,
    RestartGroup,
    RouterReady,
    Shutdown,
    StepResult,
    decode,
    encode,
)
from radixcluster.router.batch_builder import ScheduledBatch
from radixcluster.router.cache_control import CacheControl
from radixcluster.router.decode_log import DecodeLog
from radixcluster.router.grammar import GrammarCache, requested_grammar
from radixcluster.router.grammar_waits import GrammarWaits
from radixcluster.router.group_health import GroupHealth
from radixcluster.router.output_streams import OutputStreams
from radixcluster.router.prefill_log import log_prefill
from radixcluster.router.profiling import ProfileControl, ProfileRefused
from radixcluster.router.request import Request
from radixcluster.router.request_intake import RequestIntake, RequestRejected
from radixcluster.router.request_log import RequestLog
from radixcluster.router.router_sockets import GroupLost, LauncherSpoke, RouterAddresses, RouterSockets, StepAbandoned
from radixcluster.router.scheduler import Scheduler, SchedulerConfig
from radixcluster.router.step_times import StepTimes
from radixcluster.router.tenant_quota import TenantQuota
from radixcluster.router.text.tokenizer import load_tokenizer
from radixcluster.router.tree_events import TreeEventLog

logger = logging.getLogger(__name__)

Executor = Callable[[ForwardBatch], StepResult]
# what a request that waits for its grammar carries until it can be queued
Pending = tuple[GenerateRequest, Request, "str | None"]

SHUTDOWN_MESSAGE = "the server is shutting down"
# how long the loop sleeps in a poll: idle, or only waiting for grammars to compile
IDLE_POLL_MS = 100
COMPILING_POLL_MS = 10
# a request admitted when the group was lost this many times ends with an error instead of being
# re-queued again: it may be what makes the group fail
MAX_LOSSES_PER_REQUEST = 2


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
    max_queued_requests: int  # waiting (and compiling) requests beyond which new ones get a 429
    kv_cache_dtype: str = "auto"  # as given: auto, fp8_e4m3, fp8_e5m2
    log_level: str = "warning"
    cache_page_text: bool = False  # the cache page's tree shows each node's first tokens as text
    json_any_whitespace: bool = True  # a JSON schema lets the model put any whitespace between tokens
    max_pinned_fraction: float = 0.5  # of the KV pool, the most that pinned prefixes may hold
    step_timeout_s: float = 600.0  # a step without a result for this long: the TP group is hung
    max_worker_restarts: int = 3  # group losses in a row the launcher repairs; one more ends the replica
    stream_interval: int = 1  # a streaming request's outputs: its first token, then every this many
    tenant_quotas: dict[str, TenantQuota] = field(default_factory=dict)  # --api-key-file: tenant -> quotas
    chat_template: str | None = None  # --chat-template's text, in place of the model's
    log_requests: bool = False  # --log-requests: a line when each request is queued and when it ends
    schedule_conservativeness: float = 1.0  # SGLang's: scales the KV held back for running decodes
    decode_log_interval: int = 40  # SGLang's: an INFO line on the decode batch every this many steps
    tokenizer_path: Path | None = None  # --tokenizer-path (None: the model's own)
    server_args: dict[str, Any] = field(default_factory=dict)  # the command's flags, for /server_info
    # SGLang's --allow-auto-truncate: a prompt over the context keeps its beginning, and an output
    # limit over the room left is lowered to it, instead of a 400
    allow_auto_truncate: bool = False


class Router:
    """Request state without sockets: ``submit`` takes api messages, ``step`` runs one batch
    through an executor (rank 0 over ZeroMQ, or an in-process runner for offline use).
    With ``tree_events`` the tree's changes collect there, for the router process to publish."""

    def __init__(self, config: RouterConfig, tree_events: TreeEventLog | None = None) -> None:
        self.config = config
        self.tree_events = tree_events
        model_config = load_model_config(config.model_path)
        self.model_names = {"model_type": model_config.model_type, "architectures": list(model_config.architectures)}
        self.tokenizer = load_tokenizer(config.tokenizer_path or config.model_path, config.chat_template)
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
                max_pinned_fraction=config.max_pinned_fraction,
                tenant_quotas=config.tenant_quotas,
                schedule_conservativeness=config.schedule_conservativeness,
            ),
            on_tree_event=tree_events.on_event if tree_events is not None else None,
        )
        self.intake = RequestIntake(
            self.tokenizer,
            model_config.vocab_size,
            config.context_length,
            config.num_pages * config.page_size,
            config.allow_auto_truncate,
        )
        self.grammars = GrammarCache(self.tokenizer, model_config.vocab_size, config.json_any_whitespace)
        self.compiling: GrammarWaits[Pending] = GrammarWaits(self.grammars)
        self.streams = OutputStreams(self.tokenizer, self.intake.memo, config.stream_interval)
        self.step_times = StepTimes()
        self.request_log = RequestLog(config.log_requests)
        self.decode_log = DecodeLog(config.decode_log_interval)
        self.group = GroupHealth(config.max_worker_restarts)
        self.profiles = ProfileControl(config.tp_size)
        self.aborted_total = 0
        self._batch: ScheduledBatch | None = None  # the step in progress

    def submit_frame(self, frame: bytes) -> list[RequestOutput | ControlResponse]:
        """``submit`` the message in ``frame``; one that cannot be read (an api of another
        version) is answered with an error when it names its request, whose caller would
        otherwise wait for ever."""
        try:
            msg = decode(frame)
        except ProtocolError as exc:
            logger.error("dropping a malformed frame from the api: %s", exc)
            why = f"the router could not read the request (is the api of the same version?): {exc}"
            rid, cid = exc.named("rid"), exc.named("cid")
            if rid is not None:
                return [_failed(rid, why, 500)]
            return [ControlResponse(cid, error=why)] if cid is not None else []
        return self.submit(msg)

    def answer_mid_step(self, msg: object, running_s: float, behind: bool) -> ControlResponse | None:
        """The answer to a MID_STEP_KINDS question that came while the step in flight has run
        ``running_s``; None for any other message, to be submitted once the step ends. A
        question ``behind`` messages that wait for the step waits too (a client that aborts, then
        reads /get_load, reads its own abort), but health, which they do not change."""
        if not isinstance(msg, ControlRequest) or msg.kind not in MID_STEP_KINDS:
            return None
        if behind and msg.kind != "health":
            return None
        if msg.kind == "health" and running_s > STEP_OVERDUE_S:
            return ControlResponse(
                msg.cid,
                error=f"the step running has had no result for {running_s:.0f} s (a rank may be stuck: its "
                f"group is replaced at --step-timeout {self.config.step_timeout_s:g} s)",
            )
        (answer,) = self.submit(msg)
        assert isinstance(answer, ControlResponse)
        return answer

    def submit(self, msg: object) -> list[RequestOutput | ControlResponse]:
        """Handle one api message; returns what must be answered right away."""
        return self.request_log.ended(self._handle(msg))

    def _handle(self, msg: object) -> list[RequestOutput | ControlResponse]:
        if isinstance(msg, GenerateRequest):
            try:
                return self._submit(msg)
            except RequestRejected as exc:
                return [_failed(msg.rid, str(exc), 400, exc.param)]
            except Exception:
                logger.exception("admitting request %s failed", msg.rid)
                self._forget(msg.rid)
                return [_failed(msg.rid, "internal error while admitting the request", 500)]
        if isinstance(msg, AbortRequest):
            rids = self.streams.rids() + self.compiling.rids() if msg.abort_all else [msg.rid]
            aborted: list[RequestOutput | ControlResponse] = [*self._abort(rids, "the request was aborted", 200)]
            return aborted
        if isinstance(msg, ControlRequest):
            try:
                return [self._control(msg)]
            except Exception:
                logger.exception("control request %r failed", msg.kind)
                return [ControlResponse(msg.cid, error=f"internal error while answering {msg.kind!r}")]
        logger.warning("ignoring unexpected message %s", type(msg).__name__)
        return []

    def _submit(self, msg: GenerateRequest) -> list[RequestOutput | ControlResponse]:
        if msg.rid in self.streams or msg.rid in self.compiling:
            raise RequestRejected(f"request id {msg.rid!r} is already running")
        queued = self.queued()
        if queued >= self.config.max_queued_requests:
            if not self.group.up:
                return [_failed(msg.rid, f"{self._group_down_message()}; {queued} requests wait; retry later", 503)]
            return [_failed(msg.rid, f"the server is busy: {queued} requests are queued; retry later", 429)]
        request, prompt_text = self.intake.make_request(msg)
        key = requested_grammar(msg.sampling)
        if key is not None:
            compiled = self.grammars.lookup(key)
            if compiled is None:
                self.compiling.add(msg.rid, key, (msg, request, prompt_text))
                return []
            request.grammar = self.grammars.matcher(compiled, msg.sampling)
        self._queue(msg, request, prompt_text)
        return []

    def _queue(self, msg: GenerateRequest, request: Request, prompt_text: str | None) -> None:
        self.streams.open(msg, request, prompt_text)
        self.scheduler.add_request(request)
        self.request_log.queued(request)

    def _forget(self, rid: str) -> None:
        """Drop whatever a request that failed half-way left behind."""
        self.compiling.cancel(rid)
        self.scheduler.abort_request(rid)
        self.streams.close(rid)

    def queued(self) -> int:
        """Requests not admitted yet: waiting in the scheduler, or for their grammar."""
        return len(self.scheduler.waiting) + len(self.compiling)

    def idle(self) -> bool:
        return self.scheduler.is_idle() and not self.compiling

    def poll_timeout_ms(self) -> int:
        """How long the loop may wait for a message before it must step again."""
        if not self.scheduler.is_idle() and self.group.up:
            return 0
        return COMPILING_POLL_MS if self.compiling else IDLE_POLL_MS

    def step(self, execute: Executor) -> list[RequestOutput]:
        """Queue the requests whose grammar compiled, then schedule and run one batch; returns
        the outputs produced. A step that raises fails the requests it was serving (500), and
        only those."""
        outputs = self._admit_compiled()
        try:
            outputs += self._step(execute)
        except StepAbandoned:
            raise  # not this batch's fault: run_router asks the launcher for a new group
        except Exception:
            failed = (
                self._batch.requests if self._batch is not None else self.scheduler.running + self.scheduler.prefilling
            )
            logger.exception("a step failed; ending its %d requests with an error", len(failed))
            rids = [r.rid for r in failed if r.rid in self.streams]
            outputs += self._abort(rids, "internal error while running the request", 500)
        finally:
            self._batch = None
        return self.request_log.ended(outputs)

    def _step(self, execute: Executor) -> list[RequestOutput]:
        start = time.perf_counter()
        self._batch = batch = self.scheduler.schedule()
        if batch is None:
            return []
        if batch.is_prefill:
            log_prefill(batch.forward, batch.requests, len(self.scheduler.running), self.queued(), self._pool_used())
        result = execute(batch.forward)
        self.group.stepped()
        self.profiles.stepped()
        advanced = self.scheduler.process_result(batch, result)
        outputs = self.streams.collect(advanced, self.scheduler)
        seconds = time.perf_counter() - start
        self.step_times.observe(seconds)
        if not batch.is_prefill:
            self.decode_log.stepped(len(batch.requests), seconds, self.queued(), self._pool_used())
        return outputs

    def _pool_used(self) -> float:
        """The KV pool's share in use (the tree's evictable pages included)."""
        return 1 - self.scheduler.allocator.num_free / self.config.num_pages

    def lose_group(self, generation: int, reason: str) -> list[RequestOutput] | None:
        """Group ``generation`` is gone and its KV with it: every admitted request goes back to the
        queue to recompute what it had (a request admitted at too many losses ends with a 500
        instead), the tree empties, and no step runs until ``group_restored``. A report about a
        group already lost or replaced changes nothing (None)."""
        if not self.group.lose(generation, reason):
            return None
        logger.error("the TP group (generation %d) is lost: %s; its requests wait for a new group", generation, reason)
        self.profiles.group_lost()
        requeued = self.scheduler.requeue_all()
        self.group.requeued_total += len(requeued)
        doomed = []
        for req in requeued:
            req.group_losses += 1
            if req.group_losses >= MAX_LOSSES_PER_REQUEST:
                doomed.append(req.rid)
        message = f"the model workers failed {MAX_LOSSES_PER_REQUEST} times while running this request ({reason})"
        return self.request_log.ended(self._abort(doomed, message, 500))

    def group_restored(self, generation: int) -> None:
        logger.warning("the TP group (generation %d) serves; resuming", generation)
        self.group.restored(generation)

    def _group_down_message(self) -> str:
        return f"the model workers are restarting ({self.group.down_reason})"

    def _admit_compiled(self) -> list[RequestOutput]:
        outputs = []
        for done in self.compiling.finished():
            msg, request, prompt_text = done.payload
            if done.compiled is None:
                outputs.append(_failed(msg.rid, done.error or "the grammar did not compile", done.status))
                continue
            request.grammar = self.grammars.matcher(done.compiled, msg.sampling)
            try:
                self._queue(msg, request, prompt_text)
            except Exception:
                logger.exception("queueing request %s failed", msg.rid)
                self._forget(msg.rid)
                outputs.append(_failed(msg.rid, "internal error while admitting the request", 500))
        return outputs

    def abort_all(self, message: str, status: int = 200) -> list[RequestOutput]:
        """End every open request (shutdown), those waiting for a grammar too."""
        return self.request_log.ended(self._abort(self.compiling.rids() + self.streams.rids(), message, status))

    def _abort(self, rids: list[str], message: str, status: int) -> list[RequestOutput]:
        """End ``rids`` from outside (their client, shutdown, a failed step), whether they wait
        for their grammar or run; ids that already ended are skipped."""
        outputs = []
        for rid in rids:
            if self.compiling.cancel(rid):
                outputs.append(_aborted(rid, message, status))
            elif rid in self.streams:
                self.scheduler.abort_request(rid, message)
                outputs.append(self.streams.abort(rid, message, status))
        self.aborted_total += len(outputs)
        return outputs

    def _control(self, msg: ControlRequest) -> ControlResponse:
        if msg.kind == "flush_cache":
            ok = self.scheduler.flush_cache()
            if ok:  # a flushed server tokenizes as a fresh one
                self.intake.memo.clear()
            message = "Cache flushed." if ok else "Cache not flushed: requests are running or waiting."
            return ControlResponse(msg.cid, {"success": ok, "message": message})
        if msg.kind == "cache_info":
            return ControlResponse(msg.cid, self.scheduler.cache_info(msg.args.get("tenant")))
        if msg.kind == "stats":
            return ControlResponse(msg.cid, self._stats())
        if msg.kind == "server_info":
            return ControlResponse(msg.cid, self._server_info())
        if msg.kind == "health":
            if not self.group.up:
                return ControlResponse(msg.cid, error=self._group_down_message())
            return ControlResponse(msg.cid, {"generation": self.group.generation})
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
        if msg.kind in ("start_profile", "stop_profile"):
            return self._profile(msg)
        if msg.kind in ("cache_tree", "cache_pin", "cache_unpin", "cache_evict"):
            return CacheControl(self.scheduler.cache, self.intake, self.config.cache_page_text).answer(msg)
        return ControlResponse(msg.cid, error=f"unknown control request {msg.kind!r}")

    def _profile(self, msg: ControlRequest) -> ControlResponse:
        """Start (while the group serves) or stop the ranks' profiler; the router process sends
        them what ``profiles`` owes before the next step."""
        if msg.kind == "start_profile" and not self.group.up:
            return ControlResponse(msg.cid, error=self._group_down_message())
        try:
            payload = self.profiles.start(msg.args) if msg.kind == "start_profile" else self.profiles.stop()
        except ProfileRefused as exc:
            return ControlResponse(msg.cid, error=str(exc))
        return ControlResponse(msg.cid, payload)

    def _stats(self) -> dict[str, Any]:
        """The scheduler's counters and gauges, the router's own, and the last tree event, for /metrics."""
        events = self.tree_events
        return {
            **self.scheduler.stats(),
            "waiting_requests": self.queued(),
            "generation_tokens_total": self.streams.generated_tokens_total,
            "aborted_requests_total": self.aborted_total,
            "step_seconds": self.step_times.snapshot(),
            "seconds_since_last_step": self.step_times.seconds_since_last(),
            "gen_throughput": self.decode_log.gen_throughput(),
            **self.group.stats(),
            "tree_events_instance": events.instance if events is not None else None,
            "tree_events_seq": events.seq if events is not None else None,
        }

    def _tokenize(self, args: dict) -> dict:
        """``{"tokens": [ids of each prompt]}``, with ``token_strs`` (each id's vocabulary entry)
        when asked; ValueError on a bad chat, or on more text than one prompt can hold."""
        tokens = self._token_ids(args)
        if not args.get("token_strs"):
            return {"tokens": tokens}
        return {"tokens": tokens, "token_strs": [[self.tokenizer.id_to_token(i) for i in ids] for ids in tokens]}

    def _token_ids(self, args: dict) -> list[list[int]]:
        """``prompts`` encoded as /generate would (the prompt memo's ids first), or ``messages``
        rendered with the chat template first (into the last one with ``continue_final_message``) (tokenizing more text than one prompt can hold would hold up the loop)."""
        if "messages" in args:
            self.intake.check_chat(args["messages"])
            text = self.tokenizer.apply_chat_template(
                args["messages"],
                args.get("add_generation_prompt", True),
                args.get("tools"),
                bool(args.get("continue_final_message", False)),
                template_kwargs=args.get("chat_template_kwargs"),
            )
            self.intake.check_text(text, "the rendered chat")
            return [self.intake.encode(text, add_special=False)]
        self.intake.check_text("".join(args["prompts"]), "the text to tokenize")
        add_special = bool(args.get("add_special_tokens", True))
        return [self.intake.encode(p, add_special) for p in args["prompts"]]

    def _detokenize(self, args: dict) -> dict:
        """``{"texts": [text of each id list]}``; ValueError naming ids outside the vocabulary, or
        on more ids than /tokenize may return at once."""
        count, most = sum(map(len, args["tokens"])), self.intake.max_text_chars
        if count > most:
            raise ValueError(f"{count} token ids to detokenize; at most {most} per request")
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
            **c.server_args,  # what follows is what they came to (a context length, a pool)
            "model_path": str(c.model_path),
            "tokenizer_path": str(self.tokenizer.path),
            "served_model_name": c.served_model_name,
            **self.model_names,
            "tp_size": c.tp_size,
            "page_size": c.page_size,
            "context_length": c.context_length,
            "max_total_num_tokens": c.num_pages * c.page_size,
            "max_running_requests": c.max_running_requests,
            "chunked_prefill_size": c.chunked_prefill_size,
            "stream_interval": c.stream_interval,
            "schedule_policy": self.scheduler.policy.policy,
            "radix_eviction_policy": c.eviction_policy,
            "disable_radix_cache": not c.enable_radix_cache,
            "device": c.device,
            "dtype": c.dtype,
            "kv_cache_dtype": c.kv_cache_dtype,
            "vocab_size": self.intake.vocab_size,
            "max_queued_requests": c.max_queued_requests,
            "kv_events_address": self.tree_events.address if self.tree_events is not None else None,
            # SGLang's per-DP-rank scheduler state (one here: a replica is one router), which its
            # benchmarks read: bench_one_batch_server asserts the running-request bound is set
            "internal_states": [
                {
                    "effective_max_running_requests_per_dp": c.max_running_requests,
                    "last_gen_throughput": round(self.decode_log.gen_throughput(), 2),
                    "memory_usage": {"token_capacity": c.num_pages * c.page_size},
                }
            ],
        }


def _failed(rid: str, message: str, status: int, param: str | None = None) -> RequestOutput:
    return RequestOutput(rid=rid, finished=True, error=message, status=status, error_param=param)


def _aborted(rid: str, message: str, status: int) -> RequestOutput:
    """The only output of a request ended from outside before it was queued."""
    out = RequestOutput(rid=rid, finished=True, finish_reason={"type": "abort", "message": message})
    if status != 200:
        out.error, out.status = message, status
    return out


def run_router(config: RouterConfig, addresses: RouterAddresses, control: Connection) -> None:
    """Entry point of the router process: say RouterReady on ``control``, then serve until the
    launcher says Shutdown or closes it; abort what is left. Group losses are handled here: the
    router's own findings (a rank's failure, the step timeout) and the launcher's (a rank died)."""
    configure_logging(config.log_level)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # the launcher decides when we stop, after the api drained
    router = Router(config, TreeEventLog(config.page_size) if addresses.events else None)
    deferred: list[object] = []  # what the api sent during a step, submitted once it ends

    def while_stepping(frame: bytes, running_s: float) -> None:
        try:
            msg: object = decode(frame)
        except ProtocolError:
            deferred.append(frame)  # submit_frame answers it
            return
        answer = router.answer_mid_step(msg, running_s, behind=bool(deferred))
        if answer is None:
            deferred.append(msg)
        else:
            sockets.send([answer])

    sockets = RouterSockets(addresses, config.step_timeout_s, control.fileno(), while_stepping)
    if router.tree_events is not None:
        router.tree_events.address = sockets.events_address()
    control.send_bytes(encode(RouterReady()))
    try:
        while True:
            events = dict(sockets.poller.poll(0 if deferred else router.poll_timeout_ms()))
            if control.fileno() in events and not _hear_launcher(router, sockets, control):
                break
            if sockets.requests in events or deferred:
                for item in _api_messages(deferred, sockets):
                    answers = router.submit_frame(item) if isinstance(item, bytes) else router.submit(item)
                    sockets.publish(router.tree_events)  # a flush's evictions precede its answer
                    sockets.tell_ranks(router.profiles.take())
                    sockets.send(answers)
            if not router.group.up:
                continue  # requests queue until the launcher says GroupUp
            try:
                outputs = router.step(sockets.execute)
            except LauncherSpoke:
                if not _hear_launcher(router, sockets, control):
                    break
                continue
            except GroupLost as exc:
                _lose_group(router, sockets, control, router.group.generation, str(exc))
                continue
            sockets.publish(router.tree_events)  # a prefix is announced before its request's output
            sockets.tell_ranks(router.profiles.take())
            sockets.send(outputs)
        sockets.send(router.abort_all(SHUTDOWN_MESSAGE, 503), block=False)
    finally:
        sockets.close()


def _api_messages(deferred: list[object], sockets: RouterSockets) -> Iterator[object]:
    """What the api sent: first what came during the last step (decoded, or frames that could
    not be), in order, then the frames waiting on the socket."""
    while deferred:
        yield deferred.pop(0)
    while True:
        try:
            yield sockets.requests.recv(zmq.NOBLOCK)
        except zmq.Again:
            return


def _hear_launcher(router: Router, sockets: RouterSockets, control: Connection) -> bool:
    """Act on the launcher's message; False when the router must stop."""
    try:
        msg = decode(control.recv_bytes())
    except (EOFError, OSError):
        return False  # the launcher is gone
    if isinstance(msg, GroupDown):
        _lose_group(router, sockets, control, msg.generation, msg.reason)
    elif isinstance(msg, GroupUp):
        sockets.drop_results()
        router.group_restored(msg.generation)
    return not isinstance(msg, Shutdown)


def _lose_group(router: Router, sockets: RouterSockets, control: Connection, generation: int, reason: str) -> None:
    """Re-queue the lost group's requests and ask the launcher for a new group; when the losses
    in a row exceed the budget, end every request with the reason and the process (exit 1)."""
    outputs = router.lose_group(generation, reason)
    if outputs is None:
        return  # a late report about a group already lost
    sockets.publish(router.tree_events)  # the emptied tree's evictions
    sockets.send(outputs)
    if router.group.budget_spent:
        budget = router.config.max_worker_restarts
        message = f"the model workers failed {budget + 1} times in a row, the last: {reason}"
        logger.error("%s; giving up (--max-worker-restarts %d)", message, budget)
        sockets.send(router.abort_all(message, 503), block=False)
        raise SystemExit(1)
    control.send_bytes(encode(RestartGroup(generation, reason)))
