"""The KV page allocator: the only place page indices are handed out (query, then commit).

The KV pool holds ``num_pages`` pages of ``page_size`` tokens; page ``p`` covers token slots
``p * page_size .. p * page_size + page_size - 1``. Order is deterministic: lowest pages first
on a fresh pool, then last-freed first.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class PageAllocator:
    """A free-page stack with a free mask that catches double frees and foreign pages."""

    def __init__(self, num_pages: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        self.num_pages = num_pages
        # the top of the stack is the end of the array: page 0 is handed out first
        self._stack = np.arange(num_pages - 1, -1, -1, dtype=np.int32)
        self._top = num_pages
        self._is_free = np.ones(num_pages, dtype=bool)

    @property
    def num_free(self) -> int:
        return self._top

    def can_alloc(self, n: int) -> bool:
        return 0 <= n <= self._top

    def alloc(self, n: int) -> np.ndarray:
        """Take ``n`` pages (int32, a fresh array). Ask ``can_alloc`` first: too few raises."""
        if not self.can_alloc(n):
            raise MemoryError(f"asked for {n} pages, {self._top} free")
        start = self._top - n
        pages = self._stack[start : self._top][::-1].copy()
        self._top = start
        self._is_free[pages] = False
        return pages

    def free(self, pages: Iterable[int] | np.ndarray) -> None:
        """Return pages to the pool; a page that is already free raises (the pool is unchanged)."""
        arr = np.asarray(pages, dtype=np.int32).reshape(-1)
        if arr.size == 0:
            return
        if arr.min() < 0 or arr.max() >= self.num_pages:
            raise ValueError(f"page index out of range [0, {self.num_pages})")
        if self._is_free[arr].any() or np.unique(arr).size != arr.size:
            raise ValueError("double free: a page is already free or listed twice")
        self._is_free[arr] = True
        # freed pages are reused first, in the order given
        self._stack[self._top : self._top + arr.size] = arr[::-1]
        self._top += arr.size

    def is_free(self, page: int) -> bool:
        return bool(self._is_free[page])

    def any_free(self, pages: np.ndarray) -> bool:
        return bool(self._is_free[np.asarray(pages, dtype=np.int64)].any())

    def free_pages(self) -> np.ndarray:
        """The free pages (a copy), for integrity checks."""
        return self._stack[: self._top].copy()
