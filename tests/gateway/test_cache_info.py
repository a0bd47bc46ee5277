"""The gateway's /cache_info merges its replicas' answers (sums, pools included, rates from the
sums, pins with their replica, tenants summed), and a replica named by URL or index is found."""

from __future__ import annotations

import pytest

from radixcluster.gateway.cache_info import merged_cache_info
from radixcluster.gateway.context import named
from radixcluster.router.api.errors import ApiError


def info(
    requests: int, hits: int, prompt: int, cached: int, pins: list[dict], tenants: dict, free_pages: int = 75
) -> dict:
    return {
        "total_requests": requests,
        "cache_hits": hits,
        "prompt_tokens_total": prompt,
        "cached_tokens_total": cached,
        "hit_cached_tokens_total": cached - 10,
        "pinned_tokens": sum(p["tokens"] for p in pins),
        "pins": pins,
        "tenants": tenants,
        "num_pages": 100,
        "free_pages": free_pages,
        "page_size": 16,
    }


def test_counters_sum_rates_follow_pins_are_listed_and_tenants_summed() -> None:
    pin = {"id": "ab", "tokens": 32, "prompt_tokens": 40, "expires_in_s": 9.5}
    alpha = {"requests": 2, "prompt_tokens_total": 80, "cached_tokens_total": 32}
    merged = merged_cache_info(
        {
            "http://a": info(4, 2, 200, 64, [pin], {"alpha": alpha}),
            "http://b": info(6, 1, 300, 36, [], {"alpha": alpha, "beta": {**alpha, "requests": 1}}, free_pages=25),
        }
    )
    assert (merged["total_requests"], merged["cache_hits"], merged["pinned_tokens"]) == (10, 3, 32)
    assert merged["hit_rate"] == 0.3 and merged["token_hit_rate"] == 0.2
    assert merged["shared_prefix_length_avg"] == 80 / 3  # the hits' cached tokens over the hits
    assert merged["pins"] == [{**pin, "replica": "http://a"}]
    assert merged["tenants"] == {
        "alpha": {"requests": 4, "prompt_tokens_total": 160, "cached_tokens_total": 64},
        "beta": {"requests": 1, "prompt_tokens_total": 80, "cached_tokens_total": 32},
    }
    # the pools add up as the counters do
    assert (merged["num_pages"], merged["free_pages"], merged["token_usage"], merged["page_size"]) == (
        200,
        100,
        0.5,
        16,
    )
    empty = merged_cache_info({})
    assert (empty["hit_rate"], empty["pins"], empty["tenants"], empty["token_usage"]) == (0.0, [], {}, 0.0)


def test_a_replica_is_named_by_url_or_index_and_must_be_available(make_replica) -> None:
    a, b = make_replica("http://a:1").replica, make_replica("http://b:2").replica
    replicas = [a, b]
    assert named(replicas, None) is a and named(replicas, "1") is b and named(replicas, "http://b:2/") is b
    a.healthy = False
    assert named(replicas, None) is b
    with pytest.raises(ApiError, match="not available") as down:
        named(replicas, "0")
    assert down.value.status == 503
    with pytest.raises(ApiError, match="no replica 'http://c:3'") as unknown:
        named(replicas, "http://c:3")
    assert unknown.value.status == 404
