"""Pins on a real RadixTree: protected from eviction until unpinned or expired, bounded, and
counted once where pins share a path."""

from __future__ import annotations

import numpy as np
import pytest

from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.pin_table import MAX_PINS, PinRefused, PinTable
from radixcluster.router.cache.radix_tree import RadixTree


def _table(prompts: list[list[int]], max_tokens: int = 100, page_size: int = 1) -> PinTable:
    alloc = PageAllocator(200)
    tree = RadixTree(alloc, page_size)
    for p in prompts:
        tree.insert(np.asarray(p), alloc.alloc(len(p) // page_size))
    return PinTable(tree, max_tokens)


def ids(*tokens: int) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def test_a_pinned_prefix_survives_eviction_until_it_is_unpinned():
    table = _table([[1, 2, 3, 4], [7, 8]])
    pin = table.pin(ids(1, 2, 3, 4, 5, 6), None, ttl_s=10, now=0)
    assert (pin.tokens, pin.prompt_tokens) == (4, 6)  # what is cached of it
    assert table.tree.evict(100) == 2 and table.tree.cached_tokens == 4
    assert table.pinned_tokens() == 4 == table.tree.protected_tokens
    assert table.unpin(ids(1, 2, 3, 4), None) is None  # another prefix than the one pinned
    assert table.unpin(ids(1, 2, 3, 4, 5, 6), None) is pin
    assert table.tree.evict(100) == 4
    table.tree.check_integrity()


def test_pins_expire_at_their_ttl_and_a_repin_restarts_it():
    table = _table([[1, 2, 3], [4, 5, 6]])
    table.pin(ids(1, 2, 3), None, ttl_s=5, now=0)
    table.pin(ids(4, 5, 6), None, ttl_s=1, now=0)
    table.pin(ids(4, 5, 6), None, ttl_s=10, now=0.5)  # restarted: one lock still
    assert table.expire(4.9) == 0 and len(table) == 2
    assert table.expire(5.0) == 1 and table.pinned_tokens() == 3
    assert table.tree.protected_tokens == 3
    assert table.expire(10.5) == 1 and table.tree.protected_tokens == 0
    table.tree.check_integrity()


def test_shared_paths_count_once_and_the_bound_refuses_more():
    table = _table([[1, 2, 3, 4], [1, 2, 3, 9], [5, 6, 7]], max_tokens=6)
    table.pin(ids(1, 2, 3, 4), None, ttl_s=10, now=0)
    table.pin(ids(1, 2, 3, 9), None, ttl_s=10, now=0)
    assert table.pinned_tokens() == 5
    with pytest.raises(PinRefused, match="8 tokens in all, over the 6"):
        table.pin(ids(5, 6, 7), None, ttl_s=10, now=0)
    assert len(table) == 2 and table.tree.protected_tokens == 5
    table.clear()
    assert table.tree.protected_tokens == 0 and table.pinned_tokens() == 0


def test_nothing_cached_and_too_many_pins_are_refused():
    table = _table([[1, 2]], page_size=2)
    with pytest.raises(PinRefused, match="nothing of this prefix is cached"):
        table.pin(ids(3, 4), None, ttl_s=1, now=0)
    with pytest.raises(PinRefused, match="nothing"):
        table.pin(ids(1, 2), "other tenant", ttl_s=1, now=0)
    for i in range(MAX_PINS):
        table.pin(ids(1, 2, i), None, ttl_s=1, now=0)  # distinct prefixes with one cached page
    with pytest.raises(PinRefused, match="unpin one"):
        table.pin(ids(1, 2, 999), None, ttl_s=1, now=0)
    assert table.tree.protected_tokens == 2


def test_a_split_below_a_pin_keeps_it_whole():
    table = _table([[1, 2, 3, 4]])
    pin = table.pin(ids(1, 2, 3, 4), None, ttl_s=10, now=0)
    table.tree.match_prefix(ids(1, 2, 8))  # splits the pinned node after [1, 2]
    assert table.pinned_tokens() == 4 and len(table.pinned_node_ids()) == 2
    assert table.describe(now=4)[0] == {"id": pin.describe(0)["id"], "tokens": 4, "prompt_tokens": 4, "expires_in_s": 6}
    table.expire(10)
    assert table.tree.protected_tokens == 0
    table.tree.check_integrity()
