"""Streams stay exact when the router's outputs pile up before a route reads them (a slow reader,
a busy event loop): the real RouterClient, run_generation, merge and SSE chunk builders, fed by
real ZeroMQ sockets that play the router and send every output before the stream is read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio
from openai.types.responses import ResponseErrorEvent

from radixcluster.protocol import (
    PROTOCOL_VERSION,
    STEP_OVERDUE_S,
    GenerateRequest,
    RequestOutput,
    SamplingParams,
    decode,
    encode,
)
from radixcluster.router.api.chat_answer import ChatAnswerReader
from radixcluster.router.api.errors import ApiError
from radixcluster.router.api.generation import Generation, error_frame, run_generation
from radixcluster.router.api.metrics import ApiMetrics
from radixcluster.router.api.native_routes import EVERY_EVENT_ENTRIES, _native_chunks
from radixcluster.router.api.openai_routes import _chat_chunks, _completion_chunks
from radixcluster.router.api.openai_schemas import ChatCompletionIn, CompletionIn
from radixcluster.router.api.router_client import CONTROL_TIMEOUT_S, RouterClient, control_timeout
from radixcluster.router.api.tool_calls import ChatToolCalls

DELTAS = ["Hel", "lo", ", wor", "ld", "!"]


class FakeRouterSockets:
    """The router's two api-facing sockets, driven by the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.ctx = zmq.asyncio.Context()
        self.requests = self.ctx.socket(zmq.PULL)
        self.outputs = self.ctx.socket(zmq.PUSH)
        self.request_address = f"ipc://{tmp_path}/in"
        self.output_address = f"ipc://{tmp_path}/out"
        self.requests.bind(self.request_address)
        self.outputs.bind(self.output_address)

    async def take(self, count: int) -> list[Any]:
        return [decode(await self.requests.recv()) for _ in range(count)]

    async def answer(self, rid: str, deltas: list[str]) -> None:
        """Every output of ``rid`` at once, one token per delta."""
        for i, text in enumerate(deltas):
            last = i == len(deltas) - 1
            await self.outputs.send(
                encode(
                    RequestOutput(
                        rid=rid,
                        text=text,
                        output_ids=[100 + i],
                        output_logprobs=[[-0.5, 100 + i, []]],
                        token_texts={100 + i: text},  # as the router sends them when logprobs are asked
                        finished=last,
                        finish_reason={"type": "length", "length": len(deltas)} if last else None,
                        prompt_tokens=3,
                        completion_tokens=i + 1,
                    )
                )
            )

    def close(self) -> None:
        self.ctx.destroy(linger=0)


async def read_after_everything_arrived(
    client: RouterClient, router: FakeRouterSockets, chunks: AsyncGenerator[dict[str, Any], None], rids: list[str]
) -> list[dict[str, Any]]:
    """Start the stream, let the router send every output of every request, wait until all of
    them sit in the stream's queues, then read the whole stream."""
    first = asyncio.ensure_future(anext(chunks))
    assert [msg.rid for msg in await router.take(len(rids))] == rids
    for rid in rids:
        await router.answer(rid, DELTAS)
    deadline = time.monotonic() + 60
    while client.in_flight and time.monotonic() < deadline:  # each finished request has left the client
        await asyncio.sleep(0.01)
    assert client.in_flight == 0
    return [await first] + [chunk async for chunk in chunks]


def request(rid: str, return_logprob: bool = False) -> GenerateRequest:
    sampling = SamplingParams(max_new_tokens=len(DELTAS))
    return GenerateRequest(rid=rid, sampling=sampling, text="hi", stream=True, return_logprob=return_logprob)


async def run_with_router(tmp_path: Path, body) -> Any:
    router = FakeRouterSockets(tmp_path)
    client = RouterClient(router.request_address, router.output_address)
    await client.start()
    try:
        return await body(client, router)
    finally:
        await client.close()
        router.close()


def test_buffered_chat_deltas_concatenate_to_the_answer_with_one_finish_per_choice(tmp_path: Path) -> None:
    async def body(client: RouterClient, router: FakeRouterSockets) -> list[dict[str, Any]]:
        rids = ["c-0", "c-1"]
        streams = [run_generation(client, request(rid), ApiMetrics()) for rid in rids]
        spec = ChatCompletionIn.model_validate({"messages": [{"role": "user", "content": "hi"}], "n": 2})
        return await read_after_everything_arrived(
            client, router, _chat_chunks(streams, spec, ChatAnswerReader(ChatToolCalls(None)), {}), rids
        )

    chunks = asyncio.run(run_with_router(tmp_path, body))
    for index in (0, 1):
        choices = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(c["delta"].get("content", "") for c in choices) == "".join(DELTAS)
        assert [c["finish_reason"] for c in choices if c["finish_reason"]] == ["length"]


def test_buffered_completion_deltas_and_logprobs_line_up(tmp_path: Path) -> None:
    async def body(client: RouterClient, router: FakeRouterSockets) -> list[dict[str, Any]]:
        streams = [run_generation(client, request("t-0"), ApiMetrics())]
        spec = CompletionIn.model_validate({"prompt": "hi", "logprobs": 0, "stream": True})
        return await read_after_everything_arrived(client, router, _completion_chunks(streams, spec, {}, None), ["t-0"])

    chunks = asyncio.run(run_with_router(tmp_path, body))
    choices = [c["choices"][0] for c in chunks]
    assert [c["text"] for c in choices] == DELTAS
    assert [c["logprobs"]["tokens"] for c in choices] == [[text] for text in DELTAS]
    # each chunk's offset: the characters the choice sent before it
    assert [c["logprobs"]["text_offset"] for c in choices] == [[len("".join(DELTAS[:i]))] for i in range(len(DELTAS))]
    assert [c["finish_reason"] for c in choices] == [None] * (len(DELTAS) - 1) + ["length"]


