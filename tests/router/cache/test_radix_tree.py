"""RadixTree: a stateful property test against a naive per-page model, and one regression
test per prefix-cache bug others shipped (STYLE.md)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from radixcluster.router.cache.page_allocator import PageAllocator
from radixcluster.router.cache.radix_tree import RadixTree, TreeNode

POOL = 300


def node_path(tree: RadixTree, node: TreeNode) -> tuple[str, tuple[int, ...]]:
    parts = []
    while node is not tree.root:
        parts.append(node.key.tolist())
        salt = node.salt
        node = node.parent
    return salt, tuple(t for part in reversed(parts) for t in part)


class NaiveCache:
    """Every cached page-aligned prefix with its page, access time and lock count."""

    def __init__(self, page_size: int) -> None:
        self.ps = page_size
        self.page: dict[tuple, int] = {}
        self.time: dict[tuple, int] = {}
        self.locks: dict[tuple, int] = {}
        self.clock = 0

    def _keys(self, salt: str, tokens: list[int], n: int) -> list[tuple]:
        return [(salt, tuple(tokens[: k * self.ps])) for k in range(1, n // self.ps + 1)]

    def match_len(self, salt: str, tokens: list[int]) -> int:
        n = 0
        for key in self._keys(salt, tokens, len(tokens)):
            if key not in self.page:
                break
            n += self.ps
        return n

    def touch(self, salt: str, tokens: list[int], n: int) -> None:
        self.clock += 1
        for key in self._keys(salt, tokens, n):
            self.time[key] = self.clock

    def is_leaf(self, key: tuple) -> bool:
        salt, toks = key
        return not any(s == salt and len(t) == len(toks) + self.ps and t[: len(toks)] == toks for s, t in self.page)

    def evictable_tokens(self, namespace: str = "") -> int:
        return self.ps * sum(1 for key in self.page if not self.locks.get(key) and key[0].startswith(namespace))

    def tokens(self, namespace: str) -> int:
        return self.ps * sum(1 for key in self.page if key[0].startswith(namespace))


def page_blocks(page_size: int) -> list[list[int]]:
    # blocks that differ only in their last token: matching must stop at a page boundary
    return [[0] * page_size, [0] * (page_size - 1) + [1], [2] * page_size]


@st.composite
def sequences(draw: st.DrawFn, page_size: int) -> list[int]:
    blocks = page_blocks(page_size)
    ids = draw(st.lists(st.integers(0, len(blocks) - 1), min_size=0, max_size=5))
    tail = draw(st.lists(st.integers(0, 3), max_size=page_size + 1))
    return [t for i in ids for t in blocks[i]] + tail


def make_machine(page_size: int, policy: str):
    class TreeMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.alloc = PageAllocator(POOL)
            self.tree = RadixTree(self.alloc, page_size, policy, on_event=self.on_event)
            self.model = NaiveCache(page_size)
            self.handles: list[tuple[TreeNode, str, list[int], int, list[int]]] = []
            self.evicting_in = ""  # the namespace an eviction in progress is limited to

        def on_event(self, kind: str, node: TreeNode) -> None:
            salt, toks = node_path(self.tree, node)
            depth = len(toks) - len(node.key)
            keys = [(salt, toks[: depth + k * page_size]) for k in range(1, len(node.key) // page_size + 1)]
            if kind == "insert":
                return
            assert all(k in self.model.page and not self.model.locks.get(k) for k in keys), (
                "evicted a locked or unknown run"
            )
            assert self.model.is_leaf(keys[-1]), "evicted a node that is not a leaf"
            if policy == "lru":
                oldest = min(
                    self.model.time[k]
                    for k in self.model.page
                    if not self.model.locks.get(k) and self.model.is_leaf(k) and k[0].startswith(self.evicting_in)
                )
                assert self.model.time[keys[-1]] == oldest, "eviction is not LRU"
            for k in keys:
                del self.model.page[k], self.model.time[k]

        @rule(seq=sequences(page_size), salt=st.sampled_from(["", "tenant"]))
        def insert(self, seq: list[int], salt: str) -> None:
            n = len(seq) // page_size
            if not self.alloc.can_alloc(n):
                self.tree.evict((n - self.alloc.num_free) * page_size)
            if not self.alloc.can_alloc(n):
                return
            pages = self.alloc.alloc(n)
            before = self.model.match_len(salt, seq)
            result = self.tree.insert(np.array(seq, dtype=np.int32), pages, salt)
            assert result.prefix_len == before
            assert len(result.pages) == n
            dup = [p for p, q in zip(pages.tolist(), result.pages.tolist()) if p != q]
            assert len(dup) == before // page_size
            self.alloc.free(dup)
            for k, key in enumerate(self.model._keys(salt, seq, len(seq))):
                self.model.page.setdefault(key, int(pages[k]))
                assert self.model.page[key] == result.pages[k]
            self.model.touch(salt, seq, len(seq))

        def _match(self, seq: list[int], salt: str):
            result = self.tree.match_prefix(np.array(seq, dtype=np.int32), salt)
            expect = self.model.match_len(salt, seq)
            assert result.length == expect
            keys = self.model._keys(salt, seq, expect)
            assert result.pages.tolist() == [self.model.page[k] for k in keys]
            assert not self.alloc.any_free(result.pages)
            assert (result.node is self.tree.root) == (expect == 0)
            self.model.touch(salt, seq, expect)
            return result, keys

        @rule(seq=sequences(page_size), salt=st.sampled_from(["", "tenant"]))
        def match(self, seq: list[int], salt: str) -> None:
            self._match(seq, salt)

        @rule(seq=sequences(page_size), salt=st.sampled_from(["", "tenant"]))
        def match_and_lock(self, seq: list[int], salt: str) -> None:
            result, keys = self._match(seq, salt)
            self.tree.lock(result.node)
            for k in keys:
                self.model.locks[k] = self.model.locks.get(k, 0) + 1
            self.handles.append((result.node, salt, seq, result.length, result.pages.tolist()))

        @precondition(lambda self: self.handles)
        @rule(data=st.data())
        def unlock(self, data: st.DataObject) -> None:
            i = data.draw(st.integers(0, len(self.handles) - 1))
            node, salt, seq, n, _ = self.handles.pop(i)
            self.tree.unlock(node)
            for k in self.model._keys(salt, seq, n):
                self.model.locks[k] -= 1

        @rule(tokens=st.integers(0, 60))
        def evict(self, tokens: int) -> None:
            evictable = self.tree.evictable_tokens
            freed = self.tree.evict(tokens)
            assert freed >= min(tokens, evictable)

        @rule(tokens=st.integers(0, 60), namespace=st.sampled_from(["", "t", "x"]))
        def evict_namespace(self, tokens: int, namespace: str) -> None:
            evictable = self.model.evictable_tokens(namespace)
            outside = self.tree.cached_tokens - self.tree.namespace_tokens(namespace)
            self.evicting_in = namespace
            freed = self.tree.evict_namespace(namespace, tokens)
            self.evicting_in = ""
            assert freed >= min(tokens, evictable)
            assert self.tree.cached_tokens - self.tree.namespace_tokens(namespace) == outside, "evicted outside"

        @invariant()
        def consistent(self) -> None:
            owned = self.tree.check_integrity()
            assert self.alloc.num_free + len(owned) == POOL
            assert (
                self.tree.evictable_tokens + self.tree.protected_tokens + self.alloc.num_free * page_size
                == POOL * page_size
            )
            assert self.tree.evictable_tokens == self.model.evictable_tokens()
            assert self.tree.cached_tokens == page_size * len(self.model.page)
            assert self.tree.namespace_tokens("t") == self.model.tokens("t")
            for node, _, _, _n, pages in self.handles:
                assert self.tree.path_pages(node).tolist() == pages, "a locked match's pages changed"

    return TreeMachine


_SETTINGS = settings(
    max_examples=100, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTreePage1 = make_machine(1, "lru").TestCase
TestTreePage1.settings = _SETTINGS
TestTreePage16 = make_machine(16, "lru").TestCase
TestTreePage16.settings = _SETTINGS
TestTreeLfu = make_machine(4, "lfu").TestCase
TestTreeLfu.settings = settings(_SETTINGS, max_examples=30)


# ---------------------------------------------------------------- regressions


def tree_with(page_size: int = 1, pool: int = 64, policy: str = "lru") -> tuple[RadixTree, PageAllocator]:
    alloc = PageAllocator(pool)
    return RadixTree(alloc, page_size, policy), alloc


def put(tree: RadixTree, alloc: PageAllocator, tokens: list[int], salt: str = "") -> np.ndarray:
    pages = alloc.alloc(len(tokens) // tree.page_size)
    result = tree.insert(np.array(tokens, dtype=np.int32), pages, salt)
    alloc.free([p for p, q in zip(pages, result.pages) if p != q])
    return result.pages


def test_lock_protects_the_matched_node_not_just_its_parent() -> None:
    tree, alloc = tree_with()
    put(tree, alloc, [1, 2, 3])
    put(tree, alloc, [1, 2, 3, 4, 5, 6])
    m = tree.match_prefix(np.array([1, 2, 3, 4, 5, 6, 7], dtype=np.int32))
    assert m.length == 6
    tree.lock(m.node)
    assert tree.protected_tokens == 6
    tree.evict(1000)
    assert tree.match_prefix(np.array([1, 2, 3, 4, 5, 6], dtype=np.int32)).pages.tolist() == m.pages.tolist()
    assert not alloc.any_free(m.pages)
    tree.unlock(m.node)
    assert tree.evict(1000) == 6 and alloc.num_free == 64


def test_match_returns_the_deepest_node_not_the_root() -> None:
    tree, alloc = tree_with()
    pages = put(tree, alloc, [1, 2, 3, 4])
    m = tree.match_prefix(np.array([1, 2, 3, 4, 5], dtype=np.int32))
    assert m.node is not tree.root and m.length == 4
    assert tree.path_pages(m.node).tolist() == pages.tolist()
    miss = tree.match_prefix(np.array([9, 9], dtype=np.int32))
    assert miss.node is tree.root and miss.length == 0 and miss.pages.size == 0
    tree.lock(miss.node)
    tree.unlock(miss.node)
    assert tree.protected_tokens == 0 and tree.evictable_tokens == 4


def test_split_keeps_evictable_and_protected_exact() -> None:
    tree, alloc = tree_with()
    put(tree, alloc, [1, 2, 3, 4, 5, 6])
    full = tree.match_prefix(np.array([1, 2, 3, 4, 5, 6], dtype=np.int32))
    tree.lock(full.node)
    short = tree.match_prefix(np.array([1, 2, 9], dtype=np.int32))  # splits a locked node
    assert short.length == 2 and short.node.lock_ref == 1
    tree.lock(short.node)
    tree.unlock(full.node)
    assert (tree.evictable_tokens, tree.protected_tokens) == (4, 2)
    tree.check_integrity()
    tree.unlock(short.node)
    assert (tree.evictable_tokens, tree.protected_tokens) == (6, 0)
    assert tree.evict(100) == 6 and tree.evictable_tokens == 0
    tree.check_integrity()


def test_cached_values_never_alias_a_reused_table_row() -> None:
    tree, alloc = tree_with(page_size=2)
    table = np.zeros((2, 8), dtype=np.int32)  # like a per-slot page table that gets reused
    table[0, :3] = alloc.alloc(3)
    tokens = np.array([5, 6, 7, 8, 9, 10], dtype=np.int32)
    tree.insert(tokens, table[0, :3])
    cached = table[0, :3].tolist()
    table[0, :] = -7  # the slot is reused by another request
    tokens[:] = 0  # and the caller's token buffer too
    m = tree.match_prefix(np.array([5, 6, 7, 8, 9, 10, 11], dtype=np.int32))
    assert m.length == 6 and m.pages.tolist() == cached
    m.pages[:] = -1  # a match result is the caller's copy
    short = tree.match_prefix(np.array([5, 6, 7, 8, 1], dtype=np.int32))  # split
    assert short.pages.tolist() == cached[:2]
    assert tree.match_prefix(np.array([5, 6, 7, 8, 9, 10, 0], dtype=np.int32)).pages.tolist() == cached


def test_matching_stops_at_the_last_full_page() -> None:
    tree, alloc = tree_with(page_size=4)
    put(tree, alloc, list(range(8)))
    assert tree.match_prefix(np.arange(7, dtype=np.int32)).length == 4
    assert tree.match_prefix(np.array([0, 1, 2, 3, 4, 5, 6, 99], dtype=np.int32)).length == 4
    zero = tree.match_prefix(np.arange(3, dtype=np.int32))  # truncated to no page at all
    assert zero.length == 0 and zero.node is tree.root and zero.pages.size == 0
    assert tree.insert(np.arange(3, dtype=np.int32), np.zeros(0, dtype=np.int32)).node is tree.root


def test_salt_separates_tenants() -> None:
    tree, alloc = tree_with()
    put(tree, alloc, [1, 2, 3], salt="a")
    assert tree.match_prefix(np.array([1, 2, 3, 4], dtype=np.int32), "b").length == 0
    assert tree.match_prefix(np.array([1, 2, 3, 4], dtype=np.int32)).length == 0
    assert tree.match_prefix(np.array([1, 2, 3, 4], dtype=np.int32), "a").length == 3


def test_lru_evicts_the_least_recently_used_leaf_first() -> None:
    tree, alloc = tree_with()
    put(tree, alloc, [1, 1])
    put(tree, alloc, [2, 2])
    put(tree, alloc, [3, 3])
    tree.match_prefix(np.array([1, 1, 0], dtype=np.int32))
    tree.evict(2)
    assert tree.match_prefix(np.array([2, 2, 0], dtype=np.int32)).length == 0
    assert tree.match_prefix(np.array([1, 1, 0], dtype=np.int32)).length == 2
    assert tree.match_prefix(np.array([3, 3, 0], dtype=np.int32)).length == 2


def test_unknown_eviction_policy_and_double_unlock_are_refused() -> None:
    with pytest.raises(ValueError, match="eviction_policy"):
        RadixTree(PageAllocator(4), 1, "fifo")
    tree, alloc = tree_with()
    put(tree, alloc, [1, 2])
    m = tree.match_prefix(np.array([1, 2, 3], dtype=np.int32))
    tree.lock(m.node)
    tree.unlock(m.node)
    with pytest.raises(RuntimeError, match="not locked"):
        tree.unlock(m.node)


def test_lfu_counts_admissions_not_the_matches_that_order_the_queue() -> None:
    tree, alloc = tree_with(policy="lfu")
    put(tree, alloc, [1, 1])
    put(tree, alloc, [2, 2])
    waited = np.array([1, 1, 0], dtype=np.int32)
    for _ in range(10):  # a request that waits is matched at every schedule
        tree.match_prefix(waited)
    admitted = tree.match_prefix(np.array([2, 2, 0], dtype=np.int32))
    tree.lock(admitted.node)
    tree.record_hit(admitted.node)
    tree.unlock(admitted.node)
    assert [n.hit_count for n in tree.root.children.values()] == [0, 1]
    tree.evict(2)  # the prefix that was reused stays; the one that only waited goes
    assert tree.match_prefix(waited).length == 0
    assert tree.match_prefix(np.array([2, 2, 0], dtype=np.int32)).length == 2


def test_evict_prefix_frees_the_runs_that_start_with_it_and_keeps_shared_ancestors() -> None:
    tree, alloc = tree_with()
    put(tree, alloc, [1, 2, 3, 4, 5, 6])
    put(tree, alloc, [1, 2, 3, 4, 9])
    put(tree, alloc, [1, 2, 7, 7])
    free_before = alloc.num_free
    # [3, 4] is split after [3]: [3], [4] and the children [5, 6], [9] go
    assert tree.evict_prefix(np.array([1, 2, 3], dtype=np.int32)) == 5
    assert alloc.num_free == free_before + 5
    assert tree.match_prefix(np.array([1, 2, 7, 7], dtype=np.int32)).length == 4
    assert tree.match_prefix(np.array([1, 2, 3], dtype=np.int32)).length == 2
    tree.check_integrity()


def test_evict_prefix_spares_locked_runs_and_a_prefix_not_wholly_cached() -> None:
    tree, alloc = tree_with()
    put(tree, alloc, [1, 2, 3, 4])
    put(tree, alloc, [1, 2, 5, 6])
    assert tree.evict_prefix(np.array([1, 2, 3, 4, 8], dtype=np.int32)) == 0
    locked = tree.match_prefix(np.array([1, 2, 3, 4], dtype=np.int32)).node
    tree.lock(locked)
    assert tree.evict_prefix(np.array([1, 2], dtype=np.int32)) == 2  # only [5, 6]: [1, 2] holds the lock's path
    assert tree.cached_tokens == 4 and tree.protected_tokens == 4
    tree.unlock(locked)
    assert tree.evict_prefix(np.array([1], dtype=np.int32)) == 4
    assert tree.cached_tokens == 0
    tree.check_integrity()


def test_evict_prefix_cuts_the_prefix_to_whole_pages() -> None:
    tree, alloc = tree_with(page_size=2)
    put(tree, alloc, [1, 2, 3, 4, 5, 6])
    put(tree, alloc, [1, 2, 8, 8])
    assert tree.evict_prefix(np.array([1], dtype=np.int32)) == 0  # less than a page names nothing
    assert tree.evict_prefix(np.array([1, 2, 3, 4, 5], dtype=np.int32)) == 4  # [1, 2, 3, 4]: the run [3..6]
    assert tree.cached_tokens == 4
    tree.check_integrity()
