"""The serving benchmark's HTTP driver: streams each request of a workload to a server (native
/generate or OpenAI /v1/completions, token ids in), timing every token as it arrives."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
from tqdm import tqdm

from radixcluster.bench.workloads import Workload
from radixcluster.router.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

BACKENDS = ("radixcluster", "sglang", "vllm", "openai")
NATIVE_BACKENDS = ("radixcluster", "sglang")


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it; times in seconds, ``submit`` from the run's start."""

    conversation: int
    turn: int
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    submit: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    cached_tokens: int | None = None  # None: the server did not say
    # through a gateway: the replica that served it and the cached tokens predicted there
    replica: str | None = None
    predicted_cached_tokens: int | None = None
    error: str | None = None


class _TokenClock:
    """Turns "n new tokens arrived now" into TTFT and per-token inter-token latencies."""

    def __init__(self, record: RequestRecord, start: float) -> None:
        self.record, self.start, self.last = record, start, start

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self.last == self.start:
            self.record.ttft = now - self.start
            n -= 1
        if n:
            # Several tokens in one chunk arrived together: share the gap between them.
            self.record.itl += [(now - self.last) / n] * n
        self.last = now


async def _sse(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> AsyncIterator[dict[str, Any]]:
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}")
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(str(chunk["error"]))
                yield chunk


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BenchClient:
    """Sends one request at a time per call of ``send``; safe to call concurrently."""

    def __init__(self, base_url: str, backend: str, tokenizer: Tokenizer, api_key: str | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {BACKENDS}")
        self.base_url, self.backend, self.tokenizer = base_url.rstrip("/"), backend, tokenizer
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # a server on this machine is reached directly, whatever HTTP_PROXY says (a proxy that never
        # answered held the run for ever: requests have no time limit, a long generation may take hours)
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(None),
            limits=httpx.Limits(max_connections=None),
            trust_env=not _loopback(self.base_url),
        )
        self.model: str | None = None

    async def close(self) -> None:
        await self.http.aclose()

    async def prepare(self) -> None:
        """Learn the served model's name (OpenAI backends need it in every request)."""
        if self.backend not in NATIVE_BACKENDS:
            resp = await self.http.get(f"{self.base_url}/v1/models", headers=self.headers)
            resp.raise_for_status()
            self.model = resp.json()["data"][0]["id"]

    async def flush_cache(self) -> bool:
        """Empty the server's prefix cache; False where it offers no way to (vLLM needs
        VLLM_SERVER_DEV_MODE=1 for /reset_prefix_cache)."""
        path = "/flush_cache" if self.backend in NATIVE_BACKENDS else "/reset_prefix_cache"
        try:
            resp = await self.http.post(f"{self.base_url}{path}", headers=self.headers)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def send(self, record: RequestRecord, output_len: int) -> RequestRecord:
        start = time.perf_counter()
        clock = _TokenClock(record, start)
        try:
            if self.backend in NATIVE_BACKENDS:
                await self._native(record, output_len, clock)
            else:
                await self._openai(record, output_len, clock)
        except (httpx.HTTPError, RuntimeError, KeyError, ValueError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            logger.warning("request %d/%d failed: %s", record.conversation, record.turn, record.error)
        record.latency = time.perf_counter() - start
        return record

    async def _native(self, record: RequestRecord, output_len: int, clock: _TokenClock) -> None:
        body = {
            "input_ids": record.prompt_ids,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
            "stream": True,
        }
        async for chunk in _sse(self.http, f"{self.base_url}/generate", body, self.headers):
            ids = chunk["output_ids"]  # cumulative
            clock.tokens(len(ids) - len(record.output_ids))
            record.output_ids = list(ids)
            meta = chunk["meta_info"]
            record.cached_tokens = meta.get("cached_tokens")
            record.replica = meta.get("replica")
            record.predicted_cached_tokens = meta.get("predicted_cached_tokens")

    async def _openai(self, record: RequestRecord, output_len: int, clock: _TokenClock) -> None:
        body = {
            "model": self.model,
            "prompt": record.prompt_ids,
            "max_tokens": output_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,  # vLLM's extension; others ignore it
        }
        text, got_ids = "", False
        async for chunk in _sse(self.http, f"{self.base_url}/v1/completions", body, self.headers):
            for choice in chunk.get("choices") or ():
                ids = choice.get("token_ids")
                if ids is not None:
                    got_ids = True
                    record.output_ids += ids
                text += choice.get("text") or ""
                clock.tokens(len(ids) if ids is not None else int(bool(choice.get("text"))))
            usage = chunk.get("usage")
            if usage:
                record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                record.replica = usage.get("replica")
                record.predicted_cached_tokens = usage.get("predicted_cached_tokens")
        if not got_ids:
            record.output_ids = self.tokenizer.encode(text, add_special_tokens=False)


def _poisson_starts(n: int, request_rate: float, seed: int) -> list[float]:
    """Arrival times of ``n`` requests at ``request_rate`` per second (all at 0 when inf)."""
    if request_rate == float("inf"):
        return [0.0] * n
    rng, t, starts = random.Random(seed), 0.0, []
    for _ in range(n):
        starts.append(t)
        t += rng.expovariate(request_rate)
    return starts


async def run_workload(
    client: BenchClient,
    workload: Workload,
    request_rate: float = float("inf"),
    max_concurrency: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> tuple[list[RequestRecord], float]:
    """Run every conversation of ``workload``; returns the records in submission order and
    the wall time. Conversations arrive as a Poisson process (those that continue another
    start when it ends); their turns run back to back."""
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    roots = [i for i, c in enumerate(workload.conversations) if c.after is None]
    starts = dict(zip(roots, _poisson_starts(len(roots), request_rate, seed)))
    contexts: dict[int, list[int]] = {}
    done = {i: asyncio.Event() for i in range(len(workload.conversations))}
    records: list[RequestRecord] = []
    bar = tqdm(total=workload.num_requests, disable=not progress, desc=workload.name, unit="req")
    t0 = time.perf_counter()

    async def converse(index: int) -> None:
        conv = workload.conversations[index]
        context: list[int] = []
        if conv.after is not None:
            await done[conv.after].wait()
            context = contexts[conv.after]
        else:
            await asyncio.sleep(max(0.0, starts[index] - (time.perf_counter() - t0)))
        for turn, segment in enumerate(conv.segments):
            record = RequestRecord(index, turn, context + segment)
            if gate is not None:
                await gate.acquire()
            record.submit = time.perf_counter() - t0
            records.append(record)
            try:
                await client.send(record, workload.output_len)
            finally:
                if gate is not None:
                    gate.release()
            bar.update(1)
            context = record.prompt_ids + record.output_ids
        contexts[index] = context
        done[index].set()

    try:
        await asyncio.gather(*(converse(i) for i in range(len(workload.conversations))))
    finally:
        bar.close()
    return records, time.perf_counter() - t0
