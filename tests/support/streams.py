"""Streams against a real server, for the tests that disturb it mid-request (shutdown, a hung
TP group): each stream's events read to the end, and a wait for processes to be gone."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import requests

from radixcluster.process_tree import is_running
from support.api_helpers import GREEDY, TIMEOUT_S
from support.servers import ServerHandle


def stream(server: ServerHandle, text: str, max_new_tokens: int, started: threading.Event) -> list:
    """A native stream's events, read to the end; ``started`` is set at its first event."""
    params = {**GREEDY, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    return sse_stream(server, "/generate", {"text": text, "sampling_params": params, "stream": True}, started)


def sse_stream(server: ServerHandle, path: str, body: dict, started: threading.Event) -> list:
    """The events of the stream ``body`` asks ``path`` for, read to the end (``[DONE]`` as a
    string); ``started`` is set at its first event."""
    events = []
    with requests.post(server.url + path, json=body, headers=server.headers(), stream=True, timeout=TIMEOUT_S) as resp:
        assert resp.status_code == 200, resp.text
        for line in resp.iter_lines(decode_unicode=True):
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
                started.set()
    return events


def finished_normally(events: list) -> bool:
    """The stream ran to its max_new_tokens and closed with [DONE]."""
    return events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"]["type"] == "length"


def started_streams(server: ServerHandle, pool, lengths: list[int]) -> list[concurrent.futures.Future]:
    """Streams of ``lengths`` tokens, each with its first event in before this returns."""
    starts = [threading.Event() for _ in lengths]
    futures = [
        pool.submit(stream, server, f"Stream {i}: count slowly.", n, e) for (i, n), e in zip(enumerate(lengths), starts)
    ]
    for event, future in zip(starts, futures):
        while not event.wait(0.1):
            assert not future.done(), future.result()
    return futures


def wait_gone(pids: set[int], deadline_s: float) -> set[int]:
    end = time.monotonic() + deadline_s
    while (alive := {p for p in pids if is_running(p)}) and time.monotonic() < end:
        time.sleep(0.1)
    return alive
