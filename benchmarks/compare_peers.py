"""Side-by-side serving comparison on this machine, in one run: PEERS.md's workloads (the same
token ids, greedy, fixed output lengths, all requests at once over HTTP; ``--workloads random``
adds prompts that share nothing) against radixcluster with and without its radix cache and
vLLM's CPU build with prefix caching, in float32 and in bfloat16 (every engine in the same
dtype), with the same compute threads each.

    .venv/bin/python benchmarks/compare_peers.py

All servers of one dtype run at the same time and the repeats alternate between them, so the
load of other work hits every engine alike. vLLM lives in benchmarks/.venv-vllm (created once)
and reads a Hugging Face directory converted from the embedded GGUF (once). Writes to --out
(benchmarks/results/): results.json (every repeat, the machine, its load), table.md (the
docs/BENCHMARKS.md section: medians, ratios, greedy agreement), logs/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import peer_report
import peer_servers as peers

from radixcluster.bench.cli import add_bench_args, build_workload, load_bench_tokenizer, run_bench
from radixcluster.bench.client import RequestRecord
from radixcluster.bench.machine import cpu_model, load_average
from radixcluster.bench.report import summarize, write_json
from radixcluster.model_path import embedded_model_path

# configuration -> the radixcluster flags and environment it runs with
RADIXCLUSTER_CONFIGS = {
    "radixcluster": ([], {}),
    "radixcluster-no-cache": (["--disable-radix-cache"], {}),
    "radixcluster-omp-passive": ([], {"OMP_WAIT_POLICY": "PASSIVE"}),
}
VLLM_CONFIGS = {"vllm-prefix-caching": True, "vllm-no-prefix-caching": False}
CONFIGS = (*RADIXCLUSTER_CONFIGS, *VLLM_CONFIGS, "hf-static-batch")
DEFAULT_CONFIGS = ("radixcluster", "radixcluster-no-cache", "vllm-prefix-caching")
WORKLOADS = ("shared-prefix", "multi-turn", "random")
DEFAULT_WORKLOADS = ("shared-prefix", "multi-turn")
DTYPES = ("float32", "bfloat16")


def bench_args(workload: str, base_url: str = "", backend: str = "radixcluster", label: str = "") -> argparse.Namespace:
    """The bench's defaults are PEERS.md's workload (8 groups x 4, ~620 + ~24 tokens, 32 new)."""
    parser = argparse.ArgumentParser()
    add_bench_args(parser)
    return parser.parse_args(
        ["--workload", workload, "--base-url", base_url, "--backend", backend, "--label", label, "--no-progress"]
    )


def server_spec(name: str, dtype: str, ns: argparse.Namespace) -> peers.ServerSpec:
    label = f"{name}-{peer_report.DTYPE_NAMES[dtype]}"
    if name in RADIXCLUSTER_CONFIGS:
        flags, env = RADIXCLUSTER_CONFIGS[name]
        return peers.radixcluster_server(label, ns.threads, dtype, flags, env)
    python = peers.ensure_venv(*peers.VLLM_ENV)
    return peers.vllm_server(
        label, python, hf_model_dir(ns), ns.threads, dtype, VLLM_CONFIGS[name], ns.out / "vllm-rpc"
    )


def hf_model_dir(ns: argparse.Namespace) -> Path:
    """The float32 Hugging Face directory vLLM needs, converted from the GGUF once (with this
    venv's transformers)."""
    out = ns.out / "hf_model"
    if not (out / "config.json").exists():
        command = [sys.executable, str(peers.HERE / "hf_peer.py"), "convert", str(embedded_model_path()), str(out)]
        (ns.out / "logs").mkdir(parents=True, exist_ok=True)
        with (ns.out / "logs" / "hf_convert.log").open("w") as log:
            subprocess.run(command, check=True, env=peers.peer_env(ns.threads), stdout=log, stderr=subprocess.STDOUT)
    return out


def measure(name: str, dtype: str, workload: str, url: str, backend: str, repeat: int, tokenizer) -> dict[str, Any]:
    load_before = load_average()
    result = run_bench(bench_args(workload, url, backend, name), tokenizer)
    result["config"] |= {
        "engine_config": name,
        "dtype": dtype,
        "repeat": repeat,
        "load_before": load_before,
        "load_after": load_average(),
    }
    print_progress(result)
    return result


def run_servers(dtype: str, names: list[str], ns: argparse.Namespace, tokenizer, sink) -> None:
    """Start every server of ``dtype``, then run the repeats round-robin across them."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for name in names:
            spec = server_spec(name, dtype, ns)
            try:
                urls[name] = (stack.enter_context(peers.running(spec, ns.out / "logs")), spec.backend)
            except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
                print(f"{spec.name} failed to start: {exc}", flush=True)
                (ns.out / f"{spec.name}.error.txt").write_text(str(exc))
        for repeat in range(ns.repeats):
            order = list(urls)[repeat % max(len(urls), 1) :] + list(urls)[: repeat % max(len(urls), 1)]
            for name in order:
                url, backend = urls[name]
                for workload in ns.workloads:
                    sink(measure(name, dtype, workload, url, backend, repeat, tokenizer))


def run_hf(ns: argparse.Namespace, tokenizer, sink) -> None:
    """transformers (float32, static batches) in benchmarks/.venv-hf, on the same token ids."""
    python = peers.ensure_venv(*peers.HF_ENV)
    for repeat in range(ns.repeats):
        for workload_name in ns.workloads:
            workload = build_workload(bench_args(workload_name), tokenizer)
            spec = {
                "output_len": workload.output_len,
                "conversations": [{"segments": c.segments, "after": c.after} for c in workload.conversations],
            }
            spec_path, out_path = ns.out / f"hf-{workload_name}.spec.json", ns.out / f"hf-{workload_name}.records.json"
            spec_path.write_text(json.dumps(spec))
            command = [str(python), str(peers.HERE / "hf_peer.py"), "run", str(spec_path), str(out_path)]
            command += ["--gguf", str(embedded_model_path()), "--threads", str(ns.threads), "--batch-size", "32"]
            load_before = load_average()
            subprocess.run(command, check=True, env=peers.peer_env(ns.threads))
            data = json.loads(out_path.read_text())
            config = {
                "backend": "transformers",
                "workload": workload.name,
                **workload.params,
                "output_len": workload.output_len,
                "engine_config": "hf-static-batch",
                "dtype": "float32",
                "repeat": repeat,
                "load_before": load_before,
                "load_after": load_average(),
            }
            records = [RequestRecord(**r) for r in data["records"]]
            result = summarize(records, data["duration_s"], "hf-static-batch", config)
            print_progress(result)
            sink(result)


def print_progress(result: dict[str, Any]) -> None:
    s, c = result["summary"], result["config"]
    print(
        f"  {s['label']:<26} {c['dtype']:<9} {c['workload']:<14} repeat {c['repeat']}: {s['duration_s']:.1f} s, "
        f"{s['output_throughput']:.1f} out tok/s, cached {s['cached_ratio'] if s['cached_ratio'] is not None else '-'} "
        f"(ideal {s['ideal_cached_ratio']:.3f}), load {c['load_before']}",
        flush=True,
    )


def git_commit() -> str:
    """The checked-out commit, ``-dirty`` when the working tree differs from it."""
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=peers.REPO, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(DEFAULT_CONFIGS))
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(DEFAULT_WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="compute threads for every engine")
    parser.add_argument("--out", type=Path, default=peers.HERE / "results")
    ns = parser.parse_args()
    ns.out = ns.out.resolve()
    ns.out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_bench_tokenizer(None)
    machine = {
        "cpu": cpu_model(),
        "commit": git_commit(),
        "threads": str(ns.threads),
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "load_start": load_average(),
    }
    results: list[dict[str, Any]] = []

    def sink(result: dict[str, Any]) -> None:  # saved after every measurement: a long run can be cut short
        results.append(result)
        write_json({"machine": machine, "results": results}, ns.out / "results.json")

    servers = [name for name in ns.configs if name != "hf-static-batch"]
    for dtype in ns.dtypes:
        print(f"== {dtype}: {', '.join(servers)}", flush=True)
        run_servers(dtype, servers, ns, tokenizer, sink)
    if "hf-static-batch" in ns.configs:
        run_hf(ns, tokenizer, sink)
    machine["ended"] = time.strftime("%Y-%m-%d %H:%M")
    write_json({"machine": machine, "results": results}, ns.out / "results.json")
    report = peer_report.markdown_report(results, machine)
    (ns.out / "table.md").write_text(report)
    print(report, flush=True)


if __name__ == "__main__":
    main()
