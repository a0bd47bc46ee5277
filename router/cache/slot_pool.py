"""Rows of the workers' mirrored page tables: one per admitted request, lowest free first."""

from __future__ import annotations

import heapq


class SlotPool:
    def __init__(self, num_slots: int) -> None:
        self._free = list(range(num_slots))  # already a heap

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self) -> int:
        if not self._free:
            raise RuntimeError("no free page-table slot (max_running_requests reached)")
        return heapq.heappop(self._free)

    def free(self, slot: int) -> None:
        heapq.heappush(self._free, slot)
