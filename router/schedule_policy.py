"""The order in which waiting requests are considered for prefill (SGLang's policies).

- ``lpm``: longest cached prefix first (ties keep arrival order); on queues longer than
  ``LPM_MAX_QUEUE`` matching every request costs more than it saves: fcfs.
- ``dfs-weight``: walk the tree heaviest subtree first (weight = waiting requests under it),
  so requests sharing a prefix run back to back.
- ``fcfs``: arrival order; forced when the radix cache is off.
"""

from __future__ import annotations

import numpy as np

from radixcluster.router.cache.cache_manager import CacheManager
from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.radix_tree import RadixTree, TreeNode
from radixcluster.router.request import Request

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs")
LPM_MAX_QUEUE = 128
# a waiting request that shares at least this many not-yet-cached tokens with one admitted
# in the same batch waits a round, so it hits the cache instead of computing them twice
DEDUP_MIN_SHARED_TOKENS = 32


class SchedulePolicy:
    def __init__(self, policy: str, cache: CacheManager) -> None:
        if policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy {policy!r}: choose one of {SCHEDULE_POLICIES}")
        self.policy = policy if cache.enabled else "fcfs"
        self.cache = cache

    @property
    def cache_aware(self) -> bool:
        return self.policy != "fcfs"

    def order(self, waiting: list[Request]) -> list[Request]:
        """``waiting`` in the order admission should try them (a new list)."""
        if self.policy == "fcfs" or len(waiting) > LPM_MAX_QUEUE:
            return list(waiting)
        nodes, lengths = [], []
        for req in waiting:
            match = self.cache.match(req)
            nodes.append(match.node)
            lengths.append(match.length)
        if self.policy == "lpm":
            rank = sorted(range(len(waiting)), key=lambda i: -lengths[i])
            return [waiting[i] for i in rank]
        return _dfs_weight_order(waiting, nodes, self.cache.tree.root)

    def dedup(self) -> InBatchDedup | None:
        """A fresh in-batch dedup tracker for one prefill batch (cache-aware policies only)."""
        return InBatchDedup(self.cache.page_size) if self.cache_aware else None


class InBatchDedup:
    """The prompts admitted into one batch, in a scratch RadixTree (no pages behind it):
    a request sharing enough uncached tokens with one of them waits a round."""

    def __init__(self, page_size: int) -> None:
        self.need = max(DEDUP_MIN_SHARED_TOKENS, page_size)
        self._seen = RadixTree(PageAllocator(1), 1)

    def should_defer(self, req: Request, match_len: int) -> bool:
        fill = req.fill_ids()
        if len(fill) - match_len < self.need:
            return False
        return self._seen.match_prefix(fill, req.cache_salt).length - match_len >= self.need

    def add(self, req: Request) -> None:
        fill = req.fill_ids()
        self._seen.insert(fill, np.zeros(len(fill), dtype=np.int32), req.cache_salt)


def _dfs_weight_order(waiting: list[Request], nodes: list[TreeNode], root: TreeNode) -> list[Request]:
    weight: dict[TreeNode, int] = {}
    at_node: dict[TreeNode, list[Request]] = {}
    for req, node in zip(waiting, nodes):
        at_node.setdefault(node, []).append(req)
        walk: TreeNode | None = node
        while walk is not None:
            weight[walk] = weight.get(walk, 0) + 1
            walk = walk.parent
    order: list[Request] = []
    # post-order: a node's heavier subtrees, then the requests that stop at the node itself
    stack: list[tuple[TreeNode, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.extend(at_node.get(node, ()))
            continue
        stack.append((node, True))
        children = sorted((c for c in node.children.values() if c in weight), key=lambda c: -weight[c])
        stack.extend((c, False) for c in reversed(children))
    return order
