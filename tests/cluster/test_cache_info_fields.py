"""What a cache hit is: a request that took at least half of its prompt from the cache, so that
hit_rate reads as the seeds read it (over 70 % when requests share, under 10 % for prompts led
by a random id), and the rates a replica and a gateway derive from the same counters."""

from __future__ import annotations

from radixcluster.cache_info_fields import cache_rates, is_cache_hit


def test_a_hit_takes_half_its_prompt_from_the_cache() -> None:
    assert is_cache_hit(prompt_tokens=33, cached_tokens=23)  # the seed's second resignation letter
    assert is_cache_hit(prompt_tokens=10, cached_tokens=5)
    assert not is_cache_hit(prompt_tokens=24, cached_tokens=4)  # "req_id=<random> question": only "req_id="
    assert not is_cache_hit(prompt_tokens=900, cached_tokens=12)  # a long document behind a short instruction
    assert not is_cache_hit(prompt_tokens=1, cached_tokens=0)


def test_rates_come_from_the_counters_and_the_hits_own_cached_tokens() -> None:
    rates = cache_rates(
        total_requests=10, cache_hits=4, prompt_tokens_total=1000, cached_tokens_total=500, hit_cached_tokens_total=400
    )
    assert rates == {"hit_rate": 0.4, "token_hit_rate": 0.5, "shared_prefix_length_avg": 100.0}
    assert set(cache_rates(0, 0, 0, 0, 0).values()) == {0.0}
