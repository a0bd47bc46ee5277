"""Gateway test cases on real radix trees: a tree whose events feed a gateway Replica's view,
as a router's would, and prompts as the gateway reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from radixcluster.gateway.prompts import Prompt
from radixcluster.gateway.replica import Replica
from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.radix_tree import RadixTree
from radixcluster.router.tree_events import TreeEventLog


@dataclass
class TreeReplica:
    """A real RadixTree whose events feed a gateway Replica's view, as the router's would."""

    page_size: int
    replica: Replica
    log: TreeEventLog = field(init=False)
    tree: RadixTree = field(init=False)

    def __post_init__(self) -> None:
        self.log = TreeEventLog(self.page_size)
        self.tree = RadixTree(PageAllocator(4096), self.page_size, on_event=self.log.on_event)
        snapshot = self.log.snapshot(self.tree.root)
        self.replica.view.load_snapshot(snapshot["instance"], snapshot["seq"], self.page_size, snapshot["blocks"])
        self.replica.healthy = True

    def insert(self, tokens: list[int] | np.ndarray, salt: str | None = None) -> None:
        tokens = np.asarray(tokens, dtype=np.int32)
        pages = self.tree.allocator.alloc(len(tokens) // self.page_size)
        self.tree.insert(tokens, pages, salt)
        self.sync()

    def sync(self) -> None:
        for event in self.log.drain():
            assert self.replica.view.apply(event)

    def cached(self, tokens: list[int] | np.ndarray, salt: str | None = None) -> int:
        """What the router would reuse of a prompt: its tree's match of all but the last token."""
        tokens = np.asarray(tokens, dtype=np.int32)
        return self.tree.match_prefix(tokens[:-1], salt).length


def prompt(tokens: list[int], salt: str | None = None, logprob_start_len: int = -1) -> Prompt:
    """A prompt limited as the router limits its match (see gateway.prompts)."""
    ids = np.asarray(tokens, dtype=np.int64)
    limit = len(ids) - 1 if logprob_start_len < 0 else min(len(ids) - 1, logprob_start_len)
    return Prompt(ids, salt, limit)
