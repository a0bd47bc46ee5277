"""TreeEventLog: a view built only from the published events equals the tree's snapshot, and
matching a prompt's block names against it gives exactly the tree's own match length (the
gateway's prediction), through inserts, splits, evictions and flushes, with salts and pages."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from radixcluster.block_hash import prefix_block_hashes
from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.radix_tree import RadixTree
from radixcluster.router.tree_events import TreeEventLog

POOL = 400
SALTS = (None, "tenant-a")


def sequences(page_size: int) -> st.SearchStrategy[list[int]]:
    # few distinct blocks, so that sequences share prefixes and nodes split
    blocks = [[0] * page_size, [0] * (page_size - 1) + [1], [2] * page_size, [3] * page_size]
    return st.builds(
        lambda ids, tail: [t for i in ids for t in blocks[i]] + tail,
        st.lists(st.integers(0, len(blocks) - 1), max_size=6),
        st.lists(st.integers(0, 3), max_size=page_size + 1),
    )


def matched_blocks(view: set[int], names: np.ndarray) -> int:
    n = 0
    for name in names.tolist():
        if name not in view:
            break
        n += 1
    return n


def make_machine(page_size: int) -> type[RuleBasedStateMachine]:
    class EventMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.log = TreeEventLog(page_size)
            self.tree = RadixTree(PageAllocator(POOL), page_size, on_event=self.log.on_event)
            self.view: set[int] = set()
            self.seq = 0
            self.queries: list[tuple[list[int], str | None]] = []

        def replay(self) -> None:
            for event in self.log.drain():
                assert (event.instance, event.seq) == (self.log.instance, self.seq + 1)
                self.seq = event.seq
                names = set(event.blocks.tolist())
                if event.kind == "insert":
                    assert not names & self.view, "an insert names a block that was cached already"
                    self.view |= names
                else:
                    assert names <= self.view, "an eviction names a block that was not cached"
                    self.view -= names

        @rule(tokens=sequences(page_size), salt=st.sampled_from(SALTS))
        def insert(self, tokens: list[int], salt: str | None) -> None:
            limit = len(tokens) // page_size * page_size
            if self.tree.allocator.num_free * page_size < limit:
                self.tree.evict(limit)
            if self.tree.allocator.num_free * page_size < limit:
                return
            pages = self.tree.allocator.alloc(limit // page_size)
            result = self.tree.insert(np.asarray(tokens, dtype=np.int32), pages, salt)
            ours = result.prefix_len // page_size
            self.tree.allocator.free([p for p, q in zip(pages[:ours].tolist(), result.pages[:ours].tolist()) if p != q])
            self.queries.append((tokens, salt))
            self.replay()

        @rule(tokens=sequences(page_size), salt=st.sampled_from(SALTS))
        def match(self, tokens: list[int], salt: str | None) -> None:
            self.queries.append((tokens, salt))
            self.tree.match_prefix(np.asarray(tokens, dtype=np.int32), salt)  # may split a node
            self.replay()

        @rule(tokens=st.integers(1, 3 * page_size))
        def evict(self, tokens: int) -> None:
            self.tree.evict(tokens)
            self.replay()

        @rule()
        def flush(self) -> None:
            self.tree.reset()
            self.replay()
            assert self.view == set()

        @invariant()
        def view_equals_the_snapshot(self) -> None:
            snapshot = self.log.snapshot(self.tree.root)
            assert snapshot["seq"] == self.seq
            assert set(snapshot["blocks"].tolist()) == self.view
            assert len(snapshot["blocks"]) * page_size == self.tree.cached_tokens

        @invariant()
        def matching_names_predicts_the_tree(self) -> None:
            for tokens, salt in self.queries[-8:]:
                names = prefix_block_hashes(np.asarray(tokens), page_size, salt)
                expected = self.tree.match_prefix(np.asarray(tokens, dtype=np.int32), salt).length
                assert matched_blocks(self.view, names) * page_size == expected
            self.replay()  # a match splits nodes, which publishes nothing

    return EventMachine


settings_ = settings(max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck))
TestEventsPage1 = make_machine(1).TestCase
TestEventsPage1.settings = settings_
TestEventsPage4 = make_machine(4).TestCase
TestEventsPage4.settings = settings_


def test_salt_and_position_change_every_name() -> None:
    tokens = np.arange(32)
    plain = prefix_block_hashes(tokens, 8, None)
    assert len(plain) == 4 and len(set(plain.tolist())) == 4
    assert set(plain.tolist()).isdisjoint(prefix_block_hashes(tokens, 8, "tenant").tolist())
    assert prefix_block_hashes(tokens, 8, "").tolist() == plain.tolist()  # no salt is the empty salt
    # the same block after another prefix is another block
    shifted = prefix_block_hashes(np.concatenate([[7] * 8, tokens[:8]]), 8, None)
    assert shifted[1] != plain[0]
    assert prefix_block_hashes(tokens[:7], 8, None).size == 0  # no full page, no name


def test_a_restarted_log_is_another_instance() -> None:
    assert TreeEventLog(1).instance != TreeEventLog(1).instance
