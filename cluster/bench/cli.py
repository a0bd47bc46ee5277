"""`radixcluster bench`: run a workload against a live server and report throughput, latency
and prefix reuse (like SGLang's bench_serving); `radixcluster bench plot` redraws saved results."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any

from radixcluster.bench import workloads as wl
from radixcluster.bench.client import BACKENDS, BenchClient, RequestRecord, run_workload
from radixcluster.bench.report import format_table, load_results, plot, summarize, write_json
from radixcluster.model_path import resolve_model_path
from radixcluster.router.text.tokenizer import Tokenizer, load_tokenizer

WARMUP_TOKENS = 16


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:30000")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="radixcluster",
        help="radixcluster/sglang: native /generate; vllm/openai: /v1/completions",
    )
    parser.add_argument("--api-key", default=None)
    parser.add_argument(
        "--model-path", default=None, help="the tokenizer's model (default: the embedded SmolLM2-135M-Instruct)"
    )
    parser.add_argument("--workload", choices=wl.WORKLOADS, default="shared-prefix")
    parser.add_argument(
        "--groups", type=_above_zero(int), default=8, help="shared-prefix, multi-tenant: distinct prefixes"
    )
    parser.add_argument(
        "--requests-per-group",
        type=_above_zero(int),
        default=4,
        help="shared-prefix, multi-tenant: questions per prefix",
    )
    parser.add_argument(
        "--prefix-len",
        type=_above_zero(int),
        default=620,
        help="tokens of the shared system prompt (shared-prefix, multi-tenant), of each chat's system prompt (multi-turn), of the trunk (fork)",
    )
    parser.add_argument("--question-len", type=_above_zero(int), default=24, help="tokens of each question / user turn")
    parser.add_argument("--conversations", type=_above_zero(int), default=8, help="multi-turn: concurrent chats")
    parser.add_argument(
        "--turns", type=_above_zero(int), default=4, help="multi-turn: user turns per chat (each resends the history)"
    )
    parser.add_argument(
        "--num-prompts", type=_above_zero(int), default=32, help="few-shot and random: prompts; fork: branches"
    )
    parser.add_argument("--num-shots", type=_above_zero(int), default=8, help="few-shot: examples in the shared header")
    parser.add_argument("--shot-len", type=_above_zero(int), default=64, help="few-shot: tokens per example")
    parser.add_argument("--input-len", type=_above_zero(int), default=512, help="random: prompt tokens")
    parser.add_argument(
        "--output-len", type=_above_zero(int), default=32, help="new tokens per request (greedy, ignore_eos)"
    )
    parser.add_argument(
        "--request-rate",
        type=_above_zero(float),
        default=float("inf"),
        help="Poisson arrivals per second; inf: all at once",
    )
    parser.add_argument("--max-concurrency", type=_above_zero(int), default=None, help="most requests in flight")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=_above_zero(int, or_zero=True), default=1, help="untimed requests sent first")
    parser.add_argument(
        "--flush-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="empty the server's prefix cache after the warm-up",
    )
    parser.add_argument(
        "--label", default=None, help="the configuration's name in tables and plots (default: the backend)"
    )
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--output-png", default=None)
    parser.add_argument("--no-progress", action="store_true")
    sub = parser.add_subparsers(dest="bench_command")
    plot_cmd = sub.add_parser("plot", help="plot and tabulate saved results together")
    plot_cmd.add_argument("results", nargs="+", help="JSON files written by --output-json")
    plot_cmd.add_argument("-o", "--output", required=True, help="the PNG to write")


def build_workload(ns: argparse.Namespace, tokenizer: Tokenizer) -> wl.Workload:
    common = dict(output_len=ns.output_len, seed=ns.seed)
    if ns.workload == "shared-prefix":
        return wl.shared_prefix(tokenizer, ns.groups, ns.requests_per_group, ns.prefix_len, ns.question_len, **common)
    if ns.workload == "multi-tenant":
        return wl.multi_tenant(tokenizer, ns.groups, ns.requests_per_group, ns.prefix_len, ns.question_len, **common)
    if ns.workload == "multi-turn":
        return wl.multi_turn(tokenizer, ns.conversations, ns.turns, ns.prefix_len, ns.question_len, **common)
    if ns.workload == "few-shot":
        return wl.few_shot(tokenizer, ns.num_prompts, ns.num_shots, ns.shot_len, ns.question_len, **common)
    if ns.workload == "fork":
        return wl.fork(tokenizer, ns.num_prompts, ns.prefix_len, ns.question_len, **common)
    return wl.random_prompts(tokenizer, ns.num_prompts, ns.input_len, **common)


def load_bench_tokenizer(model_path: str | None) -> Tokenizer:
    return load_tokenizer(resolve_model_path(model_path))


def _above_zero(kind: Callable[[str], float], or_zero: bool = False) -> Callable[[str], float]:
    """An argparse type: ``kind`` of the text, refused unless above 0 (or 0, with ``or_zero``)."""

    def parse(text: str) -> float:
        value = kind(text)
        if not (value > 0 or (or_zero and value == 0)):
            raise argparse.ArgumentTypeError(f"must be {'0 or more' if or_zero else 'above 0'}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


def run_bench(ns: argparse.Namespace, tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """Run the workload ``ns`` describes against ``ns.base_url``; the result of ``summarize``."""
    tokenizer = tokenizer or load_bench_tokenizer(ns.model_path)
    workload = build_workload(ns, tokenizer)
    records, duration = asyncio.run(_bench(BenchClient(ns.base_url, ns.backend, tokenizer, ns.api_key), workload, ns))
    config = {
        "backend": ns.backend,
        "base_url": ns.base_url,
        "workload": workload.name,
        **workload.params,
        "output_len": ns.output_len,
        "request_rate": ns.request_rate,
        "max_concurrency": ns.max_concurrency,
        "seed": ns.seed,
    }
    return summarize(records, duration, ns.label or ns.backend, config)


async def _bench(
    client: BenchClient, workload: wl.Workload, ns: argparse.Namespace
) -> tuple[list[RequestRecord], float]:
    try:
        await client.prepare()
        warm = wl.WordSource(client.tokenizer, seed=ns.seed + 1)
        for _ in range(ns.warmup):
            await client.send(RequestRecord(-1, 0, warm.take(WARMUP_TOKENS)), output_len=4)
        if ns.flush_cache and not await client.flush_cache():
            print(f"note: could not flush the {ns.backend} server's prefix cache")
        return await run_workload(
            client, workload, ns.request_rate, ns.max_concurrency, ns.seed, progress=not ns.no_progress
        )
    finally:
        await client.close()


def main(ns: argparse.Namespace) -> int:
    if ns.bench_command == "plot":
        results = load_results(ns.results)
        print(format_table(results))
        plot(results, ns.output)
        return 0
    result = run_bench(ns)
    print(format_table([result]))
    if ns.output_json:
        write_json(result, ns.output_json)
    if ns.output_png:
        plot([result], ns.output_png)
    return 1 if result["summary"]["completed"] == 0 else 0
