"""Side-by-side serving comparison on this machine, in one run: the same workloads (same token
ids, greedy, fixed output lengths) against radixcluster with and without its radix cache,
vLLM's CPU build with and without prefix caching, and transformers `generate` with static
batching. Every engine gets the same threads.

    .venv/bin/python benchmarks/compare_peers.py [--repeats 3] [--configs ...]

Peers live in their own venvs, created here once (benchmarks/.venv-vllm, benchmarks/.venv-hf).
Writes benchmarks/results/: <configuration>.json (every repeat), table.md (medians over
repeats), compare.png (the median repeat of each), logs/.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import peer_servers as peers

from radixcluster.bench.cli import add_bench_args, build_workload, load_bench_tokenizer, run_bench
from radixcluster.bench.client import RequestRecord
from radixcluster.bench.report import load_results, plot, summarize, write_json
from radixcluster.model_path import embedded_model_path

CONFIGS = ("radixcluster", "radixcluster-no-cache", "vllm-prefix-caching", "vllm-no-prefix-caching", "hf-static-batch")
WORKLOADS = ("shared-prefix", "multi-turn")


def bench_args(workload: str, base_url: str = "", backend: str = "radixcluster", label: str = "") -> argparse.Namespace:
    """The bench's defaults are PEERS.md's workload (8 groups x 4, ~620 + ~24 tokens, 32 new)."""
    parser = argparse.ArgumentParser()
    add_bench_args(parser)
    return parser.parse_args(
        ["--workload", workload, "--base-url", base_url, "--backend", backend, "--label", label, "--no-progress"]
    )


def server_spec(name: str, ns: argparse.Namespace) -> peers.ServerSpec:
    if name == "radixcluster":
        return peers.radixcluster_server(name, ns.threads)
    if name == "radixcluster-no-cache":
        return peers.radixcluster_server(name, ns.threads, "--disable-radix-cache")
    python = peers.ensure_venv(*peers.VLLM_ENV)
    return peers.vllm_server(
        name, python, hf_model_dir(ns), ns.threads, name == "vllm-prefix-caching", ns.out / "vllm-rpc"
    )


def hf_model_dir(ns: argparse.Namespace) -> Path:
    """The float32 Hugging Face directory vLLM needs, converted from the GGUF once."""
    out = ns.out / "hf_model"
    if not (out / "config.json").exists():
        python = peers.ensure_venv(*peers.HF_ENV)
        subprocess.run(
            [str(python), str(peers.HERE / "hf_peer.py"), "convert", str(embedded_model_path()), str(out)],
            check=True,
            env=peers.peer_env(ns.threads),
        )
    return out


def run_server_config(name: str, ns: argparse.Namespace, tokenizer) -> list[dict[str, Any]]:
    spec = server_spec(name, ns)
    results = []
    with peers.running(spec, ns.out / "logs") as url:
        for repeat in range(ns.repeats):
            for workload in ns.workloads:
                result = run_bench(bench_args(workload, url, spec.backend, name), tokenizer)
                result["config"]["repeat"] = repeat
                results.append(result)
                print_progress(result)
    return results


def run_hf(ns: argparse.Namespace, tokenizer) -> list[dict[str, Any]]:
    """transformers in its venv, on the same token ids (the spec file carries them)."""
    python = peers.ensure_venv(*peers.HF_ENV)
    results = []
    for repeat in range(ns.repeats):
        for workload_name in ns.workloads:
            workload = build_workload(bench_args(workload_name), tokenizer)
            spec = {
                "output_len": workload.output_len,
                "conversations": [{"segments": c.segments, "after": c.after} for c in workload.conversations],
            }
            spec_path, out_path = ns.out / f"hf-{workload_name}.spec.json", ns.out / f"hf-{workload_name}.records.json"
            spec_path.write_text(json.dumps(spec))
            subprocess.run(
                [
                    str(python),
                    str(peers.HERE / "hf_peer.py"),
                    "run",
                    str(spec_path),
                    str(out_path),
                    "--gguf",
                    str(embedded_model_path()),
                    "--threads",
                    str(ns.threads),
                    "--batch-size",
                    str(ns.hf_batch_size),
                ],
                check=True,
                env=peers.peer_env(ns.threads),
            )
            data = json.loads(out_path.read_text())
            records = [RequestRecord(**r) for r in data["records"]]
            config = {
                "backend": "transformers",
                "workload": workload.name,
                **workload.params,
                "output_len": workload.output_len,
                "batch_size": ns.hf_batch_size,
                "repeat": repeat,
            }
            result = summarize(records, data["duration_s"], "hf-static-batch", config)
            results.append(result)
            print_progress(result)
    return results


def print_progress(result: dict[str, Any]) -> None:
    s = result["summary"]
    print(
        f"  {s['label']:<24} {result['config']['workload']:<14} repeat {result['config']['repeat']}: "
        f"{s['output_throughput']:.1f} out tok/s, TTFT p50 {s['ttft_s']['p50'] * 1000:.0f} ms, "
        f"cached {s['cached_ratio'] if s['cached_ratio'] is not None else '-'} (ideal {s['ideal_cached_ratio']:.3f})",
        flush=True,
    )


def median_repeat(results: list[dict[str, Any]]) -> dict[str, Any]:
    ranked = sorted(results, key=lambda r: r["summary"]["output_throughput"])
    return ranked[(len(ranked) - 1) // 2]


def _med(results: list[dict[str, Any]], *keys: str) -> float | None:
    values = []
    for r in results:
        value: Any = r["summary"]
        for key in keys:
            value = value[key]
        if value is not None:
            values.append(value)
    return statistics.median(values) if values else None


def markdown_table(groups: dict[tuple[str, str], list[dict[str, Any]]]) -> str:
    rows = [
        "| configuration | workload | repeats | req/s | output tok/s (min–max) | TTFT p50 ms | TTFT p99 ms "
        "| E2E p50 s | cached ratio | ideal ratio | cached / ideal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, workload), results in groups.items():
        tps = [r["summary"]["output_throughput"] for r in results]
        cached, ideal = _med(results, "cached_ratio"), _med(results, "ideal_cached_ratio")
        rows.append(
            f"| {name} | {workload} | {len(results)} | {_med(results, 'request_throughput'):.2f} "
            f"| {statistics.median(tps):.1f} ({min(tps):.1f}–{max(tps):.1f}) | {_med(results, 'ttft_s', 'p50') * 1000:.0f} "
            f"| {_med(results, 'ttft_s', 'p99') * 1000:.0f} | {_med(results, 'e2e_latency_s', 'p50'):.2f} "
            f"| {'–' if cached is None else f'{cached:.3f}'} | {ideal:.3f} | {'–' if cached is None else f'{cached / ideal:.3f}'} |"
        )
    return "\n".join(rows)


def ratios(groups: dict[tuple[str, str], list[dict[str, Any]]], workloads: list[str]) -> str:
    lines = []
    for workload in workloads:
        tput = {name: _med(res, "output_throughput") for (name, w), res in groups.items() if w == workload}
        ours = tput.get("radixcluster")
        for other in ("radixcluster-no-cache", "vllm-prefix-caching", "vllm-no-prefix-caching", "hf-static-batch"):
            if ours and tput.get(other):
                lines.append(f"- {workload}: radixcluster / {other} output throughput = {ours / tput[other]:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="compute threads for every engine")
    parser.add_argument("--hf-batch-size", type=int, default=32, help="transformers: requests per padded batch")
    parser.add_argument("--out", type=Path, default=peers.HERE / "results")
    ns = parser.parse_args()
    ns.out = ns.out.resolve()
    tokenizer = load_bench_tokenizer(None)
    started = time.strftime("%Y-%m-%d %H:%M")
    for name in ns.configs:
        print(f"== {name}", flush=True)
        try:
            results = run_hf(ns, tokenizer) if name == "hf-static-batch" else run_server_config(name, ns, tokenizer)
        except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
            print(f"{name} failed: {exc}", flush=True)
            (ns.out / f"{name}.error.txt").write_text(str(exc))
            continue
        write_json(results, ns.out / f"{name}.json")
        write_report(ns, started)  # after each configuration: a long run can be cut short


def write_report(ns: argparse.Namespace, started: str) -> None:
    """The table and plot of every configuration's latest results in ``ns.out`` (so one
    configuration can be rerun alone with --configs)."""
    saved = [ns.out / f"{name}.json" for name in CONFIGS if (ns.out / f"{name}.json").exists()]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in load_results(saved):
        groups.setdefault((r["summary"]["label"], r["config"]["workload"]), []).append(r)
    report = (
        f"last run started {started}, {ns.threads} threads per engine\n\n{markdown_table(groups)}\n\n"
        f"{ratios(groups, ns.workloads)}\n"
    )
    (ns.out / "table.md").write_text(report)
    plot([median_repeat(res) for res in groups.values()], ns.out / "compare.png")
    print(report, flush=True)


if __name__ == "__main__":
    main()
