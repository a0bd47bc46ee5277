"""Router-core micro-benchmarks: RadixTree match+insert on a big tree, one 256-request decode step.

.venv/bin/python benchmarks/bench_router.py [--page-size 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from radixcluster.protocol import SamplingParams, StepResult
from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.radix_tree import RadixTree
from radixcluster.router.request import Request
from radixcluster.router.scheduler import Scheduler, SchedulerConfig


def build_tree(page_size: int, rng: np.random.Generator) -> tuple[RadixTree, list[np.ndarray]]:
    """~1M cached tokens in 10k sequences: 100 shared 2k-token trunks, 10k distinct tails."""
    trunks = [rng.integers(0, 50_000, 2048, dtype=np.int32) for _ in range(100)]
    tree = RadixTree(PageAllocator(1_500_000 // page_size), page_size)
    for i in range(10_000):
        seq = np.concatenate([trunks[i % 100], rng.integers(0, 50_000, 80, dtype=np.int32)])
        m = tree.match_prefix(seq)
        new = tree.allocator.alloc((len(seq) - m.length) // page_size)
        tree.insert(seq, np.concatenate([m.pages, new]))
    return tree, trunks


def bench_match_insert(page_size: int, rounds: int) -> tuple[float, float, int]:
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    tree, trunks = build_tree(page_size, rng)
    build_s = time.perf_counter() - t0
    prompts = [np.concatenate([trunks[i % 100], rng.integers(0, 50_000, 2048, dtype=np.int32)]) for i in range(rounds)]
    match_s = insert_s = 0.0
    for prompt in prompts:
        t0 = time.perf_counter()
        m = tree.match_prefix(prompt[:-1])
        t1 = time.perf_counter()
        assert m.length == 2048
        pages = np.concatenate([m.pages, tree.allocator.alloc((len(prompt) - m.length) // page_size)])
        t2 = time.perf_counter()
        tree.insert(prompt, pages)
        t3 = time.perf_counter()
        match_s += t1 - t0
        insert_s += t3 - t2
    print(f"tree: {tree.cached_tokens:,} tokens in {tree.node_count:,} nodes, built in {build_s:.1f} s")
    return match_s / rounds, insert_s / rounds, tree.cached_tokens


def bench_decode_step(page_size: int, steps: int) -> float:
    cfg = SchedulerConfig(
        num_pages=600_000 // page_size,
        page_size=page_size,
        max_running_requests=256,
        chunked_prefill_size=1 << 20,
        max_context_len=4096,
    )
    sched = Scheduler(cfg)
    rng = np.random.default_rng(1)
    for i in range(256):
        params = SamplingParams(max_new_tokens=1000, ignore_eos=True, temperature=0.7, top_p=0.9)
        sched.add_request(Request(f"r{i}", rng.integers(0, 50_000, 512, dtype=np.int32), params))
    while sched.waiting or sched.prefilling:
        batch = sched.schedule()
        sched.process_result(batch, StepResult(batch.forward.step_id, np.ones(len(batch.requests), np.int32)))
    assert len(sched.running) == 256
    total = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = sched.schedule()
        result = StepResult(batch.forward.step_id, np.full(256, 5, np.int32))
        sched.process_result(batch, result)
        total += time.perf_counter() - t0
        assert not batch.is_prefill and len(batch.requests) == 256
    return total / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    match_s, insert_s, _ = bench_match_insert(args.page_size, args.rounds)
    print(f"match_prefix, 4k-token prompt (2k cached): {match_s * 1e6:.0f} us")
    print(f"insert, 4k-token prompt (2k new): {insert_s * 1e6:.0f} us")
    step_s = bench_decode_step(args.page_size, args.steps)
    print(f"decode step, 256 running requests (schedule + process_result): {step_s * 1e6:.0f} us")


if __name__ == "__main__":
    main()
