"""ReplicaView: follows a real tree's events in order, refuses to guess across a gap or a
restart, skips what a snapshot already holds, and counts prompts in flight as pending."""

from __future__ import annotations

import numpy as np

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
    first_names = prefix_block_hashes(np.asarray(first), PAGE, None)
    assert view.matched(first_names) == 2
    assert view.matched(prefix_block_hashes(np.asarray(second), PAGE, None)) == 4 and len(view.cached) == 4
    gone = int(first_names[2])
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


def test_pending_prompts_count_until_they_end() -> None:
    view = ReplicaView(page_size=PAGE, synced=True)
    names = prefix_block_hashes(np.arange(12), PAGE, "salt")
    view.add_pending(names.tolist())
    view.add_pending(names[:2].tolist())
    assert view.matched(names) == 3
    view.remove_pending(names.tolist())
    assert view.matched(names) == 2
    view.remove_pending(names[:2].tolist())
    assert view.matched(names) == 0 and not view.pending
    view.enabled = False  # a replica without a radix cache holds nothing, pending or not
    view.add_pending(names.tolist())
    assert view.matched(names) == 0
