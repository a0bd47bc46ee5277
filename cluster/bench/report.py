"""The serving benchmark's results: statistics of a run's request records, the summary table,
the JSON file, and a PNG of latency CDFs and throughput for one or several results."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from radixcluster.bench.client import RequestRecord
from radixcluster.bench.workloads import ideal_cached_tokens

PERCENTILES = (50, 90, 99)


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, **{f"p{p}": 0.0 for p in PERCENTILES}}
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), **{f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}}


def summarize(records: list[RequestRecord], duration_s: float, label: str, config: dict[str, Any]) -> dict[str, Any]:
    """A result: the summary (throughput, latency percentiles, cached vs ideal ratio), the
    configuration, and per-request latencies (for CDFs). ``records`` in submission order."""
    ok = [r for r in records if r.error is None]
    prompt_tokens = sum(len(r.prompt_ids) for r in ok)
    output_tokens = sum(len(r.output_ids) for r in ok)
    ideal = sum(ideal_cached_tokens([r.prompt_ids for r in records], [r.output_ids for r in records]))
    total_prompt = sum(len(r.prompt_ids) for r in records)
    reported = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    cached_ratio = sum(reported) / prompt_tokens if reported and prompt_tokens else None
    ideal_ratio = ideal / total_prompt if total_prompt else 0.0
    predicted = [r for r in ok if r.predicted_cached_tokens is not None and r.cached_tokens is not None]
    replicas = Counter(r.replica for r in ok if r.replica is not None)
    summary = {
        "label": label,
        "completed": len(ok),
        "errors": len(records) - len(ok),
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration_s if duration_s else 0.0,
        "output_throughput": output_tokens / duration_s if duration_s else 0.0,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "ttft_s": _stats([r.ttft for r in ok]),
        "itl_s": _stats([x for r in ok for x in r.itl]),
        "e2e_latency_s": _stats([r.latency for r in ok]),
        # None when the server reports no cached tokens (it cannot be told from zero reuse)
        "cached_ratio": cached_ratio,
        # the ideal is one cache that holds everything ever computed (one big replica)
        "ideal_cached_ratio": ideal_ratio,
        "cached_vs_ideal": cached_ratio / ideal_ratio if cached_ratio is not None and ideal_ratio else None,
        # through a gateway: requests per replica, and the share whose cached tokens were predicted exactly
        "replicas": dict(sorted(replicas.items())),
        "predicted_exact_ratio": (
            sum(r.predicted_cached_tokens == r.cached_tokens for r in predicted) / len(predicted) if predicted else None
        ),
    }
    requests = [
        {
            "conversation": r.conversation,
            "turn": r.turn,
            "submit": r.submit,
            "prompt_tokens": len(r.prompt_ids),
            "output_tokens": len(r.output_ids),
            "output_ids": r.output_ids,  # to compare two engines' greedy outputs
            "cached_tokens": r.cached_tokens,
            "predicted_cached_tokens": r.predicted_cached_tokens,
            "replica": r.replica,
            "ttft": r.ttft,
            "latency": r.latency,
            "error": r.error,
        }
        for r in records
    ]
    return {"summary": summary, "config": config, "requests": requests}


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


TABLE_COLUMNS = (
    "configuration",
    "workload",
    "req",
    "req/s",
    "out tok/s",
    "TTFT p50 ms",
    "TTFT p90 ms",
    "TTFT p99 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "E2E p50 s",
    "E2E p99 s",
    "cached",
    "ideal",
    "replicas",
    "pred. exact",
)


def table_row(result: dict[str, Any]) -> list[str]:
    s = result["summary"]
    return [
        s["label"],
        result["config"].get("workload", "?"),
        str(s["completed"]) + (f" ({s['errors']} err)" if s["errors"] else ""),
        _fmt(s["request_throughput"], digits=2),
        _fmt(s["output_throughput"]),
        *(_fmt(s["ttft_s"][f"p{p}"], 1000, 0) for p in PERCENTILES),
        _fmt(s["itl_s"]["p50"], 1000),
        _fmt(s["itl_s"]["p99"], 1000),
        _fmt(s["e2e_latency_s"]["p50"], digits=2),
        _fmt(s["e2e_latency_s"]["p99"], digits=2),
        _fmt(s["cached_ratio"], digits=3),
        _fmt(s["ideal_cached_ratio"], digits=3),
        str(len(s.get("replicas") or {})) if s.get("replicas") else "-",
        _fmt(s.get("predicted_exact_ratio"), digits=3),
    ]


def format_table(results: Sequence[dict[str, Any]], markdown: bool = False) -> str:
    rows = [list(TABLE_COLUMNS), *(table_row(r) for r in results)]
    if markdown:
        lines = ["| " + " | ".join(row) + " |" for row in rows]
        lines.insert(1, "|" + "---|" * len(TABLE_COLUMNS))
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in rows) for i in range(len(TABLE_COLUMNS))]
    return "\n".join(
        "  ".join(cell.rjust(w) if i > 1 else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in rows
    )


def write_json(result: dict[str, Any] | list[dict[str, Any]], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1))


def load_results(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Results from JSON files, each holding one result or a list of them; ValueError naming a
    file that cannot be read or holds no results of `radixcluster bench --output-json`."""
    results: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: cannot read bench results: {exc}") from None
        found = data if isinstance(data, list) else [data]
        if not all(isinstance(r, dict) and {"summary", "config"} <= r.keys() for r in found):
            raise ValueError(f"{path}: not results of `radixcluster bench --output-json`")
        results += found
    return results


def plot(results: Sequence[dict[str, Any]], path: str | Path) -> None:
    """One row per workload: CDFs of TTFT (dashed) and end-to-end latency (solid) per
    configuration, and output throughput per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(r["config"].get("workload", "?") for r in results))
    fig, axes = plt.subplots(
        len(workloads), 2, figsize=(11, 3.6 * len(workloads)), squeeze=False, gridspec_kw={"width_ratios": [3, 2]}
    )
    for (cdf_ax, bar_ax), workload in zip(axes, workloads):
        rows = [r for r in results if r["config"].get("workload", "?") == workload]
        for i, r in enumerate(rows):
            color = f"C{i}"
            done = [q for q in r["requests"] if q["error"] is None]
            for key, style in (("latency", "-"), ("ttft", "--")):
                xs = np.sort([q[key] for q in done])
                cdf_ax.step(
                    xs,
                    np.arange(1, len(xs) + 1) / max(len(xs), 1),
                    style,
                    color=color,
                    where="post",
                    label=r["summary"]["label"] if key == "latency" else None,
                )
        cdf_ax.set(
            xscale="log",
            xlabel="seconds (dashed: TTFT, solid: end-to-end)",
            ylabel="fraction of requests",
            title=f"{workload}: latency CDF",
        )
        cdf_ax.grid(alpha=0.3)
        cdf_ax.legend(fontsize=8)
        labels = [r["summary"]["label"] for r in rows]
        bars = bar_ax.barh(
            labels, [r["summary"]["output_throughput"] for r in rows], color=[f"C{i}" for i in range(len(rows))]
        )
        bar_ax.bar_label(bars, fmt="%.1f", fontsize=8)
        bar_ax.invert_yaxis()
        bar_ax.set(xlabel="output tokens / s", title=f"{workload}: throughput")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
