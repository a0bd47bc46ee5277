"""ReplicaView: follows a real tree's events in order, refuses to guess across a gap or a
restart, skips what a snapshot already holds, and counts prompts in flight as pending, and
answered ones until their event arrives."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixcluster.block_hash import prefix_block_hashes
from radixcluster.gateway.cache_view import ReplicaView
from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.radix_tree import RadixTree
from radixcluster.router.tree_events import TreeEventLog

PAGE = 4


def tree_with_log() -> tuple[RadixTree, TreeEventLog]:
    log = TreeEventLog(PAGE)
    return RadixTree(PageAllocator(256), PAGE, on_event=log.on_event), log


def insert(tree: RadixTree, tokens: list[int]) -> None:
    tree.insert(np.asarray(tokens, dtype=np.int32), tree.allocator.alloc(len(tokens) // PAGE))


def synced(log: TreeEventLog, tree: RadixTree) -> ReplicaView:
    snap = log.snapshot(tree.root)
    view = ReplicaView()
    view.load_snapshot(snap["instance"], snap["seq"], PAGE, snap["blocks"])
    return view


def test_inserts_and_evictions_in_order_give_the_trees_blocks() -> None:
    tree, log = tree_with_log()
    view = synced(log, tree)
    first, second = list(range(16)), list(range(8)) + [99] * 8
    insert(tree, first)
    insert(tree, second)
    tree.evict(8)  # the least recently used leaf: the first run's last 8 tokens
    for event in log.drain():
        assert view.apply(event)
    first_names = prefix_block_hashes(np.asarray(first), PAGE, None).tolist()
    assert view.matched(first_names) == 2
    assert view.matched(prefix_block_hashes(np.asarray(second), PAGE, None).tolist()) == 4 and len(view.cached) == 4
    gone = first_names[2]
    assert view.evicted_since(gone, 0) and not view.evicted_since(gone, log.seq)


def test_a_gap_or_another_instance_clears_the_view_until_it_is_synced_again() -> None:
    tree, log = tree_with_log()
    view = synced(log, tree)
    insert(tree, list(range(8)))
    insert(tree, list(range(20, 28)))
    first, second = log.drain()
    assert view.apply(second) is False  # the first was lost
    assert not view.synced and view.cached == set()
    assert view.apply(first) is True and view.cached == set()  # ignored until synced
    view = synced(log, tree)
    assert len(view.cached) == 4
    restarted = TreeEventLog(PAGE)
    insert(RadixTree(PageAllocator(16), PAGE, on_event=restarted.on_event), list(range(4)))
    (other,) = restarted.drain()
    assert view.apply(other) is False and view.cached == set()


def test_events_a_snapshot_already_holds_are_skipped() -> None:
    tree, log = tree_with_log()
    view = synced(log, tree)
    insert(tree, list(range(8)))
    late = log.drain()  # published before the snapshot, delivered after it
    view = synced(log, tree)
    tree.evict(8)
    for event in [*late, *log.drain()]:
        assert view.apply(event)
    assert view.cached == set()


def answered(view: ReplicaView, names: list[int]) -> None:
    """The prompt was answered, and a poll after that found the view up to date."""
    view.finish_pending(names, 1.0)
    view.observed(view.instance, view.seq, 2.0)


def test_pending_prompts_count_until_they_end() -> None:
    view = ReplicaView(page_size=PAGE, synced=True)
    names = prefix_block_hashes(np.arange(12), PAGE, "salt").tolist()
    view.add_pending(names)
    view.add_pending(names[:2])
    assert view.matched(names) == 3
    answered(view, names)
    assert view.matched(names) == 2 and len(view.pending) == 2
    answered(view, names[:2])
    assert view.matched(names) == 0 and not view.pending
    view.enabled = False  # a replica without a radix cache holds nothing, pending or not
    view.add_pending(names)
    assert view.matched(names) == 0


def test_an_answered_prompt_stays_pending_until_its_event_arrives() -> None:
    """The router publishes a prompt's insert before its answer, but the event can reach the
    gateway after it: a request that follows the answer must still find the prefix there."""
    tree, log = tree_with_log()
    view = synced(log, tree)
    tokens = list(range(12))
    names = prefix_block_hashes(np.asarray(tokens), PAGE, None).tolist()
    view.add_pending(names)
    insert(tree, tokens)  # computed; its event is on its way
    view.finish_pending(names, ended=5.0)
    view.observed(log.instance, log.seq, asked=4.0)  # a poll sent before the answer tells nothing
    view.observed(log.instance, log.seq, asked=6.0)  # one sent after it: wait for event log.seq
    assert view.matched(names) == 3 and view.cached == set()
    for event in log.drain():
        assert view.apply(event)
    assert view.matched(names) == 3 and not view.pending and not view.finished


def test_answered_prompts_are_released_by_a_view_that_waits_for_no_event() -> None:
    tree, log = tree_with_log()
    names = prefix_block_hashes(np.arange(8), PAGE, None).tolist()
    for instance, seq in ((log.instance, None), ("another", 3)):  # no events published; a restart
        view = synced(log, tree)
        view.add_pending(names)
        view.finish_pending(names, ended=1.0)
        view.observed(instance, seq, asked=2.0)
        assert view.matched(names) == 0 and not view.finished
    view = synced(log, tree)
    view.add_pending(names)
    view.add_pending(names)  # a second prompt with them, still in flight
    view.finish_pending(names, ended=1.0)
    view.clear()  # down, or out of step: the snapshot it syncs from again has what landed
    assert view.pending.held == set(names) and not view.finished
    view.finish_pending(names, ended=2.0)  # answered while out of sync
    assert not view.pending


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 6)), max_size=60))
def test_pending_counts_follow_the_prompts_in_flight(steps) -> None:
    """Prompts start and end in any order (each a prefix of one of six chains, so they share
    blocks): the view matches what is in flight, and holds nothing once nothing is."""
    chains = [prefix_block_hashes(np.arange(8) + 100 * c, 1, None).tolist() for c in range(6)]
    view = ReplicaView(synced=True)
    in_flight: list[list[int]] = []
    for start, chain, length in steps:
        if start or not in_flight:
            in_flight.append(chains[chain][:length])
            view.add_pending(in_flight[-1])
        else:
            answered(view, in_flight.pop(chain % len(in_flight)))
        held = Counter(name for names in in_flight for name in names)
        assert len(view.pending) == len(held)
        for names in chains:
            assert view.matched(names) == next((i for i, n in enumerate(names) if n not in held), len(names))
    for names in in_flight:
        answered(view, names)
    assert not view.pending
