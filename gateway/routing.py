"""The choice of a replica for a request, and the cached tokens it will find there.

Cache-aware: each replica's overlap is the prompt tokens its view (cached, or pending from
requests sent there and not yet computed) already holds, page-aligned, as the router will
match them; the request goes where overlap minus ``load_weight`` x load is highest, or to the
least loaded replica when nowhere holds at least ``min_overlap`` of the prompt. A session
(``X-Session-Id``) stays on its replica while that one is available.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass

from radixcluster.block_hash import prefix_block_hashes
from radixcluster.gateway.config import RoutingTunables
from radixcluster.gateway.prompts import Prompt, RoutedRequest
from radixcluster.gateway.replica import Replica

SESSION_MEMORY = 100_000


class NoReplicaAvailable(RuntimeError):
    """Every replica is down, open-circuited or already tried for this request."""


@dataclass(slots=True)
class Placement:
    """A request on one replica: per prompt its block names (the prompt's full pages, in the
    replica's page size) and the tokens predicted cached there."""

    replica: Replica
    names: list[list[int]]
    predicted: list[int]
    seq: int  # the replica's event number when it was chosen (to tell evictions since)
    synced: bool  # whether the view was in step with the replica then

    @property
    def predicted_total(self) -> int:
        return sum(self.predicted)


class Names:
    """Block names of a request's prompts per page size, computed once per page size (as
    Python ints: the views' sets and counters are looked up by them)."""

    def __init__(self, prompts: list[Prompt]) -> None:
        self.prompts = prompts
        self._by_page: dict[int, list[list[int]]] = {}

    def of(self, page_size: int) -> list[list[int]]:
        found = self._by_page.get(page_size)
        if found is None:
            found = self._by_page[page_size] = [
                prefix_block_hashes(p.ids, page_size, p.salt).tolist() for p in self.prompts
            ]
        return found


def place(replica: Replica, prompts: list[Prompt], names: Names) -> Placement:
    """What ``replica`` would hold for each prompt when the router admits it: earlier prompts
    of the same request count as pending there."""
    view = replica.view
    per_prompt = names.of(view.page_size)
    ours: set[int] = set()
    predicted = []
    for i, (prompt, blocks) in enumerate(zip(prompts, per_prompt)):
        usable = blocks[: prompt.match_limit // view.page_size]
        predicted.append(view.matched(usable, ours) * view.page_size)
        if i + 1 < len(prompts):
            ours.update(blocks)
    return Placement(replica, per_prompt, predicted, view.seq, view.synced)


class ReplicaChooser:
    def __init__(self, tunables: RoutingTunables) -> None:
        self.tunables = tunables
        self._turn = itertools.count()
        self._sessions: OrderedDict[str, Replica] = OrderedDict()

    def choose(
        self, request: RoutedRequest, replicas: list[Replica], session: str | None, tried: set[Replica]
    ) -> Placement:
        candidates = [r for r in replicas if r.available and r not in tried]
        if not candidates:
            raise NoReplicaAvailable("no replica is available" + (f" (tried {len(tried)})" if tried else ""))
        names = Names(request.prompts)
        pinned = self._sessions.get(session) if session else None
        if pinned in candidates:
            chosen = place(pinned, request.prompts, names)
        elif self.tunables.policy == "round-robin":
            chosen = place(candidates[next(self._turn) % len(candidates)], request.prompts, names)
        else:
            chosen = self._cache_aware([place(r, request.prompts, names) for r in candidates], request)
        if session:
            self._sessions[session] = chosen.replica
            self._sessions.move_to_end(session)
            while len(self._sessions) > SESSION_MEMORY:
                self._sessions.popitem(last=False)
        return chosen

    def _cache_aware(self, placements: list[Placement], request: RoutedRequest) -> Placement:
        # ties go to the next replica in turn, so equal replicas share the traffic
        turn = next(self._turn)
        order = {id(p): (i - turn) % len(placements) for i, p in enumerate(placements)}
        usable = sum(p.match_limit for p in request.prompts)
        best = max(p.predicted_total for p in placements)
        if best == 0 or best < self.tunables.min_overlap * usable:
            return min(placements, key=lambda p: (p.replica.load.tokens, order[id(p)]))
        weight = self.tunables.load_weight
        return max(placements, key=lambda p: (p.predicted_total - weight * p.replica.load.tokens, -order[id(p)]))
