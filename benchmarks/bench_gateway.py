"""The latency the gateway adds to a request: one replica with tree events on, a gateway in front
of it, and each request sent straight to the replica and through the gateway, alternating
(which goes first alternates too), so both see the same machine.

A request must cost the replica little and always the same, or the model step's noise on a
busy machine drowns a millisecond: a text prompt (150 words, ~430 tokens, by default; each
request's its own, so nothing is remembered from the last) that the replica's router refuses
for its context length (it was started with --context-length 16, 64 for chats) once it has its ids: sent
straight, it tokenized the text; through the gateway, it took the ids the gateway hands on
(gateway_tokens), as it does with every request. The gateway does all its work on it: reads,
validates and tokenizes the body, names its blocks, places it, forwards it, relays the answer. With --system-words N the requests are chats
whose N-word system prompt they all share (the gateway tokenizes it once) and whose user
message is the request's own prompt.

    .venv/bin/python benchmarks/bench_gateway.py --pairs 300 [--prompt-words 10] [--system-words 150]

Prints the median latency of each path, the median of the per-pair differences, the
gateway's median time from a request's arrival to its forwarding (its /metrics), and the CPU
time the gateway process spent per request: what it adds on an idle machine, where the
latency it adds on a loaded one is mostly waiting for a core at each of its two wake-ups."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.servers import launch_server, wait_replicas  # noqa: E402

# Every prompt has more tokens than this, so the router refuses it once it has its ids; a chat's
# rendered text is longer, and the router refuses a text unread past context x the longest
# token's characters, so chats get a longer context (still far below their tokens).
CONTEXT, CHAT_CONTEXT = 16, 64


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(session: requests.Session, url: str, body: dict) -> float:
    start = time.perf_counter()
    resp = session.post(url, json=body, timeout=120)
    elapsed = time.perf_counter() - start
    assert resp.status_code == 400 and "context length" in resp.text, resp.text
    return elapsed


def histogram_median(metrics_text: str, name: str) -> float:
    """The median of a Prometheus histogram, interpolated within its bucket."""
    buckets, total = [(0.0, 0.0)], 0.0
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_bucket") and 'le="+Inf"' not in line:
            le = float(line.split('le="')[1].split('"')[0])
            buckets.append((le, float(line.rsplit(" ", 1)[1])))
        elif line.startswith(f"{name}_count"):
            total = float(line.rsplit(" ", 1)[1])
    for (lo, below), (hi, upto) in zip(buckets, buckets[1:]):
        if upto >= total / 2:
            return lo + (hi - lo) * (total / 2 - below) / (upto - below)
    return buckets[-1][0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--prompt-words", type=int, default=150)
    parser.add_argument(
        "--system-words",
        type=int,
        default=0,
        help="send chats instead: a system prompt of this many words that every request shares, "
        "then the request's own prompt as the user's message",
    )
    ns = parser.parse_args()
    words = " ".join(f"word{i % 97}" for i in range(ns.prompt_words))
    system = " ".join(f"rule{i % 89}" for i in range(ns.system_words))
    path = "/v1/chat/completions" if ns.system_words else "/generate"

    def body(i: int) -> dict:
        """Request i's body: its prompt is its own (nothing may be remembered from the last)."""
        prompt = f"request {i}: {words}"
        if not ns.system_words:
            return {"text": prompt, "sampling_params": {"max_new_tokens": 1}}
        chat = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        return {"model": "default", "messages": chat, "max_tokens": 1}

    replica_flags = (
        "--kv-events-address",
        "tcp://127.0.0.1:0",
        "--context-length",
        str(CHAT_CONTEXT if ns.system_words else CONTEXT),
    )
    with launch_server(*replica_flags) as replica, requests.Session() as session:
        with launch_server(f"--replica={replica.url}", command="gateway") as gateway:
            wait_replicas(gateway, 1)
            for url in (replica.url, gateway.url):  # warm both paths and their connections
                timed(session, f"{url}{path}", body(-1))
            direct, through = [], []
            pid = gateway.process.pid
            cpu_start, wall_start = cpu_seconds(pid), time.perf_counter()
            for i in range(ns.pairs):
                order = [(replica.url, direct), (gateway.url, through)]
                for url, times in order if i % 2 else order[::-1]:
                    times.append(timed(session, f"{url}{path}", body(i)))
            busy, wall = cpu_seconds(pid) - cpu_start, time.perf_counter() - wall_start
            time.sleep(wall)  # as long again without requests: its health polls and event loop alone
            idle = cpu_seconds(pid) - cpu_start - busy
            routing = histogram_median(
                requests.get(f"{gateway.url}/metrics", timeout=30).text, "radixcluster_gateway_routing_seconds"
            )
    diffs = [g - d for g, d in zip(through, direct)]
    shared = f", after a shared system prompt of {ns.system_words} words" if ns.system_words else ""
    print(f"pairs: {ns.pairs}, prompt: {ns.prompt_words} words{shared}, refused by the replica after tokenizing")
    print(f"direct to the replica: median {statistics.median(direct) * 1e3:.2f} ms")
    print(f"through the gateway:   median {statistics.median(through) * 1e3:.2f} ms")
    print(f"added by the gateway:  median of per-pair differences {statistics.median(diffs) * 1e3:.2f} ms")
    print(f"gateway, arrival to forwarding (read, tokenize, place): median {routing * 1e3:.2f} ms")
    print(f"gateway CPU time per request (idle polling taken out): {(busy - idle) / ns.pairs * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
