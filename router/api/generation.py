"""Running generations for the HTTP routes: accumulate the router's deltas, time them, merge
the sub-requests of a batch, abort when the client leaves, and speak SSE."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from radixcluster.protocol import GenerateRequest, RequestOutput
from radixcluster.router.api.auth import current_tenant
from radixcluster.router.api.errors import ApiError, anthropic_path, error_body, error_type
from radixcluster.router.api.json_text import utf8_json
from radixcluster.router.api.metrics import ApiMetrics
from radixcluster.router.api.router_client import RouterClient

T = TypeVar("T")

# nginx's code for "the client closed the request": nobody reads it, the log does.
CLIENT_CLOSED = 499
DEADLINE_EXCEEDED = 504


@dataclass(slots=True, frozen=True)
class Generation:
    """One request as it stood after one output of the router (which sends deltas).

    Outputs of a request can queue up before a route reads them (a slow reader, a busy event
    loop), so each is a value of its own: its delta (``new_text``, ``new_output_logprobs``) and
    its view of the request's growing lists never change once made."""

    rid: str
    return_logprob: bool = False
    top_logprobs_num: int = 0
    text: str = ""  # everything so far (strings are immutable: no copy)
    new_text: str = ""
    new_output_logprobs: list[list[Any]] = field(default_factory=list)
    finished: bool = False
    finish_reason: dict[str, Any] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    pinned_tokens: int = 0
    input_logprobs: list[list[Any]] = field(default_factory=list)
    input_top_logprobs: list[Any] = field(default_factory=list)
    e2e_latency: float = 0.0
    # the request's lists, shared by its Generations and only ever appended to: each reads
    # its own prefix (and the texts of token ids, which never change once known)
    token_texts: dict[int, str] = field(default_factory=dict)
    partial_bytes: dict[int, list[int]] = field(default_factory=dict)
    all_output_ids: list[int] = field(default_factory=list)
    num_output_ids: int = 0
    all_output_logprobs: list[list[Any]] = field(default_factory=list)
    num_output_logprobs: int = 0
    prompt_ids: list[int] = field(default_factory=list)  # when asked (GenerateRequest.return_prompt_ids)
    stop_token_ids: tuple[int, ...] = ()  # the request's own, which vLLM's stop_reason names (EOS it does not)

    @property
    def output_ids(self) -> list[int]:
        return self.all_output_ids[: self.num_output_ids]

    @property
    def output_logprobs(self) -> list[list[Any]]:
        return self.all_output_logprobs[: self.num_output_logprobs]

    @property
    def finish_type(self) -> str | None:
        return None if self.finish_reason is None else self.finish_reason.get("type")

    def native(self) -> dict[str, Any]:
        """SGLang's native response object (cumulative). Logprob entries are SGLang's
        ``[logprob, token id, token text or None]``."""
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }
        if self.finished:  # as SGLang: a stream's earlier chunks have none
            meta["e2e_latency"] = self.e2e_latency
        if self.return_logprob:
            text = self.token_texts.get
            output_logprobs = self.output_logprobs
            meta["input_token_logprobs"] = [[lp, tid, text(tid)] for lp, tid in self.input_logprobs]
            meta["output_token_logprobs"] = [[lp, tid, text(tid)] for lp, tid, _ in output_logprobs]
            if self.top_logprobs_num > 0:
                meta["input_top_logprobs"] = [
                    None if tops is None else [[tlp, tid, text(tid)] for tlp, tid in tops]
                    for tops in self.input_top_logprobs
                ]
                meta["output_top_logprobs"] = [
                    [[tlp, tid, text(tid)] for tlp, tid in tops] for _, _, tops in output_logprobs
                ]
        return {"text": self.text, "output_ids": self.output_ids, "meta_info": meta}


