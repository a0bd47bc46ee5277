"""What constrained decoding costs per decode step, side by side with the same step unconstrained.

1. Router only: ``schedule()`` + ``process_result()`` at batch 1/16/64, every request under a
   JSON schema (mask fill + matcher advance) or none, on identical token streams (each request
   is fed the tokens of one valid document, so both runs do the same scheduler work).
2. Worker side: ``apply_vocab_mask`` on float32 logits at the same batch sizes.
3. End to end in one process: the router and the SmolLM2 model runner (what a server's step
   does, minus sockets), decode steps of 16 sampled requests with and without the schema.

    .venv/bin/python benchmarks/bench_grammar.py [--repeats 3] [--skip-model]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import numpy as np

from radixcluster.model_config import load_model_config
from radixcluster.model_path import embedded_model_path
from radixcluster.protocol import ForwardBatch, GenerateRequest, SamplingParams, StepResult
from radixcluster.router.grammar import GrammarCache
from radixcluster.router.request import Request
from radixcluster.router.router_process import Router, RouterConfig
from radixcluster.router.scheduler import Scheduler, SchedulerConfig
from radixcluster.router.text.tokenizer import Tokenizer, load_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "role": {"enum": ["admin", "editor", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
}
# a valid document in the schema's compact layout: the token stream both router runs follow
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "role": "editor",
    "tags": ["math", "poetry", "engines"],
    "address": {"city": "London", "zip": "10001"},
}


def forced_executor(stream: list[int]):
    """Every request's next token is the next token of ``stream``: no model, no sampling."""

    def execute(fwd: ForwardBatch, reqs: list[Request]) -> StepResult:
        tokens = [stream[min(len(r.output_ids), len(stream) - 1)] for r in reqs]
        return StepResult(step_id=fwd.step_id, next_token_ids=np.asarray(tokens, dtype=np.int32))

    return execute


def router_steps(tokenizer: Tokenizer, grammars: GrammarCache | None, batch: int, stream: list[int]) -> float:
    """Mean seconds of schedule() + process_result() over the decode steps of one batch."""
    s = Scheduler(
        SchedulerConfig(
            num_pages=65536, page_size=1, max_running_requests=batch, chunked_prefill_size=65536, max_context_len=4096
        )
    )
    sp = SamplingParams(
        max_new_tokens=len(stream) - 1, ignore_eos=True, json_schema=json.dumps(SCHEMA) if grammars else None
    )
    reqs = [
        Request(
            f"r{i}",
            np.arange(3 + i, 67 + i, dtype=np.int32),
            sp,
            tokenizer.eos_token_ids,
            grammar=grammars.for_request(sp) if grammars else None,
        )
        for i in range(batch)
    ]
    for r in reqs:
        s.add_request(r)
    execute = forced_executor(stream)
    times = []
    while not s.is_idle():
        t0 = time.perf_counter()
        b = s.schedule()
        t1 = time.perf_counter()
        result = execute(b.forward, b.requests)
        t2 = time.perf_counter()
        s.process_result(b, result)
        t3 = time.perf_counter()
        if not b.is_prefill:
            times.append((t1 - t0) + (t3 - t2))
    assert all(r.finish_reason["type"] == "length" for r in reqs), "the document left the grammar"
    return statistics.mean(times)


def bench_router(repeats: int) -> None:
    tokenizer = load_tokenizer(embedded_model_path())
    grammars = GrammarCache(tokenizer, load_model_config(embedded_model_path()).vocab_size)
    stream = tokenizer.encode(json.dumps(DOCUMENT), add_special_tokens=False)
    print(f"router step, {len(stream)}-token JSON document per request (median of {repeats}):")
    print("| batch | unconstrained | JSON schema | overhead per step | per request |")
    print("|---|---|---|---|---|")
    for batch in (1, 16, 64):
        plain, constrained = [], []
        for _ in range(repeats):
            plain.append(router_steps(tokenizer, None, batch, stream))
            constrained.append(router_steps(tokenizer, grammars, batch, stream))
        p, c = statistics.median(plain), statistics.median(constrained)
        print(
            f"| {batch} | {p * 1e6:.0f} µs | {c * 1e6:.0f} µs | {(c - p) * 1e6:.0f} µs | {(c - p) / batch * 1e6:.1f} µs |"
        )


def bench_mask_apply(repeats: int) -> None:
    import torch

    from radixcluster.worker.sampler import apply_vocab_mask

    vocab = load_model_config(embedded_model_path()).vocab_size
    print(f"\nworker: apply_vocab_mask on [B, {vocab}] float32 logits (median of {repeats * 10}):")
    for batch in (1, 16, 64):
        logits = torch.randn(batch, vocab)
        mask = torch.from_numpy(
            np.random.default_rng(0).integers(-(2**31), 2**31, (batch, -(-vocab // 32)), dtype=np.int32)
        )
        times = []
        for _ in range(repeats * 10):
            t0 = time.perf_counter()
            apply_vocab_mask(logits, mask)
            times.append(time.perf_counter() - t0)
        print(f"batch {batch}: {statistics.median(times) * 1e6:.0f} µs")


def bench_model(repeats: int, batch: int = 16, new_tokens: int = 24) -> None:
    from radixcluster.worker.model_runner import ModelRunner, RunnerConfig

    path = embedded_model_path()
    pages = 8192
    runner = ModelRunner(
        RunnerConfig(model_path=path, num_pages=pages, page_size=1, max_slots=batch, max_context_len=2048)
    )
    config = RouterConfig(
        model_path=path, served_model_name="bench", num_pages=pages, page_size=1, context_length=2048,
        max_running_requests=batch, chunked_prefill_size=8192, schedule_policy="fcfs", eviction_policy="lru",
        enable_radix_cache=False, tp_size=1, device="cpu", dtype="float32", max_queued_requests=batch,
    )  # fmt: skip
    router = Router(config)
    # compiled up front: the router compiles a new spec on its own thread, and its first steps
    # would run while the batch still waits for it
    router.grammars.compile("json_schema", json.dumps(SCHEMA))

    def decode_step_s(schema: str | None) -> float:
        for seed in range(batch):
            # the schema's shortest document is longer than new_tokens: the batch stays full
            sp = SamplingParams(max_new_tokens=new_tokens, temperature=0.9, seed=seed, json_schema=schema)
            router.submit(GenerateRequest(rid=uuid.uuid4().hex, sampling=sp, text="A user record as JSON:\n"))
        router.step(runner.step)  # the prefill
        times = []
        while not router.idle():
            t0 = time.perf_counter()
            router.step(runner.step)
            times.append(time.perf_counter() - t0)
        return statistics.mean(times)

    plain, constrained = [], []
    for _ in range(repeats):
        plain.append(decode_step_s(None))
        constrained.append(decode_step_s(json.dumps(SCHEMA)))
    p, c = statistics.median(plain), statistics.median(constrained)
    print(f"\nend to end (router + SmolLM2 on CPU), batch {batch}, {new_tokens} tokens, median of {repeats}:")
    print(f"decode step: unconstrained {p * 1e3:.1f} ms, JSON schema {c * 1e3:.1f} ms (+{(c - p) / p * 100:.1f}%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-model", action="store_true", help="skip the end-to-end measurement")
    args = parser.parse_args()
    bench_router(args.repeats)
    bench_mask_apply(args.repeats)
    if not args.skip_model:
        bench_model(args.repeats)


if __name__ == "__main__":
    main()
