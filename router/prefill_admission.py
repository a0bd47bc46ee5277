"""Builds one prefill batch: which waiting requests fit, how much of each, with which pages.

Budget per step: ``chunked_prefill_size`` tokens, and pages = free + evictable minus what
running decodes (and each newly admitted request) are expected to need. A request's match
is locked before it is budgeted (locking moves it out of "evictable"), then rechecked;
a request that does not fit is unlocked again and admission stops (arrival order holds).
The last admitted request may get only a chunk (ending on a page boundary); the chunked
request continues first in the next prefill batch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from radixcluster.router.cache.cache_manager import CacheManager
from radixcluster.router.request import Request
from radixcluster.router.schedule_policy import InBatchDedup, SchedulePolicy

# the decode reservation of a request counts at most this many of its remaining new tokens
RESERVE_CLIP_TOKENS = 4096


class Admit(enum.Enum):
    ADDED = "added"
    DEFERRED = "deferred"  # skip this request this round, try the next
    STOP = "stop"  # nothing more fits this round


@dataclass(slots=True)
class PrefillEntry:
    req: Request
    prefix_len: int  # tokens already in the KV cache (matched or computed earlier)
    extend_len: int  # tokens computed in this step
    first_admission: bool  # count its match as cached tokens (never after a retraction)


@dataclass(slots=True)
class PrefillAdmission:
    """One prefill batch under construction. ``reserved_pages``: held back for running decodes;
    ``alone``: nothing else holds pages, so the first request skips the reservation test
    (a lone request always fits: ``add_request`` checked it against the whole pool)."""

    cache: CacheManager
    policy: SchedulePolicy
    token_budget: int
    reserved_pages: int
    reserve_ratio: float
    alone: bool
    entries: list[PrefillEntry] = field(default_factory=list)
    dedup: InBatchDedup | None = None

    def __post_init__(self) -> None:
        self.dedup = self.policy.dedup()

    def _chunk(self, prefix_len: int, remaining: int) -> int:
        """Tokens to compute now: all that remain, or a page-aligned chunk of the budget."""
        if remaining <= self.token_budget:
            return remaining
        ps = self.cache.page_size
        return (prefix_len + self.token_budget) // ps * ps - prefix_len

    def _fits(self, pages: int, own_reserve: int) -> bool:
        available = self.cache.available_pages()
        if self.alone and not self.entries:
            return pages <= available
        return pages + own_reserve <= available - self.reserved_pages

    def continue_chunked(self, req: Request) -> bool:
        """Add the next chunk of the request admitted in an earlier step."""
        extend = self._chunk(req.num_computed, req.fill_len - req.num_computed)
        need = self.cache.pages_for(req, extend)
        if extend <= 0 or need > self.cache.available_pages() or not self.cache.make_room(need):
            return False
        self.cache.grow(req, extend)
        self._add(PrefillEntry(req, req.num_computed, extend, first_admission=False))
        if self.dedup is not None:
            self.dedup.add(req)
        return True

    def try_add(self, req: Request) -> Admit:
        """Match, lock, budget, then commit pages to a waiting request (or undo the lock)."""
        match = self.cache.match(req)
        if self.dedup is not None and self.dedup.should_defer(req, match.length):
            return Admit.DEFERRED
        tree = self.cache.tree
        tree.lock(match.node)
        extend = self._chunk(match.length, req.fill_len - match.length)
        ps = self.cache.page_size
        need = -(-(match.length + extend) // ps) - match.length // ps
        own_reserve = self._reserve_pages(req)
        if extend <= 0 or not self._fits(need, own_reserve) or not self.cache.make_room(need):
            tree.unlock(match.node)
            return Admit.STOP
        self.cache.start(req, match)
        self.cache.grow(req, extend)
        self.reserved_pages += own_reserve
        if self.dedup is not None:
            self.dedup.add(req)
        self._add(PrefillEntry(req, match.length, extend, first_admission=not req.admitted_once))
        return Admit.ADDED

    def _add(self, entry: PrefillEntry) -> None:
        self.entries.append(entry)
        self.token_budget -= entry.extend_len

    def _reserve_pages(self, req: Request) -> int:
        return reserve_pages([req], self.reserve_ratio, self.cache.page_size)


def reserve_pages(reqs: list[Request], ratio: float, page_size: int) -> int:
    """Pages expected to be needed by the future decode tokens of ``reqs``."""
    tokens = sum(min(r.sampling.max_new_tokens - len(r.output_ids), RESERVE_CLIP_TOKENS) for r in reqs)
    return -(-int(tokens * ratio) // page_size)
