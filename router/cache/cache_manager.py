"""Request-level KV bookkeeping over the RadixTree and the PageAllocator: match, admit,
publish computed KV, release. The only code that moves pages between requests and the tree.

A request's page table (``req.pages``), by token range:

| tokens                         | pages owned by | meaning                                       |
|--------------------------------|----------------|-----------------------------------------------|
| [0, tree_len)                  | the tree       | cached; locked through ``req.last_node``      |
| [tree_len, num_computed)       | the request    | computed, not (yet) in the tree: private      |
| [num_computed, len(pages) * P) | the request    | allocated for the step in flight: private     |

On insert, the run [old tree_len, new tree_len) was either new to the tree (the tree takes
the request's pages) or already cached by someone else (the request's pages there are
duplicates: they are freed and the table re-pointed at the tree's pages, which the worker
learns through a page-table delta).
"""

from __future__ import annotations

import numpy as np

from radixcluster.cache_info_fields import CACHE_DISABLED
from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.pin_table import Pin, PinRefused, PinTable
from radixcluster.router.cache.radix_tree import MatchResult, RadixTree
from radixcluster.router.request import Request


class CacheManager:
    def __init__(self, allocator: PageAllocator, tree: RadixTree, enabled: bool, max_pinned_tokens: int = 0) -> None:
        self.allocator = allocator
        self.tree = tree
        self.page_size = tree.page_size
        self.enabled = enabled
        self.pins = PinTable(tree, max_pinned_tokens)

    def available_pages(self) -> int:
        """Pages an admission may use: free now, or freed by evicting unlocked nodes."""
        return self.allocator.num_free + self.tree.evictable_pages

    def match(self, req: Request) -> MatchResult:
        """The reusable cached prefix of ``req`` (mutates the tree: see RadixTree.match_prefix).

        At most ``fill_len - 1`` tokens (the last one is computed so logits exist), and no
        further than the first prompt position whose logprob is still wanted.
        """
        limit = req.fill_len - 1
        if req.input_logprob_next < req.prompt_len:
            limit = min(limit, req.input_logprob_next)
        if not self.enabled or limit < self.page_size:
            return MatchResult(np.zeros(0, dtype=np.int32), 0, self.tree.root)
        return self.tree.match_prefix(req.fill_ids()[:limit], req.cache_salt)

    def pages_for(self, req: Request, new_tokens: int) -> int:
        """Pages to allocate so ``req`` can hold ``new_tokens`` more computed tokens."""
        return -(-(req.num_computed + new_tokens) // self.page_size) - len(req.pages)

    def make_room(self, num_pages: int) -> bool:
        """Evict until ``num_pages`` pages are free; False when even that is not enough."""
        short = num_pages - self.allocator.num_free
        if short > 0:
            self.tree.evict(short * self.page_size)
        return self.allocator.can_alloc(num_pages)

    def start(self, req: Request, match: MatchResult) -> None:
        """Take over a match that the caller already locked: the request's table starts there."""
        self.tree.record_hit(match.node)
        req.last_node = match.node
        req.pages = match.pages.tolist()
        req.tree_len = req.num_computed = match.length
        req.synced_pages = 0

    def grow(self, req: Request, new_tokens: int) -> None:
        """Allocate the pages for ``new_tokens`` more tokens (``make_room`` said yes)."""
        n = self.pages_for(req, new_tokens)
        if n > 0:
            req.pages.extend(self.allocator.alloc(n).tolist())

    def publish(self, req: Request) -> None:
        """Insert the computed KV of ``req`` into the tree and move its lock to the new end.

        Call only after the step that computed it came back.
        """
        if not self.enabled:
            return
        ps = self.page_size
        aligned = req.num_computed // ps * ps
        if aligned <= req.tree_len:
            return
        fill = req.fill_ids()
        result = self.tree.insert(
            fill[:aligned], np.asarray(req.pages[: aligned // ps], dtype=np.int32), req.cache_salt
        )
        tree_pages = result.pages.tolist()
        first = req.tree_len // ps
        mine = req.pages[first : aligned // ps]
        theirs = tree_pages[first:]
        diff = [i for i, (p, q) in enumerate(zip(mine, theirs)) if p != q]
        if diff:
            req.pages[first : aligned // ps] = theirs
            self.allocator.free([mine[i] for i in diff])
            # the worker must read the tree's copies from now on: resend from the first change
            req.synced_pages = min(req.synced_pages, first + diff[0])
        self.tree.lock(result.node)
        self.tree.unlock(req.last_node)
        req.last_node = result.node
        req.tree_len = aligned

    def release(self, req: Request, publish: bool) -> None:
        """Drop the request's hold on the cache: optionally publish its computed KV, unlock
        its path, free its private pages. Tree-owned pages are never freed here."""
        if req.last_node is None:
            return
        if publish:
            self.publish(req)
        self.tree.unlock(req.last_node)
        self.allocator.free(req.pages[req.tree_len // self.page_size :])
        req.last_node = None
        req.pages = []
        req.num_computed = req.tree_len = req.synced_pages = 0

    def private_pages(self, req: Request) -> list[int]:
        return req.pages[req.tree_len // self.page_size :] if req.last_node is not None else []

    # ------------------------------------------------------------ cache control (users' calls)

    def pin(self, tokens: np.ndarray, salt: str | None, ttl_s: float, now: float) -> Pin:
        """Keep the cached part of ``tokens`` from eviction until ``now + ttl_s`` (PinTable.pin)."""
        if not self.enabled:
            raise PinRefused(CACHE_DISABLED)
        return self.pins.pin(tokens, salt, ttl_s, now)

    def unpin(self, tokens: np.ndarray, salt: str | None) -> Pin | None:
        if not self.enabled:
            raise PinRefused(CACHE_DISABLED)
        return self.pins.unpin(tokens, salt)

    def evict_prefix(self, tokens: np.ndarray, salt: str | None) -> int:
        """Free the unlocked runs that start with ``tokens`` (RadixTree.evict_prefix)."""
        if not self.enabled:
            raise PinRefused(CACHE_DISABLED)
        return self.tree.evict_prefix(tokens, salt)
