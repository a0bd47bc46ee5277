"""The gateway's ``/cache_info``: the replicas' answers merged into one, as if one cache held
them all: the counters and pool pages summed (the rates and the pool's usage recomputed from
the sums), every pin listed with the replica that holds it, each tenant's counters summed over
the replicas."""

from __future__ import annotations

from collections import Counter
from typing import Any

from radixcluster.cache_info_fields import SUMMED_FIELDS, cache_rates, token_usage


def merged_cache_info(infos: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``infos``: each replica's /cache_info by its URL."""
    total: dict[str, Any] = {key: sum(info.get(key, 0) for info in infos.values()) for key in SUMMED_FIELDS}
    total.update(
        cache_rates(
            total["total_requests"],
            total["cache_hits"],
            total["prompt_tokens_total"],
            total["cached_tokens_total"],
            total["hit_cached_tokens_total"],
        )
    )
    total["token_usage"] = token_usage(total["free_pages"], total["num_pages"])
    # the replicas' page size when they share one (they do when started alike), else null
    page_sizes = {info.get("page_size") for info in infos.values()}
    total["page_size"] = page_sizes.pop() if len(page_sizes) == 1 else None
    total["pins"] = [{**pin, "replica": url} for url, info in infos.items() for pin in info.get("pins", [])]
    tenants: dict[str, Counter[str]] = {}
    for info in infos.values():
        for name, counts in (info.get("tenants") or {}).items():
            tenants.setdefault(name, Counter()).update(counts)
    total["tenants"] = {name: dict(counts) for name, counts in sorted(tenants.items())}
    return total
