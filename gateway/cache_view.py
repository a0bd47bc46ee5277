"""What one replica's radix tree holds, as the gateway knows it: the block names its router
announced (exact once synced from a snapshot and then every event in order), plus the blocks
of prompts the gateway sent there that are not computed yet (they will be by the time a
request sharing them is admitted: the router defers a request that shares a long uncached
run with one in its batch), or whose answer came before the event that announces them."""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
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
class Finished:
    """A prompt's blocks after its answer (at ``ended``, ``time.monotonic()``): the router
    published their insert before answering, but the event can reach the gateway after the
    answer, so they stay pending until the view has event ``seq``, the router's count in the
    first poll sent after ``ended`` (-1: nothing to wait for)."""

    names: list[int]
    ended: float
    seq: int | None = None


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
    finished: deque[Finished] = field(default_factory=deque)  # in the order they ended
    evicted_at: OrderedDict[int, int] = field(default_factory=OrderedDict)

    def load_snapshot(self, instance: str, seq: int, page_size: int, names: np.ndarray) -> None:
        self.instance, self.seq, self.page_size = instance, seq, page_size
        self.cached = set(names.tolist())
        self.synced = True
        self.resyncs += 1

    def clear(self) -> None:
        """Forget what the replica holds (it is down, restarted or out of step); the snapshot
        it is synced from again has what finished prompts left."""
        self.cached = set()
        self.synced = False
        while self.finished:
            self.pending.remove(self.finished.popleft().names)

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
        self._settle()
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

    def finish_pending(self, names: list[int], ended: float) -> None:
        """The prompt of ``add_pending(names)`` was answered at ``ended`` (``time.monotonic()``);
        its blocks stay pending until the view has the event that announced them (a view out
        of sync waits for none: the snapshot it syncs from will have them)."""
        if not self.enabled:
            return
        if self.synced:
            self.finished.append(Finished(names, ended))
        else:
            self.pending.remove(names)

    def observed(self, instance: str | None, seq: int | None, asked: float) -> None:
        """A poll sent at ``asked`` found the router at event ``seq`` of ``instance``: the
        prompts answered before then are in the tree by that event. A view that does not follow
        this instance's events has nothing to wait for."""
        following = self.synced and seq is not None and instance == self.instance
        for entry in self.finished:
            if entry.ended >= asked:
                break
            if entry.seq is None:
                entry.seq = seq if following else -1
        self._settle()

    def _settle(self) -> None:
        """Release the finished prompts whose event the view has (their ``seq`` grows along
        the queue: polls are sent one after another, and ``clear`` empties it)."""
        finished = self.finished
        while finished and finished[0].seq is not None and finished[0].seq <= self.seq:
            self.pending.remove(finished.popleft().names)

    def evicted_since(self, name: int, seq: int) -> bool:
        """Whether block ``name`` was evicted after event ``seq`` (as far as remembered)."""
        return self.evicted_at.get(name, -1) > seq
