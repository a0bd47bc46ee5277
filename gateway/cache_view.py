"""What one replica's radix tree holds, as the gateway knows it: the block names its router
announced (exact once synced from a snapshot and then every event in order), plus the blocks
of prompts the gateway sent there that are not computed yet (they will be by the time a
request sharing them is admitted: the router defers a request that shares a long uncached
run with one in its batch)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from radixcluster.protocol import TreeEvent

# block names remembered as evicted, to tell why a request found less cached than predicted
EVICTED_MEMORY = 1 << 20


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
    pending: Counter[int] = field(default_factory=Counter)
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

    def matched(self, names: np.ndarray, also: Counter[int] | None = None) -> int:
        """Leading blocks of ``names`` that are cached or pending (or in ``also``)."""
        if not self.enabled:
            return 0
        n = 0
        for name in names.tolist():
            if name not in self.cached and not self.pending.get(name) and not (also and also.get(name)):
                break
            n += 1
        return n

    def add_pending(self, names: Iterable[int]) -> None:
        if self.enabled:
            self.pending.update(names)

    def remove_pending(self, names: Iterable[int]) -> None:
        if not self.enabled:
            return
        counts = self.pending
        for name in names:
            left = counts[name] - 1
            if left > 0:
                counts[name] = left
            else:
                counts.pop(name)  # dict's own, in C: Counter's __delitem__ is Python

    def evicted_since(self, name: int, seq: int) -> bool:
        """Whether block ``name`` was evicted after event ``seq`` (as far as remembered)."""
        return self.evicted_at.get(name, -1) > seq
