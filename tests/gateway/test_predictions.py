"""Checking a prediction against the replica's report: exact, or the reason it was not."""

from __future__ import annotations

from radixcluster.gateway.predictions import Report, classify
from radixcluster.gateway.routing import Names, place
from support.tree_replica import prompt


def test_each_gap_gets_its_reason(make_replica) -> None:
    r = make_replica(page_size=4)
    shared = list(range(40))
    r.insert(shared)
    asked = prompt(shared + [1, 2])
    placed = place(r.replica, [asked], Names([asked]))
    assert placed.predicted == [40]
    assert classify(placed, Report([0], 40, 42), 42) == "exact"
    assert classify(placed, Report([0], 36, 44), 42) == "tokenization"  # the router's ids were others
    assert classify(placed, Report([0], 44, 42), 42) == "in_flight"  # more landed before admission
    assert classify(placed, Report([0], 20, 42), 42) == "in_flight"  # less, and nothing evicted
    r.tree.evict(40)
    r.sync()
    assert classify(placed, Report([0], 0, 42), 42) == "evicted"
    r.replica.view.clear()
    stale = place(r.replica, [asked], Names([asked]))
    assert classify(stale, Report([0], 8, 42), 42) == "stale_view"
