"""The fields of /cache_info that a replica reports and a gateway sums over replicas: the
counters that add up, and the rates derived from them (one formula for both); and what a cache
call on a server without a radix cache is told."""

from __future__ import annotations

CACHE_DISABLED = "the radix cache is disabled (--disable-radix-cache)"

# counters and sizes that add up over replicas
SUMMED_FIELDS = (
    "total_requests",
    "cache_hits",
    "prompt_tokens_total",
    "cached_tokens_total",
    "hit_cached_tokens_total",
    "evicted_tokens_total",
    "tree_nodes",
    "cached_tokens",
    "evictable_tokens",
    "protected_tokens",
    "pinned_tokens",
    "free_pages",
    "num_pages",
)
RATE_FIELDS = ("hit_rate", "token_hit_rate", "shared_prefix_length_avg")


def token_usage(free_pages: int, num_pages: int) -> float:
    """The pool's share that holds tokens, evictable ones included (0.0 for no pool)."""
    return 1.0 - free_pages / num_pages if num_pages else 0.0


def is_cache_hit(prompt_tokens: int, cached_tokens: int) -> bool:
    """A request is a cache hit when the cache gave it at least half of its prompt. The seeds
    read ``hit_rate`` so: over 70 % when requests really share (chat turns, one system prompt),
    under 10 % when a random id leads each prompt, under 20 % for long documents behind one short
    instruction; a request that reused a few tokens every prompt starts with (a chat template's
    header, a "req_id=") is not one."""
    return cached_tokens > 0 and 2 * cached_tokens >= prompt_tokens


def cache_rates(
    total_requests: int,
    cache_hits: int,
    prompt_tokens_total: int,
    cached_tokens_total: int,
    hit_cached_tokens_total: int,
) -> dict[str, float]:
    """The RATE_FIELDS; each 0.0 before its denominator counts anything."""
    return {
        "hit_rate": cache_hits / total_requests if total_requests else 0.0,
        "token_hit_rate": cached_tokens_total / prompt_tokens_total if prompt_tokens_total else 0.0,
        # the cached tokens of the hits, on average
        "shared_prefix_length_avg": hit_cached_tokens_total / cache_hits if cache_hits else 0.0,
    }
