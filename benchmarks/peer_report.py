"""The peer comparison's report: medians over repeats per (configuration, dtype, workload), the
ratios the issue asks for (radixcluster over vLLM with prefix caching; radix cache on over off),
the greedy outputs the engines agree on, and the machine and its load, as docs/BENCHMARKS.md-ready
markdown."""

from __future__ import annotations

import statistics
from typing import Any

Result = dict[str, Any]
DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16"}
# (numerator, denominator, what the ratio says)
RATIOS = (
    ("radixcluster", "vllm-prefix-caching", "radixcluster / vLLM (prefix caching)"),
    ("radixcluster", "radixcluster-no-cache", "radix cache on / off"),
    ("radixcluster-omp-passive", "radixcluster", "OMP_WAIT_POLICY=PASSIVE / default"),
    ("radixcluster", "vllm-no-prefix-caching", "radixcluster / vLLM (no prefix caching)"),
    ("radixcluster", "hf-static-batch", "radixcluster / transformers"),
)


def group(results: list[Result]) -> dict[tuple[str, str, str], list[Result]]:
    """Results by (configuration, dtype, workload), in first-seen order."""
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        c = r["config"]
        groups.setdefault((c["engine_config"], c["dtype"], c["workload"]), []).append(r)
    return groups


def median_of(results: list[Result], *keys: str) -> float | None:
    values = []
    for r in results:
        value: Any = r["summary"]
        for key in keys:
            value = value[key]
        if value is not None:
            values.append(value)
    return statistics.median(values) if values else None


def _load(results: list[Result]) -> str:
    loads = [float(r["config"]["load_before"].split()[0]) for r in results if r["config"].get("load_before")]
    return f"{min(loads):.1f}–{max(loads):.1f}" if loads else "–"


def results_table(groups: dict[tuple[str, str, str], list[Result]]) -> str:
    rows = [
        "| configuration | dtype | workload | repeats | wall s | output tok/s (min–max) | TTFT p50 ms | ITL p50 ms "
        "| cached / ideal | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, dtype, workload), res in groups.items():
        tps = [r["summary"]["output_throughput"] for r in res]
        cached, ideal = median_of(res, "cached_ratio"), median_of(res, "ideal_cached_ratio")
        rows.append(
            f"| {name} | {DTYPE_NAMES.get(dtype, dtype)} | {workload} | {len(res)} | {median_of(res, 'duration_s'):.2f} "
            f"| {statistics.median(tps):.1f} ({min(tps):.1f}–{max(tps):.1f}) "
            f"| {median_of(res, 'ttft_s', 'p50') * 1000:.0f} | {median_of(res, 'itl_s', 'p50') * 1000:.0f} "
            f"| {'–' if cached is None else f'{cached:.3f}'} / {ideal:.3f} | {_load(res)} |"
        )
    return "\n".join(rows)


def ratios_table(groups: dict[tuple[str, str, str], list[Result]]) -> str:
    """Output-throughput ratios of medians, per dtype and workload, where both sides ran."""
    throughput = {key: median_of(res, "output_throughput") for key, res in groups.items()}
    rows = ["| dtype | workload | ratio of output throughput | value |", "|---|---|---|---|"]
    for dtype, workload in dict.fromkeys((d, w) for _, d, w in groups):
        for top, bottom, what in RATIOS:
            ours, theirs = throughput.get((top, dtype, workload)), throughput.get((bottom, dtype, workload))
            if ours and theirs:
                rows.append(f"| {DTYPE_NAMES.get(dtype, dtype)} | {workload} | {what} | **{ours / theirs:.2f}×** |")
    return "\n".join(rows)


def _outputs(result: Result) -> dict[tuple[int, int], list[int]]:
    return {(q["conversation"], q["turn"]): q.get("output_ids") for q in result["requests"] if q["error"] is None}


def agreement_table(groups: dict[tuple[str, str, str], list[Result]]) -> str:
    """Requests whose greedy output radixcluster and vLLM (prefix caching) gave identically, in
    the first repeat of each (a multi-turn turn diverges once an earlier answer did)."""
    rows = ["| dtype | workload | identical greedy outputs, radixcluster vs vLLM |", "|---|---|---|"]
    for (name, dtype, workload), res in groups.items():
        peer = groups.get(("vllm-prefix-caching", dtype, workload))
        if name != "radixcluster" or not peer:
            continue
        ours, theirs = _outputs(res[0]), _outputs(peer[0])
        same = sum(1 for key, ids in ours.items() if ids is not None and theirs.get(key) == ids)
        rows.append(f"| {DTYPE_NAMES.get(dtype, dtype)} | {workload} | {same} of {len(ours)} |")
    return "\n".join(rows)


def markdown_report(results: list[Result], machine: dict[str, str]) -> str:
    groups = group(results)
    header = (
        f"Machine: {machine['cpu']}; radixcluster {machine['commit']}; {machine['threads']} compute threads per engine; "
        f"run {machine['started']} – {machine['ended']}; load average (1 min) before each measurement "
        f"{_load(results)} (before the run: {machine['load_start']})."
    )
    return "\n\n".join([header, results_table(groups), ratios_table(groups), agreement_table(groups)]) + "\n"