def test_buffered_native_chunks_grow_one_output_at_a_time(tmp_path: Path) -> None:
    async def body(client: RouterClient, router: FakeRouterSockets) -> list[dict[str, Any]]:
        streams = [run_generation(client, request("n-0", return_logprob=True), ApiMetrics())]
        return await read_after_everything_arrived(client, router, _native_chunks(streams, False), ["n-0"])

    chunks = asyncio.run(run_with_router(tmp_path, body))
    assert [c["text"] for c in chunks] == ["".join(DELTAS[: i + 1]) for i in range(len(DELTAS))]
    assert [len(c["meta_info"]["output_token_logprobs"]) for c in chunks] == list(range(1, len(DELTAS) + 1))
    assert [c["meta_info"]["finish_reason"] is not None for c in chunks] == [False] * (len(DELTAS) - 1) + [True]


def test_a_deadline_aborts_the_request_on_the_router(tmp_path: Path) -> None:
    async def body(client: RouterClient, router: FakeRouterSockets) -> list[Any]:
        stream = run_generation(client, request("d-0"), ApiMetrics(), deadline=time.monotonic() + 0.2)
        with pytest.raises(ApiError) as info:
            async for _ in stream:
                pass  # the router never answers
        assert info.value.status == 504 and "deadline_s" in info.value.message
        return await router.take(2)

    generate, abort = asyncio.run(run_with_router(tmp_path, body))
    assert (type(generate).__name__, type(abort).__name__) == ("GenerateRequest", "AbortRequest")
    assert abort.rid == "d-0"


def test_a_responses_stream_error_event_is_the_sdks_numbered_with_a_string_code() -> None:
    frame = error_frame(504, "past deadline_s", typed=True, path="/v1/responses", sequence_number=7).decode()
    assert frame.startswith("event: error\ndata: ")
    event = ResponseErrorEvent.model_validate_json(frame.split("data: ", 1)[1])
    assert (event.sequence_number, event.code, event.message) == (7, "deadline_exceeded", "past deadline_s")
    assert error_frame(504, "past deadline_s", typed=False).decode().startswith('data: {"error": ')


def test_a_native_stream_with_many_logprobs_skips_events_as_they_grow_and_ends_whole() -> None:
    """Its events are cumulative: past EVERY_EVENT_ENTRIES logprob entries one goes out when they
    have grown by an eighth, so its rendering stays linear in the answer."""
    tokens, top = 1000, 20
    shared: list[list[Any]] = []

    async def growing() -> AsyncIterator[Generation]:
        for i in range(tokens):
            shared.append([-0.5, 7, [[-0.5, 7]] * top])
            yield Generation(
                rid="g",
                return_logprob=True,
                top_logprobs_num=top,
                all_output_logprobs=shared,
                num_output_logprobs=i + 1,
                finished=i == tokens - 1,
            )

    async def read() -> list[dict[str, Any]]:
        return [chunk async for chunk in _native_chunks([growing()], False)]

    chunks = asyncio.run(read())
    counts = [len(c["meta_info"]["output_top_logprobs"]) for c in chunks]
    every = EVERY_EVENT_ENTRIES // (1 + top)
    assert counts[:every] == list(range(1, every + 1))  # one per token until then
    assert len(chunks) < every + 30 and counts[-1] == tokens  # 1,000 without the rule
    assert all(later - earlier >= earlier / 8 for earlier, later in zip(counts[every:], counts[every + 1 : -1]))


def test_an_answer_the_api_cannot_read_fails_its_request_instead_of_leaving_it_waiting(tmp_path: Path) -> None:
    """A router of another version (a field this api does not know): the request it names gets a 500."""

    async def body(client: RouterClient, router: FakeRouterSockets) -> ApiError:
        stream = run_generation(client, request("v-0"), ApiMetrics())
        first = asyncio.ensure_future(anext(stream))
        await router.take(1)
        fields = {"rid": "v-0", "finished": True, "from_a_newer_router": 1}
        await router.outputs.send(msgpack.packb([PROTOCOL_VERSION, "RequestOutput", fields]))
        with pytest.raises(ApiError) as caught:
            await asyncio.wait_for(first, 60)
        return caught.value

    error = asyncio.run(run_with_router(tmp_path, body))
    assert error.status == 500 and "could not read the router's answer" in str(error)
    assert "from_a_newer_router" in str(error)


def test_a_control_call_answered_after_the_step_may_wait_past_a_long_step() -> None:
    """flush_cache, tokenize and the cache calls wait for the step in flight, which a long prefill
    on a loaded host can stretch past the mid-step questions' 10 s: they wait until /health would
    call the step overdue, rather than calling a busy router unavailable."""
    assert control_timeout("health") == control_timeout("stats") == CONTROL_TIMEOUT_S
    for kind in ("flush_cache", "tokenize", "cache_pin"):
        assert control_timeout(kind) == STEP_OVERDUE_S + CONTROL_TIMEOUT_S
