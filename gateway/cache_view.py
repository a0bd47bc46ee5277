"""What one replica's radix tree holds, as the gateway knows it: the block names its router
announced (exact once synced from a snapshot and then every event in order), plus the blocks
of prompts the gateway sent there that are not computed yet (they will be by the time a
request sharing them is admitted: the router defers a request that shares a long uncached
run with one in its batch)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np

from radixcluster.protocol import TreeEvent

# block names remembered as evicted, to tell why a request found less cached than predicted
EVICTED_MEMORY = 1 << 20


class PendingBlocks:
    """Block names with how many prompts in flight hold each, kept so that a prompt's start and
    end are set operations in C: ``held`` has every name, ``_more`` only the count beyond one
    of a name that several prompts hold (a prefix they share)."""

    __slots__ = ("held", "_more")

    def __init__(self) -> None:
        self.held: set[int] = set()
        self._more: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self.held)

    def add(self, names: list[int]) -> None:
        again = self.held.intersection(names)
        if again:
            self._more.update(again)
        self.held.update(names)

    def remove(self, names: list[int]) -> None:
        """Undo ``add(names)``."""
        shared = self._more.keys() & names if self._more else None
        if shared:
            for name in shared:
                left = self._more[name] - 1
                if left:
                    self._more[name] = left
                else:
                    del self._more[name]
            self.held.difference_update(set(names) - shared)
        else:
            self.held.difference_update(names)


@dataclass(slots=True)
class ReplicaView:
    """``synced``: ``cached`` equals the replica's tree as of event ``seq`` of ``instance``."""

    page_size: int = 1
    enabled: bool = True  # False: the replica runs without a radix cache
    instance: str | None = None
    seq: int = 0
    synced: bool = False
    resyncs: int = 0
    cached: set[int] = field(default_factory=set)
    pending: PendingBlocks = field(default_factory=PendingBlocks)
    evicted_at: OrderedDict[int, int] = field(default_factory=OrderedDict)

    def load_snapshot(self, instance: str, seq: int, page_size: int, names: np.ndarray) -> None:
        self.instance, self.seq, self.page_size = instance, seq, page_size
        self.cached = set(names.tolist())
        self.synced = True
        self.resyncs += 1

    def clear(self) -> None:
        """Forget what the replica holds (it is down, restarted or out of step)."""
        self.cached = set()
        self.synced = False

    def apply(self, event: TreeEvent) -> bool:
        """Apply the next event; False when it cannot be (another instance, or events were
        lost): the view is cleared and must be synced again. Events the snapshot already
        covered, or that arrive while unsynced, are skipped."""
        if not self.synced:
            return True
        if event.instance != self.instance or event.seq > self.seq + 1:
            self.clear()
            return False
        if event.seq <= self.seq:
            return True
        self.seq = event.seq
        names = event.blocks.tolist()
        if event.kind == "insert":
            self.cached.update(names)
        else:
            self.cached.difference_update(names)
            for name in names:
                self.evicted_at[name] = event.seq
                self.evicted_at.move_to_end(name)
            while len(self.evicted_at) > EVICTED_MEMORY:
                self.evicted_at.popitem(last=False)
        return True

    def matched(self, names: list[int], also: AbstractSet[int] = frozenset()) -> int:
        """Leading blocks of ``names`` that are cached or pending (or in ``also``)."""
        if not self.enabled:
            return 0
        cached, pending = self.cached, self.pending.held
        n = 0
        for name in names:
            if name not in cached and name not in pending and name not in also:
                break
            n += 1
        return n

    def add_pending(self, names: list[int]) -> None:
        if self.enabled:
            self.pending.add(names)

    def remove_pending(self, names: list[int]) -> None:
        if self.enabled:
            self.pending.remove(names)

    def evicted_since(self, name: int, seq: int) -> bool:
        """Whether block ``name`` was evicted after event ``seq`` (as far as remembered)."""
        return self.evicted_at.get(name, -1) > seq
