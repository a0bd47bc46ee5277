"""The gateway's ``/cache_info``: the replicas' answers merged into one, as if one cache held
them all: the counters summed (the rates recomputed from the sums), every pin listed with the
replica that holds it, each tenant's counters summed over the replicas."""

from __future__ import annotations

from collections import Counter
from typing import Any

# /cache_info keys that add up over replicas
SUMMED = (
    "total_requests",
    "cache_hits",
    "prompt_tokens_total",
    "cached_tokens_total",
    "evicted_tokens_total",
    "tree_nodes",
    "cached_tokens",
    "evictable_tokens",
    "protected_tokens",
    "pinned_tokens",
)


def merged_cache_info(infos: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``infos``: each replica's /cache_info by its URL."""
    total: dict[str, Any] = {key: sum(info.get(key, 0) for info in infos.values()) for key in SUMMED}
    requests, hits = total["total_requests"], total["cache_hits"]
    total["hit_rate"] = hits / requests if requests else 0.0
    total["token_hit_rate"] = (
        total["cached_tokens_total"] / total["prompt_tokens_total"] if total["prompt_tokens_total"] else 0.0
    )
    total["shared_prefix_length_avg"] = total["cached_tokens_total"] / hits if hits else 0.0
    total["pins"] = [{**pin, "replica": url} for url, info in infos.items() for pin in info.get("pins", [])]
    tenants: dict[str, Counter[str]] = {}
    for info in infos.values():
        for name, counts in (info.get("tenants") or {}).items():
            tenants.setdefault(name, Counter()).update(counts)
    total["tenants"] = {name: dict(counts) for name, counts in sorted(tenants.items())}
    return total