class _Progress:
    """What one request has produced so far; ``add`` folds in a delta and returns the request's
    state after it."""

    def __init__(self, request: GenerateRequest) -> None:
        self.last = Generation(
            rid=request.rid,
            return_logprob=request.return_logprob,
            top_logprobs_num=request.top_logprobs_num,
            stop_token_ids=tuple(request.sampling.stop_token_ids),
        )

    def add(self, out: RequestOutput, e2e_latency: float) -> Generation:
        last = self.last
        last.all_output_ids.extend(out.output_ids)
        last.all_output_logprobs.extend(out.output_logprobs)
        last.token_texts.update(out.token_texts)
        last.partial_bytes.update(out.partial_bytes)
        self.last = Generation(
            rid=last.rid,
            return_logprob=last.return_logprob,
            top_logprobs_num=last.top_logprobs_num,
            text=last.text + out.text,
            new_text=out.text,
            new_output_logprobs=out.output_logprobs,
            finished=out.finished,
            finish_reason=out.finish_reason,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            cached_tokens=out.cached_tokens,
            pinned_tokens=out.pinned_tokens,
            input_logprobs=last.input_logprobs + out.input_logprobs if out.input_logprobs else last.input_logprobs,
            input_top_logprobs=(
                last.input_top_logprobs + out.input_top_logprobs if out.input_top_logprobs else last.input_top_logprobs
            ),
            e2e_latency=e2e_latency,
            token_texts=last.token_texts,
            partial_bytes=last.partial_bytes,
            all_output_ids=last.all_output_ids,
            num_output_ids=len(last.all_output_ids),
            prompt_ids=out.prompt_ids or last.prompt_ids,
            stop_token_ids=last.stop_token_ids,
            all_output_logprobs=last.all_output_logprobs,
            num_output_logprobs=len(last.all_output_logprobs),
        )
        return self.last


async def run_generation(
    client: RouterClient, request: GenerateRequest, metrics: ApiMetrics, deadline: float | None = None
) -> AsyncIterator[Generation]:
    """Yield the request's Generation after each output; a router rejection raises ApiError, and
    so does ``deadline`` (a ``time.monotonic()``) passing first (504; the request is aborted)."""
    request.tenant = current_tenant.get()
    progress = _Progress(request)
    start = last_token = time.monotonic()
    first = True
    outputs = client.generate(request)
    try:
        while True:
            try:
                out = await _next_before(outputs, deadline)
            except StopAsyncIteration:
                return
            if out.error is not None:
                raise ApiError(out.status if out.status >= 400 else 500, out.error, out.error_param)
            now = time.monotonic()
            if out.output_ids and request.log_metrics:
                # the first output may hold every token (a request not streamed): its first
                # token's own time; each token after it counts its share of the interval, as
                # SGLang counts a chunk's tokens
                later = len(out.output_ids)
                if first:
                    last_token, later = out.first_token_at or now, later - 1
                    metrics.time_to_first_token.observe(last_token - start)
                for _ in range(later):
                    metrics.inter_token_latency.observe((now - last_token) / later)
                first = False
                last_token = now
            gen = progress.add(out, now - start if out.finished else 0.0)
            if gen.finished and request.log_metrics:
                metrics.e2e_request_latency.observe(gen.e2e_latency)
            yield gen
    finally:
        await outputs.aclose()  # aborts the request on the router unless it finished


async def _next_before(outputs: AsyncGenerator[RequestOutput, None], deadline: float | None) -> RequestOutput:
    if deadline is None:
        return await anext(outputs)
    try:
        return await asyncio.wait_for(anext(outputs), max(deadline - time.monotonic(), 0.0))
    except asyncio.TimeoutError:
        raise ApiError(DEADLINE_EXCEEDED, "the request did not finish within its deadline_s") from None


