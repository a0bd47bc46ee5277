"""PageAllocator: query-then-commit, deterministic order, double frees refused."""

from __future__ import annotations

import numpy as np
import pytest

from radixcluster.router.cache.page_allocator import PageAllocator


def test_alloc_is_deterministic_and_reuses_freed_pages_first() -> None:
    a = PageAllocator(8)
    assert a.alloc(3).tolist() == [0, 1, 2]
    assert a.alloc(2).tolist() == [3, 4]
    a.free([1, 3])
    assert a.num_free == 5
    assert a.alloc(3).tolist() == [1, 3, 5]
    assert sorted(a.free_pages().tolist()) == [6, 7]


def test_query_then_commit() -> None:
    a = PageAllocator(4)
    assert a.can_alloc(4) and not a.can_alloc(5)
    with pytest.raises(MemoryError):
        a.alloc(5)
    assert a.num_free == 4
    pages = a.alloc(4)
    assert pages.dtype == np.int32 and not a.can_alloc(1) and a.can_alloc(0)
    assert a.alloc(0).size == 0


def test_double_free_and_foreign_pages_are_refused_without_damage() -> None:
    a = PageAllocator(4)
    pages = a.alloc(2)
    a.free(pages[:1])
    with pytest.raises(ValueError, match="double free"):
        a.free(pages)
    with pytest.raises(ValueError, match="double free"):
        a.free([1, 1])
    with pytest.raises(ValueError, match="out of range"):
        a.free([4])
    assert a.num_free == 3 and not a.is_free(1) and a.any_free(np.array([0, 1]))
