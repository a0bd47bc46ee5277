"""Evictable leaves of the RadixTree in a heap ordered by policy (lru, lfu), lazily invalidated.

Eviction pops the next leaf in O(log n) instead of walking the tree.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

_PRIORITIES: dict[str, Callable[[Any], tuple]] = {
    "lru": lambda node: (node.last_access,),
    "lfu": lambda node: (node.hit_count, node.last_access),
}
EVICTION_POLICIES = tuple(_PRIORITIES)


def is_evictable_leaf(node: Any) -> bool:
    """A live, unlocked, childless, non-root node (the root has no parent and is locked)."""
    return node.parent is not None and not node.lock_ref and not node.children


class EvictionHeap:
    """Entries go stale when a node is touched, locked, gains a child or is removed; only the
    entry whose sequence number the node still carries is live."""

    def __init__(self, policy: str) -> None:
        if policy not in _PRIORITIES:
            raise ValueError(f"eviction_policy {policy!r}: choose one of {EVICTION_POLICIES}")
        self.priority = _PRIORITIES[policy]  # the order of eviction: smallest first
        self._heap: list[tuple] = []
        self._seq = 0

    def push(self, node: Any) -> None:
        """(Re)queue ``node`` with its current priority if it is an evictable leaf."""
        if not is_evictable_leaf(node):
            return
        self._seq += 1
        node.heap_seq = self._seq
        heapq.heappush(self._heap, (self.priority(node), self._seq, node))

    def pop(self) -> Any | None:
        """The evictable leaf to go first, or None."""
        while self._heap:
            _, seq, node = heapq.heappop(self._heap)
            if seq == node.heap_seq and is_evictable_leaf(node):
                return node
        return None

    def needs_rebuild(self, live_nodes: int) -> bool:
        return len(self._heap) > 2 * live_nodes + 1024

    def rebuild(self, nodes: Iterable[Any]) -> None:
        """Drop stale entries: keep one entry per evictable leaf among ``nodes``."""
        self._heap = [(self.priority(n), n.heap_seq, n) for n in nodes if is_evictable_leaf(n)]
        heapq.heapify(self._heap)
