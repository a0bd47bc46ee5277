"""The seeds' scenario (shared/seeds): two requests with one long common prefix. Time to first
token of the second (prefix cached) against the same request cold (cache flushed), medians.

    python benchmarks/seed_ttft.py --url http://127.0.0.1:30000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import requests

PREFIX = (
    "你是一个资深Python工程师，请回答以下问题：\n\n" + "背景：我们的服务每天处理大量请求，需要低延迟和高吞吐。" * 24
)
QUESTIONS = ["如何实现一个LRU缓存？", "解释一下装饰器的工作原理。"]


def ttft(url: str, text: str) -> tuple[float, int]:
    """Seconds to the first streamed chunk, and the cached tokens the request reported."""
    body = {"text": text, "stream": True, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    start = time.perf_counter()
    first, cached = None, 0
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines(decode_unicode=True):
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first or time.perf_counter() - start
            cached = json.loads(line[6:])["meta_info"]["cached_tokens"]
    return first, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cold, warm = [], []
    for _ in range(args.repeats):
        requests.post(f"{args.url}/flush_cache", timeout=60).raise_for_status()
        t_cold, _ = ttft(args.url, PREFIX + QUESTIONS[1])
        requests.post(f"{args.url}/flush_cache", timeout=60).raise_for_status()
        ttft(args.url, PREFIX + QUESTIONS[0])  # the first request of the pair fills the tree
        t_warm, cached = ttft(args.url, PREFIX + QUESTIONS[1])
        cold.append(t_cold)
        warm.append(t_warm)
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"TTFT cold {c:.3f} s, prefix cached {w:.3f} s ({cached} tokens cached): {c / w:.1f}x faster")


if __name__ == "__main__":
    main()