def deadline_of(deadline_s: float | None) -> float | None:
    """The ``time.monotonic()`` by which a request given ``deadline_s`` must be done."""
    return None if deadline_s is None else time.monotonic() + deadline_s


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave several streams as their items arrive, tagged with the stream's index.

    The first exception of any stream is raised here; leaving early cancels the others
    (which aborts their requests).
    """
    queue: asyncio.Queue[tuple[int, Any, BaseException | None, bool]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((index, item, None, False))
        except Exception as exc:  # handed to the consumer, which re-raises it
            queue.put_nowait((index, None, exc, True))
        else:
            queue.put_nowait((index, None, None, True))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        live = len(tasks)
        while live:
            index, item, exc, ended = await queue.get()
            if exc is not None:
                raise exc
            if ended:
                live -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone (the body is already read, so only that can arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work`` in this task; if the client leaves first, cancel it (aborting its
    requests; it winds down before this returns) and raise a 499 ApiError. One watcher task,
    whose end cancels this one: cheaper than running ``work`` as a task of its own."""
    serving = asyncio.current_task()
    assert serving is not None
    finished = False

    def client_left(watcher: asyncio.Task[None]) -> None:
        # the watcher may end in the same loop iteration as the work: then nothing is cancelled
        if not finished and not watcher.cancelled():
            serving.cancel()

    gone = asyncio.create_task(_disconnected(receive))
    gone.add_done_callback(client_left)
    try:
        return await work
    except asyncio.CancelledError:
        if gone.done() and not gone.cancelled() and serving.uncancel() == 0:
            raise ApiError(CLIENT_CLOSED, "the client disconnected") from None
        raise
    finally:
        finished = True
        gone.cancel()


async def collect(request: Request, streams: list[AsyncIterator[Generation]]) -> list[Generation]:
    """Run sub-requests to completion, in input order; the client leaving aborts them."""

    async def drain() -> list[Generation]:
        results: list[Generation] = [None] * len(streams)  # type: ignore[list-item]
        async for index, gen in merge(streams):
            results[index] = gen
        return results

    return await until_disconnect(request.receive, drain())


def sse(payload: Any, event: str | None = None) -> bytes:
    named = f"event: {event}\n".encode() if event is not None else b""
    return named + b"data: " + utf8_json(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def error_frame(status: int, message: str, typed: bool, path: str = "", sequence_number: int = 0) -> bytes:
    """A stream's failure after its first frame: OpenAI's error chunk, or (``typed``) the
    ``error`` event of the Responses API (numbered ``sequence_number``, its code a string as
    OpenAI's are), or of the Messages API on its ``path``."""
    if anthropic_path(path):
        return sse(error_body(status, message, path=path), "error")
    if not typed:
        return sse(error_body(status, message))
    event = {"type": "error", "code": error_type(status), "message": message, "param": None}
    return sse({**event, "sequence_number": sequence_number}, "error")


def next_number(chunk: dict[str, Any], number: int) -> int:
    """The number an error event after ``chunk`` takes (Responses API events are numbered)."""
    return chunk["sequence_number"] + 1 if "sequence_number" in chunk else number


class SSEResponse(StreamingResponse):
    """A text/event-stream whose body iterator is always closed, so a client that leaves
    mid-stream aborts its requests at once rather than when the iterator is collected."""

    media_type = "text/event-stream"

    def __init__(self, body: AsyncGenerator[bytes, None], headers: dict[str, str]) -> None:
        super().__init__(body, headers=headers)
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._body.aclose()


async def start_stream(
    request: Request, chunks: AsyncGenerator[dict[str, Any], None], typed: bool = False
) -> SSEResponse:
    """SSE frames of ``chunks``, then ``[DONE]``; ``typed`` (the Responses and Messages APIs'
    events): each frame named by its chunk's ``type``, an error as an ``error`` event, and no
    ``[DONE]``.

    The first chunk is awaited before answering, so a request the router rejects at once
    gets its HTTP error status; an error after that becomes an error frame (the status
    line is already sent). A client that leaves before the first chunk aborts its requests
    at once (a queued or prefilling request runs for nobody otherwise).
    """
    try:
        first = await until_disconnect(request.receive, anext(chunks))
    except BaseException:
        await chunks.aclose()
        raise

    def frame(chunk: dict[str, Any]) -> bytes:
        return sse(chunk, chunk["type"]) if typed else sse(chunk)

    async def body() -> AsyncGenerator[bytes, None]:
        number = next_number(first, 0)
        try:
            yield frame(first)
            async for chunk in chunks:
                yield frame(chunk)
                number = next_number(chunk, number)
        except ApiError as exc:
            yield error_frame(exc.status, exc.message, typed, request.url.path, number)
        finally:
            await chunks.aclose()
        if not typed:
            yield SSE_DONE

    return SSEResponse(body(), headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
